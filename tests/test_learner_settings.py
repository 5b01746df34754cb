"""A learner's settings come from the config in one place (``learners.settings.LearnerSettings.from_config``)."""

from __future__ import annotations

import pytest

from configs import load_config
from learners.settings import LearnerSettings


def test_the_three_places_where_a_learner_differs_from_the_config():
    config = load_config(None, ["rl.teacher_learning_rate=3e-4", "rl.learning_rate=5e-4", "inference.temperature=0",
                                "rl.loss_normaliser=constant", "rl.advantage_weighting=sequence", "inference.max_tokens=96"])
    teacher, student = (LearnerSettings.from_config(config, role) for role in ("teacher", "student"))
    assert teacher.learning_rate == 3e-4 and student.learning_rate == 5e-4  # the teachers' own rate
    assert teacher.update.temperature == 1.0  # greedy decoding trains T = 1
    assert teacher.update.constant_normaliser == 96 and teacher.update.advantage_weighting == "sequence"
    assert teacher.update.track_entropy and teacher.loss == student.loss
    assert teacher.update_for("cuda").activation_checkpointing and not teacher.update_for("cpu").activation_checkpointing
    tempered = LearnerSettings.from_config(load_config(None, ["inference.temperature=0.6"]), "student")
    assert tempered.update.temperature == 0.6 and tempered.update.constant_normaliser == 0
    assert tempered.lora_spec(3).num_slots == 3 and tempered.lora_spec(0).num_slots == 1
    assert LearnerSettings.from_config(config, "agent").learning_rate == 5e-4  # the single agent: rl.learning_rate
    with pytest.raises(ValueError, match="role"):
        LearnerSettings.from_config(config, "judge")
