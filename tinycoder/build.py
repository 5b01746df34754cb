"""The bootstrap pipeline: programs -> verified corpus -> examples -> tokenizer -> Qwen2 model -> training.

``build_model(settings, seed, out_dir)`` writes a Hugging Face model directory (``config.json``,
``model.safetensors``, ``generation_config.json``, the tokenizer files), plus ``tasks.jsonl``
(verified corpus tasks, usable as a buffer seed file) and the manifest ``tinycoder.json`` last.
Every random choice derives from ``seed``, so two builds with one seed give identical weights.

Given ``save_dir`` (a cached build gives its ``<variant>-<key>.progress`` directory), the build saves its progress
there (``tinycoder.progress``: the corpus once made, the tokenizer and encoded examples, the training state every
``save_policy``) and resumes from what an interrupted build saved, saying in one line which.
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
from transformers import AutoTokenizer

from tinycoder.cache import build_once, cache_key
from tinycoder.corpus import VerifiedProgram, build_corpus
from tinycoder.examples import Example, ExampleWriter, io_task
from tinycoder.line_trace import line_traces
from tinycoder.liveness import dead_code
from tinycoder.model import new_model, qwen2_config, stand_in_model
from tinycoder.progress import BuildProgress, Resume, progress_dir_for
from tinycoder.settings import GENERATOR_VERSION, BuildSettings, data_seed, describe, resolve_precision
from tinycoder.tokenizer import reload, save_tokenizer, train_tokenizer
from tinycoder.train import SavePolicy, cpu_threads, encode, measure_step_seconds, train
from verifier.sandbox import Verifier

# Mean tokens of an example and of its completion in the default corpus (measured: 165 and 65).
TYPICAL_EXAMPLE = (165, 65)
# Seconds per drawn program of the corpus, the examples and the tokenizer together, on 2 cores (2026-11-29):
# the corpus 0.008 s idle (32 s for 4000 programs), 0.011 at load ~4, 0.030 at load ~10; examples, tokenizer and
# encoding 0.003 at load ~10. (Before: a flat 8% of the training time, which a 10x corpus outgrows.)
PREP_S_PER_PROGRAM = 0.012


def estimate_build(settings: BuildSettings, done_steps: int = 0, programs_left: int | None = None) -> tuple[float, float]:
    """(seconds per training step measured now on a stand-in model of ``settings.model``, the build's estimated
    seconds ``(steps - done_steps) * s_step + programs_left * PREP_S_PER_PROGRAM``), with torch's current threads.
    ``programs_left``: drawn programs still to verify (default all; a resumed build's saved corpus counts 0)."""
    model = stand_in_model(settings.model, settings.vocab_size)
    s_step = measure_step_seconds(model, settings.train, *TYPICAL_EXAMPLE)
    programs = settings.corpus.programs if programs_left is None else programs_left
    return s_step, (settings.train.steps - done_steps) * s_step + programs * PREP_S_PER_PROGRAM


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"[tiny-coder] {message}", file=sys.stderr, flush=True)


# The sandbox's output bound for a per-line trace run: MAX_EVENTS (name, repr) pairs of short values.
TRACE_OUTPUT_CHARS = 8000


def make_examples(corpus: list[VerifiedProgram], settings: BuildSettings, seed: int) -> list[Example]:
    """Every example of ``corpus`` (``tinycoder.examples``); with ``mix.student_trace == "lines"`` the sandbox first runs
    each program's instrumented copy on its first input for the students' per-line traces (``tinycoder.line_trace``)."""
    lines = None
    if settings.mix.student_trace == "lines":
        with Verifier(timeout_s=2.0, memory_mb=256, max_output_chars=TRACE_OUTPUT_CHARS) as verifier:
            traces = line_traces(verifier, [(item.program.source, item.inputs[0]) for item in corpus], settings.mix.trace_chars)
        lines = {item.program.source: trace for item, trace in zip(corpus, traces)}
    return ExampleWriter(corpus, settings.mix, random.Random(seed + 1), lines).all_examples()


def build_model(
    settings: BuildSettings,
    seed: int,
    out_dir: Path,
    progress: bool = True,
    threads: int | None = None,
    announce: str | None = None,
    save_dir: Path | None = None,
    save_policy: SavePolicy = SavePolicy(),
    start_from: Path | None = None,
) -> dict[str, Any]:
    """Build the model into ``out_dir`` (see module docstring); returns the manifest it wrote.

    ``announce``: when given (and ``progress``), printed first with the build's estimated duration,
    from training steps timed on this machine just now (``estimate_build``).
    ``save_dir``: the build's progress directory (``tinycoder.progress``): resume from its saves, or start from
    scratch, with one line saying which (printed with ``progress``; the manifest's ``start`` records it too), and
    save there (training: every ``save_policy``). The caller must hold the build's lock and remove the directory
    once the finished model is in place.
    ``start_from``: for settings that continue a variant (``BuildSettings.continues``), that variant's finished model
    directory: training starts from its weights, with its tokenizer.
    """
    if (settings.continues is None) != (start_from is None):
        raise ValueError(f"start_from goes with settings that continue a variant (continues={settings.continues!r}, "
                         f"start_from={start_from})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = replace(settings, train=resolve_precision(settings.train))
    started = time.perf_counter()
    threads = threads or cpu_threads()
    torch.set_num_threads(threads)
    described = describe(settings, seed)
    saves = None if save_dir is None else BuildProgress(Path(save_dir), cache_key(described), described)
    resume = saves.open(settings.train.steps, threads) if saves is not None else Resume(None, None, None, None, "")
    estimate = None
    if progress and announce is not None:
        verified = settings.corpus.programs if resume.corpus is not None else resume.partial.drafts_done if resume.partial else 0
        s_step, estimate = estimate_build(settings, resume.step, settings.corpus.programs - verified)
        left = (f"{settings.train.steps} training steps" if resume.step == 0 else
                f"{settings.train.steps - resume.step} of {settings.train.steps} training steps left")
        prep = ("" if resume.prepared is not None else ", plus the examples" if resume.corpus is not None
                else ", plus the corpus" if resume.partial is None else ", plus the rest of the corpus")
        _log(progress, f"{announce}: about {max(1, round(estimate / 60))} min on {threads} torch thread(s) here "
                       f"({left} at {s_step:.2f} s/step measured just now{prep})")
    if resume.line:
        _log(progress, resume.line)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    if resume.corpus is not None:
        corpus = resume.corpus
        _log(progress, f"corpus: {len(corpus)} of {settings.corpus.programs} programs kept (the saved corpus)")
    else:
        with Verifier(timeout_s=2.0, memory_mb=256, max_output_chars=settings.corpus.max_output_chars) as verifier:
            corpus = build_corpus(verifier, settings.corpus, seed, resume=resume.partial,
                                  chunk=None if saves is None else save_policy.corpus_chunk,
                                  on_chunk=None if saves is None else saves.save_partial_corpus)
        _log(progress, f"corpus: {len(corpus)} of {settings.corpus.programs} programs kept ({time.perf_counter() - t0:.0f} s)")
        if not corpus:
            raise RuntimeError("the verifier accepted no generated program; is the sandbox working? (python -m verifier run ...)")
        if saves is not None:
            saves.save_corpus(corpus)
    timings["corpus_s"] = time.perf_counter() - t0

    if settings.mix.live_only:
        corpus = [item for item in corpus if not dead_code(item.program.source)]
        _log(progress, f"{len(corpus)} of them without dead code make the examples")
    t0 = time.perf_counter()
    if saves is not None and resume.prepared is not None and resume.data is not None:
        tokenizer = saves.restore_prepared(out_dir)
        data = resume.data
        _log(progress, f"{len(data)} examples (saved); tokenizer of {len(tokenizer)} tokens")
    else:
        examples = make_examples(corpus, settings, seed)
        if start_from is not None:  # the token ids must keep the meaning the model it continues learned
            trained = AutoTokenizer.from_pretrained(start_from)
        else:  # prompts and completions are tokenized separately (as an engine sees them), so train on them apart
            trained = train_tokenizer((text for e in examples for text in (e.prompt, e.completion)), settings.vocab_size)
        save_tokenizer(trained, out_dir)
        qwen2_config(settings.model, trained).save_pretrained(out_dir)  # AutoTokenizer picks its class by model_type
        tokenizer = reload(out_dir, trained, (text for e in examples[:50] for text in (e.prompt, e.completion)))
        data = encode(examples, tokenizer, settings.train.max_len)
        data = [d for d in data if len(d.ids) - d.prompt_len <= settings.max_completion_tokens]
        _log(progress, f"{len(data)} of {len(examples)} examples fit; tokenizer of {len(tokenizer)} tokens")
        if saves is not None:
            saves.save_prepared(out_dir, sorted(p.name for p in out_dir.iterdir() if p.is_file()), data)
    timings["examples_tokenizer_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = new_model(settings.model, tokenizer)
    if start_from is not None:  # a training save, when resumed from, holds the weights already
        load_start(model, tokenizer, Path(start_from), weights=resume.train is None)
        _log(progress, f"continuing the {settings.continues!r} model in {start_from}")
    n_params = sum(p.numel() for p in model.parameters())
    _log(progress, f"training a {n_params / 1e6:.1f}M-parameter Qwen2 for {settings.train.steps} steps"
                   + (f" from step {resume.step}" if resume.step else "")
                   + (" (bf16 autocast: this CPU has native bf16)" if settings.train.precision == "bf16" else ""))
    losses = train(model, data, settings.train, tokenizer.pad_token_id, data_seed(settings, seed), progress=progress, threads=threads,
                   resume=resume.train, save=None if saves is None else saves.save_train, save_policy=save_policy)
    timings["train_s"] = time.perf_counter() - t0

    write_model(model, tokenizer, corpus, settings, seed, out_dir)
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
        "s_per_step": float(f"{timings['train_s'] / max(1, settings.train.steps - resume.step):.3g}"),
        "continues": None if start_from is None else described["settings"]["continues"],  # no path: manifests ship
        "start": resume.line or None,  # the one line that said whether the build resumed
        "resumed_from_step": resume.step if resume.train is not None else None,
        "train_s_total": round(timings["train_s"] + (resume.train.train_s if resume.train is not None else 0.0), 1),
        "estimated_build_s": None if estimate is None else float(f"{estimate:.3g}"),
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "build_s": round(time.perf_counter() - started, 1),
    }
    (out_dir / "tinycoder.json").write_text(json.dumps(manifest, indent=1))
    _log(progress, f"built in {manifest['build_s']:.0f} s, final loss {manifest['final_loss']:.3f}")
    return manifest


def build_cached(
    settings: BuildSettings,
    seed: int,
    target: Path,
    *,
    progress: bool = True,
    threads: int | None = None,
    announce: str | None = None,
    save_policy: SavePolicy = SavePolicy(),
    start_from: Path | None = None,
) -> Path:
    """Build into the cache entry ``target`` (``<root>/<variant>-<key>``) unless it is there: under its lock, in a
    temporary directory renamed into place (``tinycoder.cache.build_once``), saving progress in
    ``<variant>-<key>.progress`` beside it and resuming from it; the progress goes once the model is in place."""
    target = Path(target)
    save_dir = progress_dir_for(target)
    return build_once(target.parent, target.name,
                      lambda tmp: build_model(settings, seed, tmp, progress=progress, threads=threads, announce=announce,
                                              save_dir=save_dir, save_policy=save_policy, start_from=start_from),
                      leftovers=(save_dir,))


def load_start(model: torch.nn.Module, tokenizer: Any, directory: Path, weights: bool = True) -> None:
    """Check that the tokenizer of the finished model in ``directory`` is ``tokenizer`` (a continuation's token ids must
    mean what they meant to the model it continues; a resumed build's saved tokenizer must still be it), then, with
    ``weights``, load its weights into ``model`` (float32)."""
    from transformers import AutoModelForCausalLM

    if AutoTokenizer.from_pretrained(directory).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"the tokenizer in {directory} is not the one this build trains with: a continuation "
                         f"trains with the tokenizer of the model it continues")
    if not weights:
        return
    start = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.load_state_dict(start.state_dict())


def write_model(model: torch.nn.Module, tokenizer: Any, corpus: list[VerifiedProgram], settings: BuildSettings,
                seed: int, out_dir: Path) -> None:
    """The weights (with the tokenizer's special ids in the generation config) and the seed tasks into ``out_dir``,
    which holds the tokenizer's files and ``config.json`` already: the trained model directory, less its manifest."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    if not sys.stderr.isatty():  # transformers' "Writing model shards" bar, a redraw in a log file
        hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    _write_seed_tasks(corpus, settings.seed_tasks, out_dir / "tasks.jsonl", random.Random(seed + 2))


def _write_seed_tasks(corpus: list[VerifiedProgram], count: int, path: Path, rng: random.Random) -> None:
    """A JSONL of verified code_o tasks from the corpus (a ``tasks.seed_file`` for the buffers)."""
    chosen = rng.sample(corpus, min(count, len(corpus)))
    with path.open("w") as fh:
        for item in chosen:
            fh.write(json.dumps(io_task("code_o", item).to_dict()) + "\n")
