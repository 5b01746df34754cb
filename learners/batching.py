"""Training samples -> token batches, padded or packed, split into micro-batches by a token budget.

Padding sorts samples by length first, so a micro-batch holds rows of similar length and little is
wasted on pads. Packing concatenates whole sequences into rows with ``position_ids`` restarting at 0 at
each sequence start; with ``attention_mask=None`` and no KV cache, transformers detects the restarts
(``masking_utils.find_packed_sequence_indices``) and builds a block-diagonal causal mask, so packed
sequences never attend to each other, and the adapter index is per token. Without a variable-length
attention kernel (CPU, SDPA) that mask is dense, so ``bench/learner.py`` found length-sorted padding
the faster of the two; padding is the default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Literal, Sequence

import torch

from learners.multi_lora import NO_ADAPTER


@dataclass
class Sample:
    """One generated sequence to train on: adapter slot, prompt + completion token ids, scalar reward.

    ``group`` is the part of the advantage-normalisation key besides the slot, normally (role, family).
    ``behaviour_logprobs``: log mu(y_t) of each completion token under the distribution the engine sampled
    it from (``inference.requests``), one per completion token, or None when the update takes no
    importance weight (``PGConfig.importance_correction`` "off").
    ``fixed_advantage``: a supervised target, not a sample (hindsight supervision, ``rl.hindsight_coef``): every
    token carries this advantage, normalised with no group, so its gradient is ``-c grad log pi(y) / N_a``.
    """

    slot: int
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    reward: float
    group: Hashable = ""
    behaviour_logprobs: Sequence[float] | None = None
    fixed_advantage: float | None = None
    kl_readout: bool = False  # in the step's KL-to-base readout (``policy_learner.kl_to_base_sums``)

    def __post_init__(self) -> None:
        if self.slot < 0:
            raise ValueError(f"sample slot must be >= 0, got {self.slot}")
        if len(self.prompt_ids) == 0:
            raise ValueError("sample needs at least one prompt token (the first completion token is predicted from it)")
        if len(self.completion_ids) == 0:
            raise ValueError("sample has an empty completion: nothing to train on")
        if self.behaviour_logprobs is not None and len(self.behaviour_logprobs) != len(self.completion_ids):
            raise ValueError(f"sample has {len(self.behaviour_logprobs)} behaviour log-probs for "
                             f"{len(self.completion_ids)} completion tokens: they must align one to one")

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class TokenBatch:
    """Model inputs plus, for every position whose *next* token is a completion token, where its loss goes.

    ``loss_mask[b, t]`` is True when position t predicts ``targets[b, t]``, a completion token of sample
    ``token_sample[b, t]`` (an index into the sample list; -1 elsewhere). ``token_mask`` marks real
    (non-pad) tokens; ``attention_mask`` is set for padded batches and None for packed ones.
    ``behaviour[b, t]`` is log mu(targets[b, t]) at the loss positions (0 elsewhere) when the samples carry
    behaviour log-probs, else None.
    """

    input_ids: torch.Tensor
    token_mask: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    adapter_index: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    token_sample: torch.Tensor
    samples: list[int] = field(default_factory=list)
    behaviour: torch.Tensor | None = None

    @property
    def real_tokens(self) -> int:
        """Tokens that are not padding."""
        return int(self.token_mask.sum())

    @property
    def padded_tokens(self) -> int:
        """Positions computed, pads included."""
        return self.input_ids.numel()

    def to(self, device: torch.device | str) -> "TokenBatch":
        def move(t):
            return None if t is None else t.to(device)

        return TokenBatch(
            move(self.input_ids), move(self.token_mask), move(self.position_ids), move(self.attention_mask), move(self.adapter_index),
            move(self.targets), move(self.loss_mask), move(self.token_sample), list(self.samples), move(self.behaviour),
        )


def _fill_sequence(batch: TokenBatch, row: int, offset: int, sample_id: int, sample: Sample) -> None:
    ids = list(sample.prompt_ids) + list(sample.completion_ids)
    n, p = len(ids), len(sample.prompt_ids)
    batch.input_ids[row, offset : offset + n] = torch.tensor(ids)
    batch.token_mask[row, offset : offset + n] = True
    batch.position_ids[row, offset : offset + n] = torch.arange(n)
    # Position t predicts ids[t + 1]; the loss covers the completion tokens ids[p:], predicted from p-1 .. n-2.
    batch.targets[row, offset : offset + n - 1] = torch.tensor(ids[1:])
    batch.loss_mask[row, offset + p - 1 : offset + n - 1] = True
    batch.token_sample[row, offset + p - 1 : offset + n - 1] = sample_id
    if batch.behaviour is not None:  # log mu of completion token j sits where it is predicted: position p - 1 + j
        batch.behaviour[row, offset + p - 1 : offset + n - 1] = torch.tensor(list(sample.behaviour_logprobs), dtype=torch.float32)
    if batch.adapter_index.dim() == 2:
        batch.adapter_index[row, offset : offset + n] = sample.slot


def _with_behaviour(samples: Sequence[Sample]) -> bool:
    """Whether the batch carries behaviour log-probs: all samples or none (a mix is an error)."""
    present = {s.behaviour_logprobs is not None for s in samples}
    if len(present) > 1:
        raise ValueError("some samples carry behaviour log-probs and some do not: give them for every sample or none")
    return present == {True}


def _empty(rows: int, length: int, pad_id: int, per_token: bool, behaviour: bool = False) -> TokenBatch:
    return TokenBatch(
        input_ids=torch.full((rows, length), pad_id, dtype=torch.long),
        token_mask=torch.zeros((rows, length), dtype=torch.bool),
        position_ids=torch.zeros((rows, length), dtype=torch.long),
        attention_mask=None,
        adapter_index=torch.full((rows, length) if per_token else (rows,), NO_ADAPTER, dtype=torch.long),
        targets=torch.zeros((rows, length), dtype=torch.long),
        loss_mask=torch.zeros((rows, length), dtype=torch.bool),
        token_sample=torch.full((rows, length), -1, dtype=torch.long),
        behaviour=torch.zeros((rows, length), dtype=torch.float32) if behaviour else None,
    )


def pad_batch(samples: Sequence[Sample], sample_ids: Sequence[int], pad_id: int) -> TokenBatch:
    """One row per sample, right-padded to the longest; per-row adapter index; rows sorted by slot.

    Sorting by slot makes each adapter's rows contiguous, so the grouped LoRA kernel uses views.
    """
    order = sorted(range(len(samples)), key=lambda i: samples[i].slot)
    length = max(len(samples[i]) for i in order)
    batch = _empty(len(order), length, pad_id, per_token=False, behaviour=_with_behaviour(samples))
    for row, i in enumerate(order):
        _fill_sequence(batch, row, 0, sample_ids[i], samples[i])
        batch.adapter_index[row] = samples[i].slot
    batch.attention_mask = batch.token_mask.long()
    batch.samples = [sample_ids[i] for i in order]
    return batch


def pack_batch(samples: Sequence[Sample], sample_ids: Sequence[int], pad_id: int, row_length: int) -> TokenBatch:
    """Whole sequences packed into rows of ``row_length`` tokens (first-fit decreasing); per-token adapter index.

    Sequences are never split. Tails of rows are padding with position ids continuing past the last
    sequence; no loss is taken there. A sample longer than ``row_length`` is an error.
    """
    too_long = [len(samples[i]) for i in range(len(samples)) if len(samples[i]) > row_length]
    if too_long:
        raise ValueError(f"{len(too_long)} sample(s) of up to {max(too_long)} tokens exceed the packed row length {row_length}")
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i]), samples[i].slot))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if len(samples[i]) <= free:
                rows[r].append(i)
                room[r] -= len(samples[i])
                break
        else:
            rows.append([i])
            room.append(row_length - len(samples[i]))
    length = max(row_length - free for free in room)
    batch = _empty(len(rows), length, pad_id, per_token=True, behaviour=_with_behaviour(samples))
    for r, members in enumerate(rows):
        members.sort(key=lambda i: samples[i].slot)  # adapters contiguous within a row
        offset = 0
        for i in members:
            _fill_sequence(batch, r, offset, sample_ids[i], samples[i])
            offset += len(samples[i])
        # Continue positions through the tail so it forms one more (loss-free) "sequence", not many.
        batch.position_ids[r, offset:] = torch.arange(length - offset)
    batch.samples = [sample_ids[i] for members in rows for i in members]
    return batch


def micro_batches(
    samples: Sequence[Sample],
    pad_id: int,
    max_tokens: int,
    mode: Literal["pack", "pad"] = "pad",
) -> list[TokenBatch]:
    """Split ``samples`` into batches of at most ~``max_tokens`` computed positions each, padded or packed.

    ``"pad"``: samples sorted by length, so rows of similar length share a batch (little padding).
    ``"pack"``: sequences packed into rows as long as the longest sample, as many rows per batch as fit
    the budget. Rows are never longer than the longest sample because attention over a packed row costs
    O(row length^2) with a dense block-diagonal mask (no varlen kernel on CPU / SDPA).
    A batch always holds at least one sample, even if that alone exceeds ``max_tokens``.
    """
    if not samples:
        raise ValueError("no samples to batch")
    if mode not in ("pack", "pad"):
        raise ValueError(f"unknown batching mode {mode!r}; use 'pack' or 'pad'")
    if mode == "pack":
        row_length = max(len(s) for s in samples)
        packed = pack_batch(samples, list(range(len(samples))), pad_id, row_length)
        per_batch = max(1, max_tokens // row_length)
        rows = packed.input_ids.shape[0]
        return [_select_rows(packed, list(range(r, min(r + per_batch, rows)))) for r in range(0, rows, per_batch)]
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]))
    out: list[TokenBatch] = []
    chunk: list[int] = []
    for i in order:
        # Sorted ascending, so the newest sample is the longest of the chunk.
        if chunk and (len(chunk) + 1) * len(samples[i]) > max_tokens:
            out.append(pad_batch([samples[j] for j in chunk], chunk, pad_id))
            chunk = []
        chunk.append(i)
    out.append(pad_batch([samples[j] for j in chunk], chunk, pad_id))
    return out


def _select_rows(batch: TokenBatch, rows: list[int]) -> TokenBatch:
    sel = torch.tensor(rows)
    keep = [s for r in rows for s in torch.unique(batch.token_sample[r]).tolist() if s >= 0]
    return TokenBatch(
        batch.input_ids[sel], batch.token_mask[sel], batch.position_ids[sel],
        None if batch.attention_mask is None else batch.attention_mask[sel],
        batch.adapter_index[sel], batch.targets[sel], batch.loss_mask[sel], batch.token_sample[sel], keep,
        None if batch.behaviour is None else batch.behaviour[sel],
    )
