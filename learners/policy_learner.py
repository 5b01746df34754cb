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
from torch import nn
from torch.utils.checkpoint import checkpoint

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
    # Checkpoint every decoder layer in the policy pass (keep layer inputs, recompute in backward).
    activation_checkpointing: bool = False
    # Loss tokens per chunk of the LM head + log-softmax (and entropy); 0 = all loss tokens at once.
    logit_chunk_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.logit_chunk_tokens < 0:
            raise ValueError(f"logit_chunk_tokens must be >= 0 (0 = unchunked), got {self.logit_chunk_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")


def resolve_activation_checkpointing(setting: Literal["auto", "on", "off"], device: torch.device | str) -> bool:
    """``rl.activation_checkpointing`` -> the learner's boolean: "on"/"off" as said; "auto" = on for a CUDA device.

    Stand-in rule for "auto" until the memory plan decides it from the predicted peak (on CPU the learner's
    activations live in host memory and the tiny default is faster without recomputation).
    """
    if setting == "on":
        return True
    if setting == "off":
        return False
    if setting == "auto":
        return torch.device(device).type == "cuda"
    raise ValueError(f"activation_checkpointing must be 'auto', 'on' or 'off', got {setting!r}")


@dataclass
class LossTokens:
    """Per loss token of one micro-batch: log-prob (with grad), entropy (if asked), sample id."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    sample: torch.Tensor


def _head_logprobs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, ...]:
    """z = head(h) / T in float32, then log softmax(z)[target] and (if asked) H(softmax(z)), per row of ``hidden``."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    if entropy:
        return token_logprobs(logits, targets), token_entropy(logits)
    return (token_logprobs(logits, targets),)


def head_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row n of ``hidden`` [N, H]: log pi_T(y_n) = z_n[y_n] - logsumexp(z_n), z_n = head(h_n) / T, in float32,
    and the entropy H_n = logsumexp(z_n) - sum_v softmax(z_n)_v z_{n,v} when ``entropy``.

    The rows go through the head in chunks of ``chunk_tokens`` (0 = all at once), so at most one chunk of
    logits [chunk, V] exists at a time: without grad each chunk's logits are freed before the next; with
    grad each chunk runs under non-reentrant ``torch.utils.checkpoint`` (only its hidden rows are kept and
    backward recomputes that chunk's logits). A single chunk is the plain computation. Per row the
    arithmetic is the same, so chunked results equal plain ones up to the matmul's blocking (float32:
    measured <= 1e-6 relative).
    """
    n = hidden.shape[0]
    if chunk_tokens <= 0 or n <= chunk_tokens:
        outs = [_head_logprobs(head, hidden, targets, temperature, entropy)]
    else:
        recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
        outs = [
            checkpoint(_head_logprobs, head, h, t, temperature, entropy, use_reentrant=False)
            if recompute else _head_logprobs(head, h, t, temperature, entropy)
            for h, t in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens))
        ]
    logprobs = outs[0][0] if len(outs) == 1 else torch.cat([o[0] for o in outs])
    if not entropy:
        return logprobs, None
    return logprobs, outs[0][1] if len(outs) == 1 else torch.cat([o[1] for o in outs])


def forward_loss_tokens(
    model: MultiLoRAModel,
    batch: TokenBatch,
    adapter_off: bool = False,
    entropy: bool = False,
    temperature: float = 1.0,
    logit_chunk_tokens: int = 0,
) -> LossTokens:
    """Run the model on a batch and return log pi_T(target) = log softmax(z / T)[target] at the loss positions only.

    The LM head runs only on loss positions (prompt positions never reach the vocabulary projection), in
    chunks of ``logit_chunk_tokens`` loss tokens (:func:`head_logprobs`; 0 = all at once).
    ``adapter_off`` routes every token to ``NO_ADAPTER``: the frozen base, i.e. the KL reference.
    Decoder layers are checkpointed when ``model.set_activation_checkpointing(True)`` was called and grad is on.
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
    logprobs, ent = head_logprobs(
        hf.get_output_embeddings(), hidden[batch.loss_mask], batch.targets[batch.loss_mask], temperature, entropy, logit_chunk_tokens
    )
    return LossTokens(logprobs, ent, batch.token_sample[batch.loss_mask])


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
        model.set_activation_checkpointing(update_config.activation_checkpointing)

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
        chunk = cfg.logit_chunk_tokens
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
                        old[i] = forward_loss_tokens(self.model, batch, temperature=cfg.temperature, logit_chunk_tokens=chunk).logprobs
                    if need_ref:
                        ref[i] = forward_loss_tokens(
                            self.model, batch, adapter_off=True, temperature=cfg.temperature, logit_chunk_tokens=chunk
                        ).logprobs

        want_entropy = loss_cfg.entropy_coef > 0 or cfg.track_entropy
        stats: dict[int, dict[str, float]] = {}
        self.model.train()
        for _ in range(cfg.epochs):
            sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for i, batch in enumerate(batches):
                tokens = forward_loss_tokens(
                    self.model, batch, entropy=want_entropy, temperature=cfg.temperature, logit_chunk_tokens=chunk
                )
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
