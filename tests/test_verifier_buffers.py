"""Task buffers, rewards and program metrics of the verifier package."""

from __future__ import annotations

import json
import random

import pytest

from verifier.buffers import TaskBuffer, load_seed_file, make_buffers, sample_program, seed_tasks
from verifier.metrics import Coverage, program_metrics, structure_fingerprint, structure_hash
from rollouts.rewards import learnability_reward, solve_rate, student_reward, teacher_reward
from verifier.tasks import IDENTITY_PROGRAM, Task, identity_task


def task(i: int, family: str = "code_o") -> Task:
    return Task(family, f"def f(a):\n    return a + {i}", ["1"], [str(1 + i)])


def test_buffer_is_fifo_and_samples_without_replacement():
    buf = TaskBuffer(3, [identity_task("code_o")])
    for i in range(4):
        buf.add(task(i))
    assert len(buf) == 3 and [t.output for t in buf] == ["2", "3", "4"] and buf.added == 5
    refs = buf.sample(2, random.Random(0))
    assert len(refs) == 2 and len({t.output for t in refs}) == 2
    assert len(buf.sample(10, random.Random(0))) == 3
    assert buf.sample(3, random.Random(7)) == buf.sample(3, random.Random(7))
    assert [t.output for t in buf.recent(2)] == ["3", "4"]
    with pytest.raises(ValueError, match="capacity"):
        TaskBuffer(0)
    with pytest.raises(TypeError, match="Task"):
        buf.add({"family": "code_o"})


def test_buffer_state_round_trips_through_json():
    buf = TaskBuffer(4, [identity_task("code_f")])
    buf.add(Task("code_f", IDENTITY_PROGRAM, ["1", "2"], ["1", "2"], "identity"))
    state = json.loads(json.dumps(buf.state_dict()))
    other = TaskBuffer(1)
    other.load_state_dict(state)
    assert list(other) == list(buf) and other.capacity == 4 and other.added == buf.added
    with pytest.raises(ValueError, match="capacity"):
        other.load_state_dict({"tasks": []})


def test_seeding_from_identity_and_from_a_file(tmp_path):
    assert seed_tasks("code_i") == [identity_task("code_i")]
    path = tmp_path / "seeds.jsonl"
    records = [task(1, "code_o"), task(2, "code_i"), Task("code_f", IDENTITY_PROGRAM, ["1", "2"], ["1", "2"], "m")]
    path.write_text("\n".join(json.dumps(t.to_dict()) for t in records) + "\n\n")
    assert load_seed_file(path) == records
    buffers = make_buffers(8, seed_file=path)
    assert [t.output for t in buffers["code_o"]] == ["2", "3"] and {t.family for t in buffers["code_o"]} == {"code_o"}
    assert [t.output for t in buffers["code_i"]] == ["2", "3"] and {t.family for t in buffers["code_i"]} == {"code_i"}
    assert list(buffers["code_f"]) == [records[2]]
    assert sample_program([buffers["code_o"], buffers["code_i"]], random.Random(0)) in {records[0].program, records[1].program}
    path.write_text(json.dumps(task(1).to_dict()) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"seeds.jsonl:2"):
        load_seed_file(path)


def test_rewards():
    assert teacher_reward(False, None) == -1.0 and teacher_reward(False, 0.5, invalid=-2) == -2
    assert teacher_reward(True, 0.0) == 0.0 and teacher_reward(True, 0.25) == 0.75 and teacher_reward(True, 1.0) == 0.0
    assert teacher_reward(True, 0.0, unsolved=-0.25) == -0.25 and teacher_reward(True, 0.5, unsolved=-0.25) == 0.5
    assert student_reward(True, True) == 1.0 and student_reward(False, True) == -0.5 and student_reward(True, False) == -1.0
    assert student_reward(False, True, wrong=-0.25) == -0.25 and student_reward(False, False, malformed=-2) == -2
    assert learnability_reward(0.0) == 0.0 and learnability_reward(1.0) == 0.0 and learnability_reward(0.25) == 0.75
    assert solve_rate([True, False, False, True]) == 0.5
    for bad in (-0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="rho"):
            learnability_reward(bad)
    with pytest.raises(ValueError, match="rho"):
        teacher_reward(True, None)
    with pytest.raises(ValueError, match="rollout"):
        solve_rate([])


BRANCHY = """def f(xs):
    total = 0
    for x in xs:
        if x > 0 and x < 10:
            total += x
        elif x == 0:
            total -= 1
    try:
        y = 1 / total
    except ZeroDivisionError:
        y = 0
    # a comment line
    return [v for v in xs if v]
"""


def test_program_metrics():
    # radon scores this function 8: 1 + for + if + and + elif + except + comprehension + its if
    assert program_metrics(BRANCHY) == {"ast_depth": 7, "cyclomatic": 8, "loc": 12, "variables": 5, "nodes": 53}
    assert program_metrics(IDENTITY_PROGRAM) == {"ast_depth": 4, "cyclomatic": 1, "loc": 2, "variables": 1, "nodes": 6}
    match = "def f(c):\n    match c:\n        case 1:\n            return 'a'\n        case 2:\n            return 'b'\n        case _:\n            return 'c'"
    assert program_metrics(match)["cyclomatic"] == 3
    with pytest.raises(ValueError, match="does not parse"):
        program_metrics("def f(:")


def test_structure_fingerprint_and_hash_ignore_names_and_constants():
    renamed = BRANCHY.replace("total", "acc").replace("xs", "items").replace("10", "99")
    assert structure_fingerprint(renamed) == structure_fingerprint(BRANCHY)
    assert structure_hash(renamed) == structure_hash(BRANCHY)
    changed = BRANCHY.replace("x > 0 and x < 10", "x > 0")
    assert structure_hash(changed) != structure_hash(BRANCHY)
    assert structure_fingerprint(changed) != structure_fingerprint(BRANCHY)
    assert ("Module", "FunctionDef", "arguments") in structure_fingerprint(IDENTITY_PROGRAM)
    assert all(len(g) == 2 for g in structure_fingerprint(IDENTITY_PROGRAM, n=2))


def test_coverage_grows_with_new_structures_only():
    cov = Coverage()
    first = cov.update([IDENTITY_PROGRAM, "def f(b):\n    return b", "def f(:"])
    assert first["new_structures"] == 1 and cov.summary()["programs"] == 2
    assert cov.update([IDENTITY_PROGRAM.replace("a", "z")]) == {"new_ngrams": 0, "new_structures": 0}
    grown = cov.update([BRANCHY])
    assert grown["new_ngrams"] > 0 and grown["new_structures"] == 1
    clone = Coverage()
    clone.load_state_dict(json.loads(json.dumps(cov.state_dict())))
    assert clone.summary() == cov.summary() == {"programs": 4, "distinct_ngrams": len(cov.ngrams), "distinct_structures": 2}
