"""The tiny models shipped with the code: ``tinycoder/models/<variant>/``, one build each of seed 0.

A shipped directory holds what a build writes (weights, config, tokenizer, seed tasks, the build manifest
``tinycoder.json``) and ``shipped.json``: the variant, its **portable key**, the precision it was built in, the
machine and command that built it, and the sha256 of every file. The portable key is the cache key
(``tinycoder.cache.cache_key`` of ``tinycoder.settings.describe``: generator version, build settings, seed, prompt-format
fingerprint) without the resolved training precision, so the one float32 build serves every CPU kind; a cached build
keeps its precision-bearing key.

:func:`shipped_model` gives the shipped directory when its portable key equals the one this code would build; when it
does not, it says why in one line and the caller builds into the cache as before. A file missing or whose checksum
differs from ``shipped.json`` is a :class:`ShippedModelError` naming the file (a damaged checkout is never rebuilt
silently). The directory is only read, so an installed, read-only package uses it in place.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tinycoder.settings import ADDED_MIX_SETTINGS, BuildSettings, continued_settings, describe, variant_settings
from tinycoder.cache import MANIFEST, cache_key

SHIPPED_ROOT = Path(__file__).resolve().parent / "models"
SHIP_MANIFEST = "shipped.json"
WEIGHTS = "model.safetensors"
SHIPPED_SEED = 0
REBUILD = "python -m tinycoder build --variant {variant} --ship"
STORAGE = {"stronger-large": "bf16", "stronger-long": "bf16", "stronger-large-plus": "bf16"}
"""How a variant's weights are stored when shipped (float32 unless named): the study variant of the paper's regime may grow the
shipped weights only in bf16. The config keeps ``dtype: float32``, so loaders upcast on load and compute as before;
the gates of such a model are measured from the stored weights (docs/tinycoder.md)."""


class ShippedModelError(RuntimeError):
    """A shipped model file is missing or differs from its recorded checksum."""


def key_without_precision(settings: BuildSettings, seed: int) -> str:
    """The cache key of ``settings`` built with ``seed``, less the training precision (module docstring)."""
    described = describe(settings, seed)
    described["settings"]["train"].pop("precision", None)
    parent = continued_settings(settings)
    if parent is not None:  # the model it continues, less its precision too
        described["settings"]["continues"]["key"] = key_without_precision(parent, seed)
    return cache_key(described)


def portable_key(variant: str, seed: int = SHIPPED_SEED) -> str:
    """:func:`key_without_precision` of the named variant."""
    return key_without_precision(variant_settings(variant), seed)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_ship_manifest(variant: str, root: Path = SHIPPED_ROOT) -> dict[str, Any] | None:
    path = root / variant / SHIP_MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def verify(directory: Path, manifest: dict[str, Any]) -> None:
    """Raise :class:`ShippedModelError` naming the first file missing or unequal to its recorded sha256."""
    how = f"restore it from git (git checkout -- {directory}) or rebuild with {REBUILD.format(variant=manifest['variant'])}"
    for name, expected in sorted(manifest["files"].items()):
        path = directory / name
        if not path.is_file():
            raise ShippedModelError(f"the shipped tiny {manifest['variant']!r} model lacks {path}: {how}")
        got = sha256_of(path)
        if got != expected:
            raise ShippedModelError(f"the shipped tiny {manifest['variant']!r} model file {path} has sha256 {got[:16]}..., "
                                    f"shipped.json records {expected[:16]}...: {how}")


def shipped_model(variant: str, seed: int = SHIPPED_SEED, root: Path = SHIPPED_ROOT) -> tuple[Path | None, str | None]:
    """(the shipped directory of ``variant``, None) when it applies; else (None, why not: None when nothing of this
    variant ships). Raises :class:`ShippedModelError` for a damaged shipped model whose key applies."""
    manifest = read_ship_manifest(variant, root)
    if manifest is None:
        return None, None
    if seed != SHIPPED_SEED:
        return None, f"the shipped tiny {variant!r} model is seed {SHIPPED_SEED}'s, not seed {seed}'s"
    want = portable_key(variant, seed)
    if manifest["key"] != want:
        return None, (f"the shipped tiny {variant!r} model (key {manifest['key']}) was built by other code than this "
                      f"(key {want}: the generator, its settings or the prompt formats changed); building it into the "
                      f"cache instead. Re-ship with {REBUILD.format(variant=variant)}")
    verify(root / variant, manifest)
    return root / variant, None


def ship(variant: str, built: Path, machine: str, command: str, root: Path = SHIPPED_ROOT) -> Path:
    """Copy the build in ``built`` (a complete model directory of ``variant``, seed 0) to ``root/variant`` with its
    ``shipped.json``; returns that directory. The build's own manifest must be of this code's settings."""
    build_manifest = json.loads((built / MANIFEST).read_text())
    settings = variant_settings(variant)
    if build_manifest.get("seed") != SHIPPED_SEED:
        raise ValueError(f"only seed {SHIPPED_SEED} ships, {built} is seed {build_manifest.get('seed')}")
    recorded = {"continues": None, **build_manifest["settings"]}  # builds before `continues` existed did not record it
    recorded["train"] = {k: v for k, v in recorded["train"].items() if k != "precision"}
    recorded["mix"] = {**ADDED_MIX_SETTINGS, **recorded["mix"]}  # nor the mix settings added since
    expected = asdict(settings)
    expected["train"] = {k: v for k, v in expected["train"].items() if k != "precision"}
    if json.dumps(recorded, sort_keys=True, default=str) != json.dumps(expected, sort_keys=True, default=str):
        raise ValueError(f"{built} was built with other settings than this code's {variant!r} variant")
    target = root / variant
    staging = root / f".{variant}.shipping"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    files = sorted(p.name for p in built.iterdir() if p.is_file() and not p.name.startswith(".") and p.name != SHIP_MANIFEST)
    storage = STORAGE.get(variant, "fp32")
    for name in files:
        if name == WEIGHTS and storage == "bf16":
            import torch
            from safetensors.torch import load_file, save_file

            save_file({k: v.to(torch.bfloat16) for k, v in load_file(built / name).items()}, staging / name,
                      metadata={"format": "pt"})
        else:
            shutil.copyfile(built / name, staging / name)
    manifest = {
        "variant": variant, "seed": SHIPPED_SEED, "key": portable_key(variant), "generator_version": build_manifest["generator_version"],
        "precision": build_manifest["settings"]["train"].get("precision", "fp32"), "storage": storage, "machine": machine, "command": command,
        "build_s": build_manifest.get("build_s"), "files": {name: sha256_of(staging / name) for name in files},
    }
    (staging / SHIP_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
