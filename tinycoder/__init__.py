"""The embedded default model: a tiny Qwen2 code model the project bootstraps on CPU and caches.

    from tinycoder import ensure_model
    path = ensure_model()                 # builds once (~10 min on two cores), then reuses the cache
    path = ensure_model("test")           # small and quick, for tests

The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` (and vLLM, PEFT). No ray here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tinycoder.build import VARIANTS, BuildSettings, build_model, describe, variant_settings
from tinycoder.cache import MANIFEST, build_once, cache_key, cache_root

__all__ = ["VARIANTS", "BuildSettings", "ensure_model", "model_dir"]


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

    ``variant``: ``"default"`` (the model ``python launch.py`` uses) or ``"test"`` (small, quick).
    ``cache_dir``: overrides the cache root (default ``$XDG_CACHE_HOME/populora/tiny-coder``).
    ``threads``: torch threads for training (default: the cores this process may use).
    Concurrent callers wait for one build and share it.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    settings = variant_settings(variant)
    target = model_dir(variant, seed, cache_dir)
    if not (target / MANIFEST).is_file() and progress:
        print(f"[tiny-coder] building the {variant!r} model (once; cached in {target})", file=sys.stderr, flush=True)
    return build_once(target.parent, target.name, lambda tmp: build_model(settings, seed, tmp, progress=progress, threads=threads))
