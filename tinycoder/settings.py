"""What decides a tiny-coder model, with no torch or transformers import: the shape, the training settings, the
named variants (``VARIANTS``) and what the cache key hashes (``describe``). ``ensure_model`` and a launch's dry
run read only this module unless a build is needed (``tinycoder.build`` runs one).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tinycoder.cache import cache_key
from tinycoder.corpus import CorpusSettings
from tinycoder.examples import ExampleMix
from verifier.prompts import student_prompt, student_response, teacher_prompt, teacher_response
from verifier.tasks import identity_task


@dataclass(frozen=True)
class ModelShape:
    hidden: int = 256
    layers: int = 4
    kv_heads: int = 2
    intermediate: int = 768
    context: int = 1024

    def __post_init__(self) -> None:
        if self.hidden % 64:
            raise ValueError(f"ModelShape.hidden must be a multiple of the head dim 64, got {self.hidden}")
        heads = self.hidden // 64
        if heads % self.kv_heads:
            raise ValueError(f"ModelShape.kv_heads ({self.kv_heads}) must divide the {heads} attention heads")


PRECISIONS = ("fp32", "bf16", "auto")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 natively (an x86 flag of ``BF16_CPU_FLAGS`` on Linux). Elsewhere
    torch emulates bf16 and a bf16 step is slower than a float32 one, so ``"auto"`` means float32 there."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def resolve_precision(settings: "TrainSettings") -> "TrainSettings":
    """``settings`` with ``precision="auto"`` replaced by what this machine runs fastest (``native_bf16``)."""
    if settings.precision != "auto":
        return settings
    return replace(settings, precision="bf16" if native_bf16() else "fp32")


@dataclass(frozen=True)
class TrainSettings:
    """Optimizer steps, the padded-token budget of a batch, AdamW and its warmup + cosine schedule."""

    steps: int = 1000
    batch_tokens: int = 6144
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 40
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    max_len: int = 1024
    precision: str = "fp32"  # "fp32", "bf16" (autocast forward), or "auto": bf16 where the CPU has it natively
    prompt_loss_weight: float = 0.0  # w_t of a prompt token in the loss (module docstring); 0: completions only

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainSettings.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not 0.0 <= self.prompt_loss_weight <= 1.0:
            raise ValueError(f"TrainSettings.prompt_loss_weight must be in [0, 1], got {self.prompt_loss_weight}")
        if self.steps < 1:
            raise ValueError(f"TrainSettings.steps must be >= 1, got {self.steps}")
        if self.batch_tokens < self.max_len:
            raise ValueError(f"TrainSettings.batch_tokens ({self.batch_tokens}) must hold one max_len ({self.max_len}) example")


# Bump when a change to the generator, the example writer or the training loop changes the model.
GENERATOR_VERSION = 2


@dataclass(frozen=True)
class BuildSettings:
    """Everything that decides the model (the cache key hashes all of it)."""

    corpus: CorpusSettings = field(default_factory=CorpusSettings)
    mix: ExampleMix = field(default_factory=ExampleMix)
    vocab_size: int = 1024
    model: ModelShape = field(default_factory=ModelShape)
    train: TrainSettings = field(default_factory=TrainSettings)
    max_completion_tokens: int = 180  # proposals must fit the run's generation budget (configs/tiny.yaml: 192)
    seed_tasks: int = 256
    # A variant whose finished model this build's training starts from (a warm restart: its weights, a fresh AdamW,
    # this build's own warmup + cosine schedule and data order). Everything but ``train`` must equal that variant's,
    # so the corpus, the examples and the tokenizer are the same (``continued_settings`` checks).
    continues: str | None = None


# The model `python launch.py` runs with; docs/tinycoder.md has its measured build time and gates. The loss
# also predicts the prompt tokens (the programs, inputs and outputs the prompts show): 800 such steps of
# 4096 padded tokens pass the gates as 1500 completion-only steps did, in about half the build (docs/tinycoder.md).
DEFAULT = BuildSettings(
    corpus=CorpusSettings(programs=4000, inputs_per_program=5, min_inputs=4),
    model=ModelShape(hidden=192, layers=4, kv_heads=1, intermediate=768),
    # bf16 autocast where the CPU has native bf16 (~0.7 of a float32 step: docs/tinycoder.md)
    train=TrainSettings(steps=800, batch_tokens=4096, lr=2.5e-3, warmup=30, precision="auto", prompt_loss_weight=1.0),
)

VARIANTS: dict[str, BuildSettings] = {
    "default": DEFAULT,
    # For the dynamics study only (docs/dynamics.md, study H), never the default path: the default with student
    # examples that are always right and 1.5x its training, for students that solve more of the valid tasks.
    "stronger": replace(DEFAULT, mix=ExampleMix(p_correct=1.0), train=replace(DEFAULT.train, steps=1200)),
    # For the toy in the paper's regime, never the default path: `stronger` (student examples always right) on
    # ten times the corpus (40,000 programs drawn, ~104k examples) for 8,000 steps (~1.9 epochs; `stronger`: ~2.9 of
    # 4,000 programs). "large" is the data and the training: the shape stays the default's 2.4M parameters (the
    # `larger` variant showed 4,000 programs, not the parameters, bound the default). ~1.8 h on 1 thread of a shared
    # 2-core CPU with bf16 (docs/tinycoder.md); the build saves its progress and resumes (tinycoder.progress).
    "stronger-large": replace(DEFAULT, mix=ExampleMix(p_correct=1.0),
                              corpus=replace(DEFAULT.corpus, programs=40_000), train=replace(DEFAULT.train, steps=8000)),
    # The regime gate's next lever, never the default path: `stronger-large` missed the regime gate by 0.04 of unsolved valid
    # tasks with every rate still moving with training tokens and no gap between trained and held-out programs
    # (docs/tinycoder.md), so the same corpus and shape for twice the steps (~3.7 epochs); hours, resumable.
    "stronger-long": replace(DEFAULT, mix=ExampleMix(p_correct=1.0),
                             corpus=replace(DEFAULT.corpus, programs=40_000), train=replace(DEFAULT.train, steps=16_000)),
    # For the paper's regime, never the default path: `stronger-large`'s finished model trained for its 8,000 steps again (a warm
    # restart: a fresh AdamW, warmup and cosine schedule, a new data order; 64 M training tokens in all, as
    # `stronger-long`), half the hours of `stronger-long` because it starts where `stronger-large` ended.
    "stronger-large-plus": replace(DEFAULT, mix=ExampleMix(p_correct=1.0), continues="stronger-large",
                                   corpus=replace(DEFAULT.corpus, programs=40_000), train=replace(DEFAULT.train, steps=8000)),
    # For the structural-difficulty gate (docs/dynamics.md), never the default path: `stronger-large-plus` continued on
    # the first 10,000 of its drafts with code_o students that write a per-line execution trace before the answer
    # (tinycoder.line_trace), so that a longer program is more steps to get right; its tokenizer, a fresh schedule.
    "stronger-large-traced": replace(DEFAULT, mix=ExampleMix(p_correct=1.0, student_trace="lines"),
                                     continues="stronger-large-plus", corpus=replace(DEFAULT.corpus, programs=10_000),
                                     train=replace(DEFAULT.train, steps=2000)),
    # The same with examples of programs without dead code only (tinycoder.liveness): lines of code then measure work.
    "stronger-large-live-traced": replace(DEFAULT, mix=ExampleMix(p_correct=1.0, student_trace="lines", live_only=True),
                                          continues="stronger-large-plus", corpus=replace(DEFAULT.corpus, programs=10_000),
                                          train=replace(DEFAULT.train, steps=2000)),
    # For the dynamics study only (docs/dynamics.md, lever 4b), never the default path: the default's corpus, examples
    # and training on a Qwen2 of about four times the parameters (9.2M against 2.4M), so that size is the one change.
    "larger": replace(DEFAULT, model=ModelShape(hidden=320, layers=6, kv_heads=1, intermediate=1280)),
    # About a minute: small and quick, for the test suite.
    "test": BuildSettings(
        corpus=CorpusSettings(programs=800, inputs_per_program=5, min_inputs=4),
        model=ModelShape(hidden=128, layers=2, kv_heads=1, intermediate=384),
        train=TrainSettings(steps=400, batch_tokens=4096, lr=3e-3, warmup=10),
        seed_tasks=64,
    ),
}


def prompt_fingerprint() -> str:
    """The prompt and response layout of every (role, family), rendered on the seed task.

    Part of the cache key: a model trained on an older prompt format is not reused.
    """
    parts = []
    for family in ("code_o", "code_i", "code_f"):
        task = identity_task(family)
        parts.append(teacher_prompt(family, [task], n_inputs=2))
        parts.append(student_prompt(task))
        parts.append(teacher_response(family, program=task.program, inputs=task.inputs[:2], message=task.message, think="t"))
        parts.append(student_response(family, task.output, think="t"))
    return "\n".join(parts)


def continued_settings(settings: BuildSettings) -> BuildSettings | None:
    """The settings (resolved here, as ``variant_settings``) of the variant ``settings`` continues, or None.

    A continuation trains the model it continues with that model's tokenizer (a token id must keep its meaning), so its
    shape, vocabulary and corpus settings must be the parent's; it may train on other examples (``mix``) and on the
    first ``corpus.programs`` of the parent's drafts (``tinycoder.corpus.draw_programs`` draws in order, so a smaller
    corpus is a prefix of the parent's and a held-out probe is held out from both). A ValueError names what else differs.
    """
    if settings.continues is None:
        return None
    parent = variant_settings(settings.continues)
    free = ("train", "continues", "mix", "corpus")
    different = [name for name in BuildSettings.__dataclass_fields__
                 if name not in free and getattr(parent, name) != getattr(settings, name)]
    if replace(settings.corpus, programs=parent.corpus.programs) != parent.corpus or settings.corpus.programs > parent.corpus.programs:
        different.append("corpus")
    if different:
        raise ValueError(f"a build that continues the {settings.continues!r} variant must have its settings but "
                         f"train, mix and a corpus of at most its programs; these differ: {', '.join(different)}")
    return parent


def data_seed(settings: BuildSettings, seed: int) -> int:
    """The seed of a build's data order (``tinycoder.train``): ``seed``, or ``seed + 1`` for a continuation, so
    that its epochs are not the order the model it continues was trained in."""
    return seed if settings.continues is None else seed + 1


# Training settings added after builds were cached, with the value that behaves as builds did before them: at that
# value a setting is left out of the key, so those caches keep their keys.
ADDED_TRAIN_SETTINGS: dict[str, Any] = {"precision": "fp32", "prompt_loss_weight": 0.0}
ADDED_MIX_SETTINGS: dict[str, Any] = {"student_trace": "phases", "trace_chars": 200, "live_only": False}


def describe(settings: BuildSettings, seed: int) -> dict[str, Any]:
    """What the cache key hashes."""
    described = asdict(settings)
    for group, added in (("train", ADDED_TRAIN_SETTINGS), ("mix", ADDED_MIX_SETTINGS)):
        for name, before in added.items():
            if described[group][name] == before:
                del described[group][name]
    parent = continued_settings(settings)
    if parent is None:
        del described["continues"]  # added after builds were cached: their keys stay
    else:  # the key of the model it starts from, so that a change to that model makes a new build of this one
        described["continues"] = {"variant": settings.continues, "key": cache_key(describe(parent, seed))}
    return {"generator": GENERATOR_VERSION, "settings": described, "seed": seed, "prompts": prompt_fingerprint()}


def variant_settings(variant: str, **overrides: Any) -> BuildSettings:
    """The settings of a named variant on this machine (``precision="auto"`` resolved, so the cache key names
    what is built), optionally with top-level fields replaced."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny-coder variant {variant!r}; valid: {', '.join(VARIANTS)}")
    settings = replace(VARIANTS[variant], **overrides) if overrides else VARIANTS[variant]
    return replace(settings, train=resolve_precision(settings.train))
