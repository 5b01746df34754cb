"""The embedded default model: a tiny Qwen2 code model the project bootstraps on CPU and caches.

    from tinycoder import ensure_model
    path = ensure_model()                 # the shipped model (tinycoder/models/default), or a cached build of it
    path = ensure_model("test")           # small and quick, for tests (shipped too)
    path = ensure_model("stronger")       # a study variant: built once (minutes; it says how many), then cached

The default and test variants ship with the code (``tinycoder.shipped``); they are used when their key equals
the key this code would build, else built into the cache with one line saying why.

The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` (and vLLM, PEFT). No ray here, and no torch
until a model is built (``tinycoder.settings`` decides the cache key), so a dry run starts in about a second.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tinycoder.settings import VARIANTS, BuildSettings, describe, variant_settings
from tinycoder.cache import MANIFEST, cache_key, cache_root
from tinycoder.shipped import ShippedModelError, shipped_model

__all__ = ["VARIANTS", "BuildSettings", "ShippedModelError", "build_here", "ensure_model", "model_dir"]

# The build runs in a child process whose idle OpenMP threads spin only briefly (~0.1 ms: enough to
# bridge the gap between two ops) before they sleep: libgomp (KMP_* for Intel's OpenMP) reads this
# only when torch loads it, so a parent cannot change its own. With the default long spin, a training
# step on a busy 2-core machine took 2-3 times as long (docs/tinycoder.md, "Where the build time goes").
BUILD_ENV = {"GOMP_SPINCOUNT": "10000", "KMP_BLOCKTIME": "1"}


def model_dir(variant: str = "default", seed: int = 0, cache_dir: Path | str | None = None) -> Path:
    """Where ``ensure_model(variant, seed)`` keeps its model (whether or not it is built yet)."""
    settings = variant_settings(variant)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / f"{variant}-{cache_key(describe(settings, seed))}"


def ensure_model(
    variant: str = "default",
    seed: int = 0,
    *,
    cache_dir: Path | str | None = None,
    progress: bool = True,
    threads: int | None = None,
) -> Path:
    """The directory of the tiny code model ``variant`` built with ``seed``, building it if needed.

    ``variant``: ``"default"`` (the model ``python launch.py`` uses), ``"test"`` (small, quick) or a study variant.
    ``cache_dir``: overrides the cache root (default ``$XDG_CACHE_HOME/populora/tiny-coder``); given, the cache is
    used even where a shipped model applies (builds and their tests).
    ``threads``: torch threads for training (default: the cores this process may use).
    Without ``cache_dir`` a shipped model whose key matches is returned (``tinycoder.shipped``; a damaged one raises
    ``ShippedModelError``). A missing model is built by ``python -m tinycoder --here`` in a child process
    (``BUILD_ENV``); concurrent callers wait for one build and share it.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    target = model_dir(variant, seed, cache_dir)
    if cache_dir is None:
        shipped, why_not = shipped_model(variant, seed)
        if shipped is not None:
            return shipped
        if why_not and progress and not (target / MANIFEST).is_file():
            print(f"[tiny-coder] {why_not}", file=sys.stderr, flush=True)
    if (target / MANIFEST).is_file():
        return target
    command = [sys.executable, "-m", "tinycoder", "--here", "--variant", variant, "--seed", str(seed),
               "--cache-dir", str(target.parent)]
    command += ["--threads", str(threads)] if threads is not None else []
    command += [] if progress else ["--quiet"]
    project = str(Path(__file__).resolve().parent.parent)
    env = {**BUILD_ENV, **os.environ}  # a policy the user set wins
    env["PYTHONPATH"] = os.pathsep.join(p for p in (project, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True)
    if done.returncode != 0 or not (target / MANIFEST).is_file():
        detail = (done.stderr or "").strip()[-3000:] if not progress else "(its output is above)"
        raise RuntimeError(f"building the tiny-coder {variant!r} model failed (exit {done.returncode}): {detail}")
    return target


def build_here(
    variant: str = "default", seed: int = 0, *, cache_dir: Path | str | None = None, progress: bool = True, threads: int | None = None
) -> Path:
    """``ensure_model`` in this process (what its child runs): build under the cache lock unless built, resuming
    from the progress an interrupted build saved beside the cache entry (``tinycoder.build.build_cached``)."""
    from tinycoder.build import build_cached  # torch and transformers: only where a model is built

    target = model_dir(variant, seed, cache_dir)
    settings = variant_settings(variant)
    # a continuation starts from its variant's finished model: the cached one, else the shipped copy where it
    # applies, else one built here first
    start = None
    if settings.continues is not None:
        parent = model_dir(settings.continues, seed, target.parent)
        shipped = None if (parent / MANIFEST).is_file() else shipped_model(settings.continues, seed)[0]
        start = shipped or build_here(settings.continues, seed, cache_dir=target.parent, progress=progress, threads=threads)
    announce = f"building the tiny {variant!r} model (one time, cached in {target})"
    return build_cached(settings, seed, target, progress=progress, threads=threads, announce=announce, start_from=start)
