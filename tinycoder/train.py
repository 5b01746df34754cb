"""Supervised training of the tiny model on prompt + completion examples (loss on the completion only).

CPU, deterministic: the parameter init comes from ``torch.manual_seed(seed)`` and the data order from
``random.Random(seed)``; the number of torch threads is fixed before training. Weights, gradients and AdamW's
state are float32; with ``precision="bf16"`` the forward pass runs under ``torch.autocast`` in bfloat16
(matrix products and attention in bf16, the loss and the norms in float32), which on a CPU with native bf16
dot products (``avx512_bf16``/``amx_bf16``) takes ~0.6-0.7 of a float32 step (docs/tinycoder.md). Batches
hold examples of similar length (sorted, then cut at a padded-token budget) and are visited in a
seeded random order each epoch.

Loss, per batch: ``-(sum_t w_t log p(x_t | x_<t)) / sum_t w_t`` with ``w_t = 1`` on completion tokens and
``w_t = prompt_loss_weight`` on prompt tokens (after the first). With the weight 0 (``TrainSettings``' default;
the ``default`` variant uses 1) it is the mean over the N completion tokens and the prompt only conditions; a
weight > 0 also teaches the programs, inputs and outputs the prompts show, at no extra cost but the LM head on
those positions. The LM head runs only on positions of weight > 0, which saves most of its cost when
the prompts are not predicted.

Resumable: ``train`` can hand a :class:`TrainState` (everything the remaining steps depend on) to a
``save`` callback every so often (:class:`SavePolicy`) and continue from one (``resume=``); continued with the same
torch thread count it takes exactly the steps an uninterrupted run takes, to the last bit.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from tinycoder.examples import Example
from tinycoder.settings import TrainSettings, resolve_precision

LINE_EVERY_S = 30.0
"""With progress on and stderr not a terminal, a training progress line at most this often (and at the last step)."""

@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    prompt_len: int


def encode(examples: Sequence[Example], tokenizer: PreTrainedTokenizerFast, max_len: int) -> list[Encoded]:
    """Prompt and completion tokenized separately (the prompt exactly as an engine tokenizes it),
    EOS appended to the completion; examples longer than ``max_len`` are dropped."""
    prompts = tokenizer([e.prompt for e in examples], add_special_tokens=False)["input_ids"]
    completions = tokenizer([e.completion for e in examples], add_special_tokens=False)["input_ids"]
    out = []
    for p, c in zip(prompts, completions):
        ids = p + c + [tokenizer.eos_token_id]
        if len(ids) <= max_len:
            out.append(Encoded(ids, len(p)))
    return out


def make_batches(data: Sequence[Encoded], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length, each group's padded size within ``batch_tokens``, in random order."""
    order = list(range(len(data)))
    rng.shuffle(order)
    order.sort(key=lambda i: len(data[i].ids))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = len(data[i].ids)  # sorted ascending: the newcomer is the longest
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def next_batch(queue: list[list[int]], data: Sequence[Encoded], batch_tokens: int, rng: random.Random) -> list[int]:
    """The data order of :func:`train`: the next batch popped from the end of the epoch's ``queue``, refilled in place
    with a new epoch's :func:`make_batches` when empty."""
    if not queue:
        queue.extend(make_batches(data, batch_tokens, rng))
    return queue.pop()


def tokens_trained(data: Sequence[Encoded], batch_tokens: int, seed: int, steps: int) -> int:
    """The (unpadded) tokens of the batches the first ``steps`` steps of :func:`train` draw: its data order
    (:func:`next_batch` from ``random.Random(seed)``) replayed."""
    rng, queue = random.Random(seed), []
    return sum(len(data[i].ids) for _ in range(steps) for i in next_batch(queue, data, batch_tokens, rng))


def collate(
    data: Sequence[Encoded], batch: list[int], pad_id: int, prompt_loss_weight: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and the loss weight ``w`` of each position's *next* token
    (float32, ``[rows, width - 1]``): 1 before a completion token, ``prompt_loss_weight`` before a prompt
    token, 0 before padding."""
    width = max(len(data[i].ids) for i in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    target = torch.zeros((len(batch), width - 1), dtype=torch.float32)
    for row, i in enumerate(batch):
        item = data[i]
        n = len(item.ids)
        ids[row, :n] = torch.tensor(item.ids)
        attn[row, :n] = 1
        target[row, : item.prompt_len - 1] = prompt_loss_weight
        target[row, item.prompt_len - 1 : n - 1] = 1.0
    return ids, attn, target


def completion_loss(model: Qwen2ForCausalLM, ids: torch.Tensor, attn: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Weighted mean next-token cross-entropy ``sum_t w_t CE_t / sum_t w_t`` (module docstring); the LM head
    runs on the positions of weight > 0 only."""
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
    picked = target > 0
    logits = model.lm_head(hidden[:, :-1][picked])
    weight = target[picked]
    per_token = F.cross_entropy(logits, ids[:, 1:][picked], reduction="none")
    return (per_token * weight).sum() / weight.sum()


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def measure_step_seconds(
    model: Qwen2ForCausalLM, settings: TrainSettings, example_len: int, completion_len: int, steps: int = 3
) -> float:
    """Seconds per training step of ``model`` on this machine now: the median of ``steps`` timed steps
    (after one warm-up step) on a synthetic batch of ``settings.batch_tokens // example_len`` random
    examples of ``example_len`` tokens with ``completion_len`` completion tokens each.

    Used for the build's time estimate; works on a throwaway model (its weights change).
    """
    if not 0 < completion_len < example_len <= settings.max_len:
        raise ValueError(f"need 0 < completion_len ({completion_len}) < example_len ({example_len}) <= max_len ({settings.max_len})")
    gen = torch.Generator().manual_seed(0)
    rows = max(1, settings.batch_tokens // example_len)
    ids = torch.randint(0, model.config.vocab_size, (rows, example_len), generator=gen)
    attn = torch.ones_like(ids)
    target = torch.full((rows, example_len - 1), settings.prompt_loss_weight, dtype=torch.float32)
    target[:, example_len - 1 - completion_len :] = 1.0
    opt = make_optimizer(model, settings)
    precision = resolve_precision(settings).precision
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        train_step(model, opt, ids, attn, target, settings.grad_clip, precision)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_optimizer(model: Qwen2ForCausalLM, settings: TrainSettings) -> torch.optim.AdamW:
    """AdamW (betas 0.9/0.95) with ``settings.weight_decay`` on the matrices and none on the vectors (norms)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def train_step(model: Qwen2ForCausalLM, opt: torch.optim.Optimizer, ids: torch.Tensor, attn: torch.Tensor,
               target: torch.Tensor, grad_clip: float, precision: str = "fp32") -> float:
    """One optimizer step on ``completion_loss`` (weighted by ``target``), gradients clipped to norm ``grad_clip``;
    returns the loss.
    ``precision="bf16"``: the forward pass under bf16 autocast (module docstring)."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = completion_loss(model, ids, attn, target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss.item()


def cpu_threads() -> int:
    """Cores this process may run on (the affinity mask, not the machine's core count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class TrainState:
    """What the remaining steps of a training run depend on, after ``step`` optimizer steps.

    The learning-rate schedule is a function of the step (``lr_at``), so the step is its whole state; the data order
    is the Python RNG's state (``random.Random.getstate()``) plus the batches of the current epoch not yet trained
    (``queue``, trained from its end). ``threads`` and ``train_s`` (seconds the kept steps took) are recorded, not
    restored: another thread count continues correctly, but not to the same last bits.
    Every field is a tensor or a plain Python value, so ``torch.load(weights_only=True)`` reads a saved one back.
    """

    step: int
    losses: list[float]
    data_rng: tuple[Any, ...]
    queue: list[list[int]]
    torch_rng: torch.Tensor
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    threads: int
    train_s: float


@dataclass(frozen=True)
class SavePolicy:
    """When ``train`` saves: after every ``every_steps`` steps (when set) and whenever ``every_s`` seconds have passed
    since the last save (or the start); never after the last step (the finished model is written instead). A build
    also saves its corpus after every ``corpus_chunk`` programs verified (``tinycoder.corpus.build_corpus``)."""

    every_s: float = 120.0
    every_steps: int | None = None
    corpus_chunk: int = 4000

    def __post_init__(self) -> None:
        if self.every_s <= 0:
            raise ValueError(f"SavePolicy.every_s must be > 0, got {self.every_s}")
        if self.every_steps is not None and self.every_steps < 1:
            raise ValueError(f"SavePolicy.every_steps must be >= 1 or None, got {self.every_steps}")
        if self.corpus_chunk < 1:
            raise ValueError(f"SavePolicy.corpus_chunk must be >= 1, got {self.corpus_chunk}")

    def due(self, steps_done: int, total_steps: int, since_save_s: float) -> bool:
        if steps_done >= total_steps:
            return False
        by_steps = self.every_steps is not None and steps_done % self.every_steps == 0
        return by_steps or since_save_s >= self.every_s


def train(
    model: Qwen2ForCausalLM,
    data: Sequence[Encoded],
    settings: TrainSettings,
    pad_id: int,
    seed: int,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
    threads: int | None = None,
    resume: TrainState | None = None,
    save: Callable[[TrainState], None] | None = None,
    save_policy: SavePolicy = SavePolicy(),
) -> list[float]:
    """Train ``model`` in place for ``settings.steps`` steps; returns the loss of every step (earlier runs' included
    when resumed).

    ``threads``: torch CPU threads (default: the cores this process may use).
    ``resume``: continue from this state (its model, optimizer, step, losses, data order and torch RNG replace the
    fresh ones) instead of step 0. ``save``: called with the current :class:`TrainState` when ``save_policy`` says
    so; it must write the state before returning (the tensors are the live ones, not copies).
    """
    if not data:
        raise ValueError("no training examples (all longer than max_len?)")
    precision = resolve_precision(settings).precision
    threads = threads or cpu_threads()
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    opt = make_optimizer(model, settings)
    losses: list[float] = []
    queue: list[list[int]] = []
    start, earlier_s = 0, 0.0
    if resume is not None:
        if not 0 <= resume.step <= settings.steps:
            raise ValueError(f"cannot resume at step {resume.step} of a {settings.steps}-step run")
        model.load_state_dict(resume.model)
        opt.load_state_dict(resume.optimizer)
        rng.setstate(resume.data_rng)
        queue = [list(batch) for batch in resume.queue]
        if any(not 0 <= i < len(data) for batch in queue for i in batch):
            raise ValueError("the saved data order indexes examples these data do not have")
        torch.set_rng_state(resume.torch_rng)
        start, earlier_s, losses = resume.step, resume.train_s, list(resume.losses)
    model.train()
    # a bar on a terminal; redirected (a log file, a pipe), one line every LINE_EVERY_S instead of the bar's redraws
    bar = tqdm(total=settings.steps, initial=start, desc="tiny-coder", unit="step", file=sys.stderr,
               disable=not (progress and sys.stderr.isatty()), mininterval=2.0)
    show_lines = progress and bar.disable
    began = last_save = last_line = time.perf_counter()
    for step in range(start, settings.steps):
        ids, attn, target = collate(data, next_batch(queue, data, settings.batch_tokens, rng), pad_id,
                                    settings.prompt_loss_weight)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings)
        losses.append(train_step(model, opt, ids, attn, target, settings.grad_clip, precision))
        if on_step is not None:
            on_step(step, losses[-1])
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
        now = time.perf_counter()
        if show_lines and (now - last_line >= LINE_EVERY_S or step + 1 == settings.steps):
            recent = losses[-10:]
            print(f"[tiny-coder] step {step + 1}/{settings.steps}, loss {sum(recent) / len(recent):.3f} "
                  f"({earlier_s + now - began:.0f} s)", file=sys.stderr, flush=True)
            last_line = now
        if save is not None and save_policy.due(step + 1, settings.steps, now - last_save):
            save(TrainState(step=step + 1, losses=list(losses), data_rng=rng.getstate(), queue=[list(b) for b in queue],
                            torch_rng=torch.get_rng_state(), model=model.state_dict(), optimizer=opt.state_dict(),
                            threads=threads, train_s=earlier_s + now - began))
            last_save = time.perf_counter()
    bar.close()
    model.eval()
    return losses
