"""One policy-gradient update of every adapter in a batch of samples, over one frozen base.

This is what a learner actor calls each step: samples of several adapters go through the same
forward/backward (micro-batched by a token budget, packed or padded), the loss of ``learners.pg_loss``
is summed per adapter, and each adapter present gets its own clipped AdamW step. A step can also be
split across learners holding replicas of the same adapters (``learners.data_parallel``): each trains a
share (:meth:`PolicyLearner.share`), the shares' gradients are summed, every replica applies the sum
(:meth:`PolicyLearner.apply_gradients`).
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
from learners.data_parallel import (
    AppliedGradients, SlotGradients, StepTargets, check_replicas, export_slot_gradients, import_slot_gradients,
    split_samples, step_targets, sum_gradients,
)
from learners.multi_lora import NO_ADAPTER, MultiLoRAModel
from learners.peft_io import load_adapter, save_adapter
from learners.pg_loss import PGConfig, policy_gradient_loss, token_entropy, token_kl, token_logprobs


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
    # Advantages per group: "whiten" (r - mean) / std (AZR), "center" r - mean; each sequence weighted by its
    # tokens ("token", veRL's masked whitening) or once ("sequence", GRPO); learners.pg_loss names the papers.
    advantage_norm: Literal["whiten", "center"] = "whiten"
    advantage_weighting: Literal["token", "sequence"] = "token"
    # N_a of the loss: 0 = adapter a's completion tokens; L > 0 = its sequences times L (Dr. GRPO's constant).
    constant_normaliser: int = 0

    def __post_init__(self) -> None:
        if self.logit_chunk_tokens < 0:
            raise ValueError(f"logit_chunk_tokens must be >= 0 (0 = unchunked), got {self.logit_chunk_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")
        if self.advantage_norm not in ("whiten", "center"):
            raise ValueError(f"advantage_norm must be 'whiten' or 'center', got {self.advantage_norm!r}")
        if self.advantage_weighting not in ("token", "sequence"):
            raise ValueError(f"advantage_weighting must be 'token' or 'sequence', got {self.advantage_weighting!r}")
        if self.constant_normaliser < 0:
            raise ValueError(f"constant_normaliser must be >= 0 (0: the token count), got {self.constant_normaliser}")

    @property
    def whiten(self) -> bool:
        return self.advantage_norm == "whiten"

    def targets(self, samples: Sequence[Sample]) -> "StepTargets":
        """The step's advantages and N_a under these settings (``learners.data_parallel.step_targets``)."""
        return step_targets(samples, whiten=self.whiten, weighting=self.advantage_weighting,
                            constant_normaliser=self.constant_normaliser)


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
    """Per loss token of one micro-batch: log-prob (with grad), entropy (if asked), sample id, and the behaviour
    log-prob log mu of the token when the batch carries them."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    sample: torch.Tensor
    behaviour: torch.Tensor | None = None


def _head_logprobs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool, entropy_grad: bool = True
) -> tuple[torch.Tensor, ...]:
    """z = head(h) / T in float32, then log softmax(z)[target] and (if asked) H(softmax(z)), per row of ``hidden``;
    without ``entropy_grad`` the entropy is computed off the graph (logged, not trained: it keeps no softmax for backward)."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    if entropy:
        return token_logprobs(logits, targets), token_entropy(logits if entropy_grad else logits.detach())
    return (token_logprobs(logits, targets),)


def head_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    chunk_tokens: int = 0,
    entropy_grad: bool = True,
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
        outs = [_head_logprobs(head, hidden, targets, temperature, entropy, entropy_grad)]
    else:
        recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
        outs = [
            checkpoint(_head_logprobs, head, h, t, temperature, entropy, entropy_grad, use_reentrant=False)
            if recompute else _head_logprobs(head, h, t, temperature, entropy, entropy_grad)
            for h, t in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens))
        ]
    logprobs = outs[0][0] if len(outs) == 1 else torch.cat([o[0] for o in outs])
    if not entropy:
        return logprobs, None
    return logprobs, outs[0][1] if len(outs) == 1 else torch.cat([o[1] for o in outs])


def head_kl(head: nn.Module, hidden_p: torch.Tensor, hidden_q: torch.Tensor, temperature: float = 1.0,
            chunk_tokens: int = 0) -> torch.Tensor:
    """Per row n: KL(P_n || Q_n) = sum_v p_v (log p_v - log q_v) with P_n = softmax(head(hidden_p[n]) / T) and Q_n the
    same of ``hidden_q`` (``learners.pg_loss.token_kl``, the whole vocabulary), in float32.

    Rows go through the head in chunks of a quarter of ``chunk_tokens`` (0 = all at once): a chunk holds four
    vocabulary-wide float32 buffers (both logits, both log-softmaxes), so at most one ``chunk_tokens`` x V buffer's worth
    is alive, as in the training pass (:func:`head_logprobs`). Call it without grad."""
    rows = hidden_p.shape[0]
    step = rows if chunk_tokens <= 0 else max(1, chunk_tokens // 4)
    parts = []
    for start in range(0, rows, step):
        z_p, z_q = head(hidden_p[start:start + step]).float(), head(hidden_q[start:start + step]).float()
        if temperature != 1.0:
            z_p, z_q = z_p / temperature, z_q / temperature
        parts.append(token_kl(z_p, z_q))
    return torch.cat(parts) if parts else hidden_p.new_zeros(0, dtype=torch.float32)


def loss_hidden(model: MultiLoRAModel, batch: TokenBatch, adapter_off: bool = False) -> torch.Tensor:
    """The last hidden states at the batch's loss positions [N, H] (the rows the LM head turns into the completion
    tokens' distributions), each row through its sample's adapter, or with ``adapter_off`` through none (the frozen
    base: the KL reference, the same forward pass with the adapter switched off)."""
    index = torch.full_like(batch.adapter_index, NO_ADAPTER) if adapter_off else batch.adapter_index
    model.set_adapter_index(index)
    hidden = model.model.base_model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    return hidden[batch.loss_mask]


def forward_loss_tokens(
    model: MultiLoRAModel,
    batch: TokenBatch,
    adapter_off: bool = False,
    entropy: bool = False,
    temperature: float = 1.0,
    logit_chunk_tokens: int = 0,
    entropy_grad: bool = True,
) -> LossTokens:
    """Run the model on a batch and return log pi_T(target) = log softmax(z / T)[target] at the loss positions only.

    The LM head runs only on loss positions (prompt positions never reach the vocabulary projection), in
    chunks of ``logit_chunk_tokens`` loss tokens (:func:`head_logprobs`; 0 = all at once).
    ``adapter_off`` routes every token to ``NO_ADAPTER``: the frozen base, i.e. the KL reference.
    Decoder layers are checkpointed when ``model.set_activation_checkpointing(True)`` was called and grad is on.
    Supports causal LMs that expose ``base_model`` and ``get_output_embeddings()`` (Qwen2, Llama).
    """
    hidden = loss_hidden(model, batch, adapter_off)
    logprobs, ent = head_logprobs(
        model.model.get_output_embeddings(), hidden, batch.targets[batch.loss_mask], temperature, entropy,
        logit_chunk_tokens, entropy_grad,
    )
    behaviour = batch.behaviour[batch.loss_mask] if batch.behaviour is not None else None
    return LossTokens(logprobs, ent, batch.token_sample[batch.loss_mask], behaviour)


def kl_to_base_sums(model: MultiLoRAModel, samples: Sequence[Sample], pad_token_id: int, config: UpdateConfig
                    ) -> dict[int, dict[str, float]]:
    """The KL readout of the samples marked ``kl_readout``: per slot, ``kl_to_base`` = sum_t KL(pi_a(. | x, y<t) ||
    pi_base(. | x, y<t)) over their completion tokens t and ``kl_to_base_tokens``, the number of those tokens.

    pi_a is the adapter's policy at the rollouts' temperature (``config.temperature``, the distribution the samples
    were drawn from), pi_base the same forward pass with the adapter switched off, and KL_t the exact sum over the
    vocabulary (:func:`head_kl`, in chunks of ``config.logit_chunk_tokens``). By the chain rule, sum_t KL_t averaged
    over sequences y ~ pi_a is KL(pi_a || pi_base) of whole completions; the mean per token is
    ``kl_to_base / kl_to_base_tokens``. No grad; the adapters' index is cleared afterwards."""
    marked = [s for s in samples if s.kl_readout]
    out: dict[int, dict[str, float]] = {}
    if not marked:
        return out
    head, device = model.model.get_output_embeddings(), next(iter(model.lora_layers.values())).lora_A[0].device
    sample_slots = torch.tensor([s.slot for s in marked], device=device)
    with torch.no_grad():
        for batch in micro_batches(marked, pad_token_id, config.micro_batch_tokens, config.batching):
            batch = batch.to(device)
            on, off = loss_hidden(model, batch), loss_hidden(model, batch, adapter_off=True)
            kl = head_kl(head, on, off, config.temperature, config.logit_chunk_tokens)
            slots = sample_slots[batch.token_sample[batch.loss_mask]]  # each loss token's adapter slot
            for slot in slots.unique().tolist():
                mine = slots == slot
                entry = out.setdefault(slot, {"kl_to_base": 0.0, "kl_to_base_tokens": 0.0})
                entry["kl_to_base"] += float(kl[mine].double().sum())
                entry["kl_to_base_tokens"] += float(mine.sum())
    model.set_adapter_index(None)
    return out


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
        ``tokens``, ``samples``, ``reward_mean``; with ``importance_correction`` "tis" also ``is_weight``,
        ``is_truncated`` and ``behaviour_kl`` (token means; ``learners.pg_loss``).

        The same as one share holding every sample (:meth:`share`), each epoch's gradient applied in place.
        """
        if not samples:
            raise ValueError("PolicyLearner.step needs at least one sample")
        targets = self.update_config.targets(samples)
        share = self.share(samples, targets.advantages, targets.slot_token_totals)
        stats: dict[int, dict[str, float]] = {}
        for _ in range(self.update_config.epochs):
            sums = share.backward_epoch()
            stats = epoch_stats(sums, self.optimizers.step(sums.keys()), self.optimizers.last_update_norms)
        return stats

    def share(self, samples: Sequence[Sample], advantages: torch.Tensor, slot_token_totals: dict[int, float]) -> "ShareStep":
        """This learner's share of a step split across learners (``learners.data_parallel``): ``advantages[i]``
        of ``samples[i]`` and the per-slot token totals N_a come from the WHOLE step (``step_targets``).

        Runs the no-grad old-policy (epochs > 1) and KL-reference passes now; then, per epoch,
        ``ShareStep.gradients()`` gives this share's gradients, the caller sums every share's
        (``sum_gradients``) and every replica calls :meth:`apply_gradients` with that sum.
        """
        return ShareStep(self, samples, advantages, slot_token_totals)

    def share_of(self, samples: Sequence[Sample], index: int, shares: int) -> "ShareStep":
        """Share ``index`` of ``shares`` of the step over ALL of ``samples``: the samples :func:`split_samples`
        gives that share, with the whole step's targets (:func:`step_targets`). Replicas called with the same
        samples and indices 0..shares-1 take the disjoint shares of one split. No sample: an empty share (its
        replica still applies every epoch's sum, of nothing)."""
        if not 0 <= index < shares:
            raise ValueError(f"share {index} of {shares}: the index must be in 0..{shares - 1}")
        if not samples:
            return self.share([], torch.zeros(0), {})
        targets = self.update_config.targets(samples)
        idx = split_samples(samples, shares)[index]
        return self.share([samples[i] for i in idx], targets.advantages[idx], targets.slot_token_totals)

    def apply_gradients(self, summed: SlotGradients) -> dict[int, dict[str, float]]:
        """Step each slot of ``summed`` with its gradient sum g_a: clip to ``grad_clip`` by ||g_a|| and AdamW
        with this replica's state (every replica applying the same sum stays identical). Returns the epoch's
        statistics over all shares (as :meth:`step`'s, ``grad_norm`` = ||g_a|| before clipping)."""
        for p in (p for slot in summed.grads for p in self.model.slot_parameters(slot)):
            if p.grad is not None:
                raise RuntimeError("apply_gradients found a gradient already set: a share's gradients were not exported")
        import_slot_gradients(self.model, summed.grads)
        return epoch_stats(summed.sums, self.optimizers.step(summed.grads.keys()), self.optimizers.last_update_norms)

    def replace_adapter(self, slot: int, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Evolution: overwrite one slot's weights in place and reset its optimizer state."""
        self.model.set_slot_factors(slot, factors)
        self.optimizers.reset(slot)

    def load_adapter(self, slot: int, path: str | os.PathLike) -> None:
        """Import a PEFT directory into ``slot`` and reset its optimizer state."""
        load_adapter(self.model, slot, path)
        self.optimizers.reset(slot)

    def save_adapter(self, slot: int, path: str | os.PathLike, base_model_name_or_path: str = "") -> None:
        """Export ``slot`` as a PEFT directory (what the inference engine loads), naming
        ``base_model_name_or_path`` as its base (default: the model's own ``_name_or_path``)."""
        save_adapter(self.model, slot, path, base_model_name_or_path)


_TOKEN_MEANS = ("pg_loss", "kl", "entropy", "clip_fraction", "ratio", "advantage")
# With rl.importance_correction "tis" only (learners.pg_loss): mean weight, truncated fraction, KL(mu || pi_old).
_IS_MEANS = ("is_weight", "is_truncated", "behaviour_kl")


def epoch_stats(sums: dict[int, dict[str, float]], norms: dict[int, float],
                update_norms: dict[int, float] | None = None) -> dict[int, dict[str, float]]:
    """Per-slot statistics from an epoch's additive sums: ``loss`` (sum of l_t / N_a), the token means
    sum(x_t) / tokens of ``_TOKEN_MEANS``, ``grad_norm`` (pre-clip, 0 when the slot was not stepped),
    ``update_norm`` (||theta_after - theta_before|| of the epoch's optimizer step, ``AdapterOptimizers.step``),
    ``tokens``, ``samples`` and ``reward_mean`` = sum(r_i) / samples; where the step took the KL readout
    (:func:`kl_to_base_sums`), ``kl_to_base`` = sum_t KL_t / ``kl_to_base_tokens``."""
    update_norms = update_norms or {}
    return {
        slot: {
            "loss": s["loss"],
            **{k: s[k] / s["tokens"] for k in _TOKEN_MEANS},
            **{k: s[k] / s["tokens"] for k in _IS_MEANS if k in s},
            **({"kl_to_base": s["kl_to_base"] / s["kl_to_base_tokens"], "kl_to_base_tokens": s["kl_to_base_tokens"]}
               if s.get("kl_to_base_tokens") else {}),
            "grad_norm": norms.get(slot, 0.0),
            "update_norm": update_norms.get(slot, 0.0),
            "tokens": s["tokens"],
            "samples": s["samples"],
            "reward_mean": s["reward"] / s["samples"],
        }
        for slot, s in sums.items()
    }


class ShareStep:
    """One learner's share of a step: its samples in micro-batches, their global advantages and the global
    N_a, the old-policy (epochs > 1) and reference log-probs; one epoch of forward/backward per call.

    Built by :meth:`PolicyLearner.share`; :meth:`PolicyLearner.step` is one share holding every sample.
    """

    def __init__(
        self, learner: PolicyLearner, samples: Sequence[Sample], advantages: torch.Tensor, slot_token_totals: dict[int, float]
    ) -> None:
        model = learner.model
        bad = sorted({s.slot for s in samples if s.slot >= model.num_slots})
        if bad:
            raise ValueError(f"sample slots {bad} are out of range: the model has {model.num_slots} adapter slots")
        if advantages.shape != (len(samples),):
            raise ValueError(f"{len(samples)} samples but advantages of shape {tuple(advantages.shape)}")
        missing = sorted({s.slot for s in samples} - set(slot_token_totals))
        if missing:
            raise ValueError(f"slot_token_totals lacks slots {missing} (pass the whole step's totals)")
        self.learner = learner
        self.samples = list(samples)
        self.totals = slot_token_totals
        self.epochs_left = learner.update_config.epochs
        cfg, chunk = learner.update_config, learner.update_config.logit_chunk_tokens
        device = learner.device
        self.slots = torch.tensor([s.slot for s in samples], device=device, dtype=torch.long)
        self.advantages = advantages.to(device)
        self.batches = (
            [b.to(device) for b in micro_batches(samples, learner.pad_token_id, cfg.micro_batch_tokens, cfg.batching)]
            if samples else []
        )
        self.old: list[torch.Tensor | None] = [None] * len(self.batches)
        self.ref: list[torch.Tensor | None] = [None] * len(self.batches)
        # before any update: the policy that drew the samples, against the base
        self.kl_readout = kl_to_base_sums(model, self.samples, learner.pad_token_id, cfg)
        need_ref = learner.loss_config.kl_coef > 0
        if cfg.epochs > 1 or need_ref:
            with torch.no_grad():
                for i, batch in enumerate(self.batches):
                    if cfg.epochs > 1:
                        self.old[i] = forward_loss_tokens(model, batch, temperature=cfg.temperature, logit_chunk_tokens=chunk).logprobs
                    if need_ref:
                        self.ref[i] = forward_loss_tokens(
                            model, batch, adapter_off=True, temperature=cfg.temperature, logit_chunk_tokens=chunk
                        ).logprobs
            model.set_adapter_index(None)

    def backward_epoch(self) -> dict[int, dict[str, float]]:
        """Forward, loss (per adapter: sum_t l_t / N_a with the global N_a) and backward of every micro-batch;
        the gradients accumulate in the slots' ``.grad``. Returns per slot the additive sums: ``tokens``,
        ``loss``, token-weighted sums of ``_TOKEN_MEANS``, ``samples``, ``reward`` (sum of rewards)."""
        if self.epochs_left < 1:
            raise RuntimeError(f"this share already ran its {self.learner.update_config.epochs} epoch(s)")
        self.epochs_left -= 1
        learner = self.learner
        cfg, loss_cfg = learner.update_config, learner.loss_config
        want_entropy = loss_cfg.entropy_coef > 0 or cfg.track_entropy
        sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        learner.model.train()
        for i, batch in enumerate(self.batches):
            tokens = forward_loss_tokens(
                learner.model, batch, entropy=want_entropy, temperature=cfg.temperature,
                logit_chunk_tokens=cfg.logit_chunk_tokens, entropy_grad=loss_cfg.entropy_coef > 0,
            )
            entropy = tokens.entropy
            out = policy_gradient_loss(
                tokens.logprobs,
                self.advantages[tokens.sample],
                self.slots[tokens.sample],
                loss_cfg,
                old_logprobs=self.old[i],
                ref_logprobs=self.ref[i],
                entropy=entropy,
                slot_token_totals=self.totals,
                behaviour_logprobs=tokens.behaviour,
            )
            out.loss.backward()
            for slot, st in out.stats.items():
                n = st["tokens"]
                sums[slot]["tokens"] += n
                sums[slot]["loss"] += st["loss"]
                for key in _TOKEN_MEANS + _IS_MEANS:
                    if key in st:
                        sums[slot][key] += st[key] * n
        learner.model.set_adapter_index(None)
        for s in self.samples:
            sums[s.slot]["samples"] += 1.0
            sums[s.slot]["reward"] += s.reward
        for slot, readout in self.kl_readout.items():  # additive, so shares of a data-parallel step sum them
            for key, value in readout.items():
                sums[slot][key] += value
        return {slot: dict(s) for slot, s in sums.items()}

    def gradients(self, device: torch.device | str = "cpu") -> SlotGradients:
        """One epoch (:meth:`backward_epoch`) and its per-slot gradients exported as flat float32 vectors on
        ``device`` (the model's gradients cleared), to be summed over shares and applied by every replica."""
        sums = self.backward_epoch()
        return SlotGradients(export_slot_gradients(self.learner.model, list(sums), device), sums)


def data_parallel_step(
    replicas: Sequence[PolicyLearner], samples: Sequence[Sample], assignment: Sequence[Sequence[int]] | None = None
) -> dict[int, dict[str, float]]:
    """One step of ``samples`` split over ``replicas`` (learners holding identical adapters and optimizer states),
    in one process: share k trains ``samples[i] for i in assignment[k]`` (default ``split_samples``: ``split_by_tokens``
    over ``len(sample)`` = prompt + completion tokens, keyed by slot) with the whole step's advantages and N_a (``step_targets``);
    per epoch the shares' gradients are summed in share order (``sum_gradients``) and every replica applies
    the sum, then the replicas' fingerprints (``AdapterOptimizers.fingerprint``) and, after the last epoch,
    statistics are compared (``check_replicas``: ``RuntimeError`` naming the slot when one replica diverged).
    The result equals ``replicas[0].step(samples)`` up to float summation order. Returns the statistics (the
    same on every replica). A Ray shell runs the same sequence with one share per actor.
    """
    if not samples:
        raise ValueError("data_parallel_step needs at least one sample")
    if assignment is None:
        assignment = split_samples(samples, len(replicas))
    if len(assignment) != len(replicas):
        raise ValueError(f"{len(assignment)} shares for {len(replicas)} replicas")
    if sorted(i for idx in assignment for i in idx) != list(range(len(samples))):
        raise ValueError("the assignment must place every sample in exactly one share")
    if len({r.update_config.epochs for r in replicas}) != 1:
        raise ValueError("replicas of one step must run the same number of epochs")
    targets = replicas[0].update_config.targets(samples)
    shares = [
        replica.share([samples[i] for i in idx], targets.advantages[list(idx)], targets.slot_token_totals)
        for replica, idx in zip(replicas, assignment)
    ]
    epochs = replicas[0].update_config.epochs
    reports: list[AppliedGradients] = []
    for epoch in range(1, epochs + 1):
        summed = sum_gradients([share.gradients() for share in shares])
        stepped = set(summed.grads) | set(summed.sums)
        for k, replica in enumerate(replicas):
            stats = replica.apply_gradients(summed)
            reports.append(AppliedGradients(f"replica {k}", epoch, epochs, replica.optimizers.fingerprint(stepped),
                                            stats if epoch == epochs else {}))
    check_replicas(reports)
    return reports[-len(replicas)].stats
