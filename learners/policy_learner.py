"""One policy-gradient update of every adapter in a batch of samples, over one frozen base.

This is what a learner actor calls each step: samples of several adapters go through the same
forward/backward (micro-batched by a token budget, packed or padded), the loss of ``learners.pg_loss``
is summed per adapter, and each adapter present gets its own clipped AdamW step.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample, TokenBatch, micro_batches
from learners.multi_lora import NO_ADAPTER, MultiLoRAModel
from learners.peft_io import load_adapter, save_adapter
from learners.pg_loss import PGConfig, group_normalised_advantages, policy_gradient_loss, token_entropy, token_logprobs


@dataclass(frozen=True)
class UpdateConfig:
    """How one step's samples are turned into updates (``configs.schema.RLConfig`` maps onto it)."""

    epochs: int = 1
    micro_batch_tokens: int = 8192
    batching: Literal["pack", "pad"] = "pad"  # length-sorted padding measured faster than packing on CPU
    track_entropy: bool = False
    # The policy trained is softmax(z / T) at the rollouts' sampling temperature T, the distribution the
    # samples were drawn from (verl divides the logits the same way); T = 1 is the plain policy.
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")


@dataclass
class LossTokens:
    """Per loss token of one micro-batch: log-prob (with grad), entropy (if asked), sample id."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    sample: torch.Tensor


def forward_loss_tokens(
    model: MultiLoRAModel, batch: TokenBatch, adapter_off: bool = False, entropy: bool = False, temperature: float = 1.0
) -> LossTokens:
    """Run the model on a batch and return log pi_T(target) = log softmax(z / T)[target] at the loss positions only.

    The LM head runs only on loss positions (prompt positions never reach the vocabulary projection).
    ``adapter_off`` routes every token to ``NO_ADAPTER``: the frozen base, i.e. the KL reference.
    Supports causal LMs that expose ``base_model`` and ``get_output_embeddings()`` (Qwen2, Llama).
    """
    hf = model.model
    index = torch.full_like(batch.adapter_index, NO_ADAPTER) if adapter_off else batch.adapter_index
    model.set_adapter_index(index)
    hidden = hf.base_model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    logits = hf.get_output_embeddings()(hidden[batch.loss_mask])
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.targets[batch.loss_mask]
    ent = token_entropy(logits) if entropy else None
    return LossTokens(token_logprobs(logits, targets), ent, batch.token_sample[batch.loss_mask])


class PolicyLearner:
    """The adapters of one role, their optimizers, and the update step."""

    def __init__(
        self,
        model: MultiLoRAModel,
        optimizers: AdapterOptimizers,
        loss_config: PGConfig,
        update_config: UpdateConfig,
        pad_token_id: int,
    ) -> None:
        self.model = model
        self.optimizers = optimizers
        self.loss_config = loss_config
        self.update_config = update_config
        self.pad_token_id = pad_token_id

    @property
    def device(self) -> torch.device:
        return next(iter(self.model.lora_layers.values())).lora_A[0].device

    def step(self, samples: Sequence[Sample]) -> dict[int, dict[str, float]]:
        """One update from ``samples``; returns per-slot statistics.

        Stats per slot: ``loss``, ``pg_loss``, ``kl``, ``entropy``, ``clip_fraction``, ``ratio``,
        ``advantage`` (token means over the last epoch), ``grad_norm`` (pre-clip, last epoch),
        ``tokens``, ``samples``, ``reward_mean``.
        """
        if not samples:
            raise ValueError("PolicyLearner.step needs at least one sample")
        bad = sorted({s.slot for s in samples if s.slot >= self.model.num_slots})
        if bad:
            raise ValueError(f"sample slots {bad} are out of range: the model has {self.model.num_slots} adapter slots")
        cfg, loss_cfg = self.update_config, self.loss_config
        device = self.device
        slots = torch.tensor([s.slot for s in samples], device=device)
        advantages = group_normalised_advantages(
            [s.reward for s in samples], [(s.slot, s.group) for s in samples], [len(s.completion_ids) for s in samples]
        ).to(device)
        totals: dict[int, float] = defaultdict(float)
        for s in samples:
            totals[s.slot] += len(s.completion_ids)
        batches = [b.to(device) for b in micro_batches(samples, self.pad_token_id, cfg.micro_batch_tokens, cfg.batching)]

        old: list[torch.Tensor | None] = [None] * len(batches)
        ref: list[torch.Tensor | None] = [None] * len(batches)
        need_ref = loss_cfg.kl_coef > 0
        if cfg.epochs > 1 or need_ref:
            with torch.no_grad():
                for i, batch in enumerate(batches):
                    if cfg.epochs > 1:
                        old[i] = forward_loss_tokens(self.model, batch, temperature=cfg.temperature).logprobs
                    if need_ref:
                        ref[i] = forward_loss_tokens(self.model, batch, adapter_off=True, temperature=cfg.temperature).logprobs

        want_entropy = loss_cfg.entropy_coef > 0 or cfg.track_entropy
        stats: dict[int, dict[str, float]] = {}
        self.model.train()
        for _ in range(cfg.epochs):
            sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for i, batch in enumerate(batches):
                tokens = forward_loss_tokens(self.model, batch, entropy=want_entropy, temperature=cfg.temperature)
                entropy = tokens.entropy
                if entropy is not None and loss_cfg.entropy_coef == 0:
                    entropy = entropy.detach()
                out = policy_gradient_loss(
                    tokens.logprobs,
                    advantages[tokens.sample],
                    slots[tokens.sample],
                    loss_cfg,
                    old_logprobs=old[i],
                    ref_logprobs=ref[i],
                    entropy=entropy,
                    slot_token_totals=totals,
                )
                out.loss.backward()
                for slot, st in out.stats.items():
                    n = st["tokens"]
                    sums[slot]["tokens"] += n
                    sums[slot]["loss"] += st["loss"]
                    for key in ("pg_loss", "kl", "entropy", "clip_fraction", "ratio", "advantage"):
                        sums[slot][key] += st[key] * n
            norms = self.optimizers.step(sums.keys())
            stats = {
                slot: {
                    "loss": s["loss"],
                    **{k: s[k] / s["tokens"] for k in ("pg_loss", "kl", "entropy", "clip_fraction", "ratio", "advantage")},
                    "grad_norm": norms.get(slot, 0.0),
                    "tokens": s["tokens"],
                }
                for slot, s in sums.items()
            }
        self.model.set_adapter_index(None)
        for slot in stats:
            rewards = [s.reward for s in samples if s.slot == slot]
            stats[slot]["samples"] = float(len(rewards))
            stats[slot]["reward_mean"] = sum(rewards) / len(rewards)
        return stats

    def replace_adapter(self, slot: int, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Evolution: overwrite one slot's weights in place and reset its optimizer state."""
        self.model.set_slot_factors(slot, factors)
        self.optimizers.reset(slot)

    def load_adapter(self, slot: int, path: str | os.PathLike) -> None:
        """Import a PEFT directory into ``slot`` and reset its optimizer state."""
        load_adapter(self.model, slot, path)
        self.optimizers.reset(slot)

    def save_adapter(self, slot: int, path: str | os.PathLike) -> None:
        """Export ``slot`` as a PEFT directory (what the inference engine loads)."""
        save_adapter(self.model, slot, path)
