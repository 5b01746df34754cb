"""The bootstrap pipeline: programs -> verified corpus -> examples -> tokenizer -> Qwen2 model -> training.

``build_model(settings, seed, out_dir)`` writes a Hugging Face model directory (``config.json``,
``model.safetensors``, ``generation_config.json``, the tokenizer files), plus ``tasks.jsonl``
(verified corpus tasks, usable as a buffer seed file) and the manifest ``tinycoder.json`` last.
Every random choice derives from ``seed``, so two builds with one seed give identical weights.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from tinycoder.corpus import VerifiedProgram, build_corpus
from tinycoder.examples import Example, ExampleWriter, io_task
from tinycoder.model import new_model, qwen2_config, stand_in_model
from tinycoder.settings import GENERATOR_VERSION, BuildSettings, resolve_precision
from tinycoder.tokenizer import reload, save_tokenizer, train_tokenizer
from tinycoder.train import cpu_threads, encode, measure_step_seconds, train
from verifier.sandbox import Verifier

# Mean tokens of an example and of its completion in the default corpus (measured: 165 and 65).
TYPICAL_EXAMPLE = (165, 65)
# Corpus, examples and tokenizer took 6-8% of the training time in measured builds
# (default: 41 s beside 672 s of training; test: 9 s beside 116 s).
PREP_SHARE = 0.08


def estimate_build(settings: BuildSettings) -> tuple[float, float]:
    """(seconds per training step measured now on a stand-in model of ``settings.model``, the
    build's estimated seconds ``steps * s_step * (1 + PREP_SHARE)``), with torch's current threads."""
    model = stand_in_model(settings.model, settings.vocab_size)
    s_step = measure_step_seconds(model, settings.train, *TYPICAL_EXAMPLE)
    return s_step, settings.train.steps * s_step * (1 + PREP_SHARE)


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"[tiny-coder] {message}", file=sys.stderr, flush=True)


def make_examples(corpus: list[VerifiedProgram], settings: BuildSettings, seed: int) -> list[Example]:
    return ExampleWriter(corpus, settings.mix, random.Random(seed + 1)).all_examples()


def build_model(
    settings: BuildSettings,
    seed: int,
    out_dir: Path,
    progress: bool = True,
    threads: int | None = None,
    announce: str | None = None,
) -> dict[str, Any]:
    """Build the model into ``out_dir`` (see module docstring); returns the manifest it wrote.

    ``announce``: when given (and ``progress``), printed first with the build's estimated duration,
    from training steps timed on this machine just now (``estimate_build``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = replace(settings, train=resolve_precision(settings.train))
    started = time.perf_counter()
    threads = threads or cpu_threads()
    torch.set_num_threads(threads)
    estimate = None
    if progress and announce is not None:
        s_step, estimate = estimate_build(settings)
        _log(progress, f"{announce}: about {max(1, round(estimate / 60))} min on {threads} torch thread(s) here "
                       f"({settings.train.steps} training steps at {s_step:.2f} s/step measured just now, plus the corpus)")
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    with Verifier(timeout_s=2.0, memory_mb=256, max_output_chars=settings.corpus.max_output_chars) as verifier:
        corpus = build_corpus(verifier, settings.corpus, seed)
    timings["corpus_s"] = time.perf_counter() - t0
    _log(progress, f"corpus: {len(corpus)} of {settings.corpus.programs} programs kept ({timings['corpus_s']:.0f} s)")
    if not corpus:
        raise RuntimeError("the verifier accepted no generated program; is the sandbox working? (python -m verifier run ...)")

    t0 = time.perf_counter()
    examples = make_examples(corpus, settings, seed)
    # Prompts and completions are tokenized separately (as an engine sees them), so train on them apart.
    trained = train_tokenizer((text for e in examples for text in (e.prompt, e.completion)), settings.vocab_size)
    save_tokenizer(trained, out_dir)
    qwen2_config(settings.model, trained).save_pretrained(out_dir)  # AutoTokenizer picks its class by model_type
    tokenizer = reload(out_dir, trained, (text for e in examples[:50] for text in (e.prompt, e.completion)))
    data = encode(examples, tokenizer, settings.train.max_len)
    data = [d for d in data if len(d.ids) - d.prompt_len <= settings.max_completion_tokens]
    timings["examples_tokenizer_s"] = time.perf_counter() - t0
    _log(progress, f"{len(data)} of {len(examples)} examples fit; tokenizer of {len(tokenizer)} tokens")

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = new_model(settings.model, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    _log(progress, f"training a {n_params / 1e6:.1f}M-parameter Qwen2 for {settings.train.steps} steps"
                   + (" (bf16 autocast: this CPU has native bf16)" if settings.train.precision == "bf16" else ""))
    losses = train(model, data, settings.train, tokenizer.pad_token_id, seed, progress=progress, threads=threads)
    timings["train_s"] = time.perf_counter() - t0

    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out_dir)
    _write_seed_tasks(corpus, settings.seed_tasks, out_dir / "tasks.jsonl", random.Random(seed + 2))
    manifest = {
        "name": "tiny-coder",
        "seed": seed,
        "settings": asdict(settings),
        "generator_version": GENERATOR_VERSION,
        "parameters": n_params,
        "programs": len(corpus),
        "examples": len(data),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "first_loss": losses[0],
        "threads": threads,
        "openmp_env": {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        # three significant figures, not decimals: a tiny build's step can take under a millisecond
        "s_per_step": float(f"{timings['train_s'] / settings.train.steps:.3g}"),
        "estimated_build_s": None if estimate is None else float(f"{estimate:.3g}"),
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "build_s": round(time.perf_counter() - started, 1),
    }
    (out_dir / "tinycoder.json").write_text(json.dumps(manifest, indent=1))
    _log(progress, f"built in {manifest['build_s']:.0f} s, final loss {manifest['final_loss']:.3f}")
    return manifest


def _write_seed_tasks(corpus: list[VerifiedProgram], count: int, path: Path, rng: random.Random) -> None:
    """A JSONL of verified code_o tasks from the corpus (a ``tasks.seed_file`` for the buffers)."""
    chosen = rng.sample(corpus, min(count, len(corpus)))
    with path.open("w") as fh:
        for item in chosen:
            fh.write(json.dumps(io_task("code_o", item).to_dict()) + "\n")
