"""A learner actor's settings, built from the run's config in one place (:meth:`LearnerSettings.from_config`).

What the config says and what a learner runs with differ in three places, each decided here and nowhere else:
the teachers' own learning rate (``rl.teacher_learning_rate``), the trained policy's temperature (the rollouts'
sampling temperature; greedy decoding, T = 0, trains T = 1), and Dr. GRPO's constant normaliser
(``rl.loss_normaliser: constant`` divides by ``inference.max_tokens`` per sequence). The activation checkpointing
setting ("auto", "on", "off") is resolved where the device is known (:meth:`LearnerSettings.update_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from configs.schema import Config
from learners.multi_lora import LoRASpec
from learners.pg_loss import PGConfig
from learners.policy_learner import UpdateConfig, resolve_activation_checkpointing


@dataclass(frozen=True)
class LearnerSettings:
    """Everything a learner of one role needs besides its model path, members, seed and base."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    rslora: bool
    init_std: float
    learning_rate: float
    weight_decay: float
    grad_clip: float
    loss: PGConfig
    update: UpdateConfig
    activation_checkpointing: str  # "auto" | "on" | "off" (rl.activation_checkpointing)
    advantage_baseline: str
    importance_correction: str
    dtype: str

    @classmethod
    def from_config(cls, config: Config, role: str) -> "LearnerSettings":
        """The settings of a ``role`` learner of ``config``: "teacher", "student", or "agent" (the single agent's one
        adapter, which proposes and solves at ``rl.learning_rate``)."""
        if role not in ("teacher", "student", "agent"):
            raise ValueError(f"a learner's role is 'teacher', 'student' or 'agent', got {role!r}")
        rl, lora = config.rl, config.lora
        lr = rl.teacher_learning_rate if role == "teacher" and rl.teacher_learning_rate is not None else rl.learning_rate
        return cls(
            rank=lora.rank, alpha=lora.alpha, target_modules=tuple(lora.target_modules), rslora=lora.rslora,
            init_std=lora.init_std, learning_rate=lr, weight_decay=rl.weight_decay, grad_clip=rl.grad_clip,
            loss=PGConfig(clip_epsilon=rl.clip_epsilon, kl_coef=rl.kl_coef, entropy_coef=rl.entropy_coef,
                          importance_correction=rl.importance_correction, is_truncation=rl.is_truncation),
            update=UpdateConfig(
                epochs=rl.epochs, micro_batch_tokens=rl.micro_batch_tokens, track_entropy=rl.log_entropy,
                # train the policy the rollouts are sampled from; greedy decoding (T = 0) trains T = 1
                temperature=config.inference.temperature if config.inference.temperature > 0 else 1.0,
                logit_chunk_tokens=rl.logit_chunk_tokens, advantage_norm=rl.advantage_norm,
                advantage_weighting=rl.advantage_weighting,
                constant_normaliser=config.inference.max_tokens if rl.loss_normaliser == "constant" else 0,
            ),
            activation_checkpointing=rl.activation_checkpointing, advantage_baseline=rl.advantage_baseline,
            importance_correction=rl.importance_correction, dtype=config.model.dtype,
        )

    def lora_spec(self, slots: int) -> LoRASpec:
        return LoRASpec(rank=self.rank, alpha=self.alpha, num_slots=max(1, slots), target_modules=self.target_modules,
                        rslora=self.rslora)

    def update_for(self, device: str) -> UpdateConfig:
        """:attr:`update` with the activation checkpointing resolved for ``device`` ("cuda" or "cpu")."""
        return replace(self.update, activation_checkpointing=resolve_activation_checkpointing(
            self.activation_checkpointing, device))
