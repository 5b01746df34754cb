"""The tiny models shipped with the code (``tinycoder.shipped``): their key is the key this code builds, their files
match their checksums, a damaged or stale copy is never used silently, and an installed package finds them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tinycoder import ShippedModelError, ensure_model
from tinycoder.settings import describe, variant_settings
from tinycoder.cache import cache_key
from tinycoder.shipped import SHIPPED_ROOT, key_without_precision, portable_key, read_ship_manifest, shipped_model

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("default", "test", "stronger-large-plus")


@pytest.mark.parametrize("variant", SHIPPED)
def test_the_shipped_model_is_what_this_code_builds(variant):
    manifest = read_ship_manifest(variant)
    assert manifest is not None, f"tinycoder/models/{variant} is missing: python -m tinycoder build --variant {variant} --ship"
    assert manifest["key"] == portable_key(variant), (
        f"the generator, the {variant!r} build settings or the prompt formats changed since tinycoder/models/{variant} "
        f"was built: rebuild and re-ship it with python -m tinycoder build --variant {variant} --ship")
    path, why_not = shipped_model(variant)  # every checksum verified
    assert path == SHIPPED_ROOT / variant and why_not is None
    assert ensure_model(variant, progress=False) == path


def test_the_portable_key_leaves_out_only_the_precision():
    settings = variant_settings("default")
    fp32 = replace(settings, train=replace(settings.train, precision="fp32"))
    bf16 = replace(settings, train=replace(settings.train, precision="bf16"))
    assert cache_key(describe(fp32, 0)) != cache_key(describe(bf16, 0))  # the cache keeps the two builds apart
    assert key_without_precision(fp32, 0) == key_without_precision(bf16, 0)  # one shipped build serves both
    longer = replace(settings, train=replace(settings.train, steps=settings.train.steps + 1))
    assert key_without_precision(longer, 0) != key_without_precision(fp32, 0)
    assert portable_key("default") != portable_key("test") and portable_key("default") != portable_key("default", seed=1)


def test_sizes_stay_under_the_limit():
    total = sum(p.stat().st_size for p in SHIPPED_ROOT.rglob("*") if p.is_file())
    assert total < 24_000_000, f"the shipped models take {total} bytes, over 24 MB"


@pytest.fixture
def shipped_copy(tmp_path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(SHIPPED_ROOT / "test", root / "test")
    return root


def test_a_damaged_or_missing_file_is_an_error_naming_it(shipped_copy):
    tokenizer = shipped_copy / "test" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace("<|endoftext|>", "<|endoftexx|>", 1))
    with pytest.raises(ShippedModelError, match=r"tokenizer\.json has sha256 .* python -m tinycoder build --variant test --ship"):
        shipped_model("test", root=shipped_copy)
    (shipped_copy / "test" / "model.safetensors").unlink()
    with pytest.raises(ShippedModelError, match=r"lacks .*model\.safetensors"):
        shipped_model("test", root=shipped_copy)


def test_a_stale_shipped_model_does_not_apply_and_says_why(shipped_copy):
    manifest_path = shipped_copy / "test" / "shipped.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "key": "0000000000000000"}))
    path, why_not = shipped_model("test", root=shipped_copy)
    assert path is None and "other code than this" in why_not and "--variant test --ship" in why_not
    assert shipped_model("test", seed=3, root=shipped_copy)[0] is None
    assert shipped_model("stronger", root=shipped_copy) == (None, None)  # nothing of it ships: built on demand


def test_an_installed_read_only_package_uses_its_shipped_model_in_place(tmp_path):
    wheel_dir, target, source = tmp_path / "wheel", tmp_path / "site", tmp_path / "source"
    # a copy of the sources: building in place would leave setuptools' build/ in the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "runs", "bench", "*.egg-info",
                                                                 "__pycache__", ".pytest_cache", "gpu_deps"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheel_dir), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(wheel_dir.glob("*.whl"))
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    for p in target.rglob("*"):
        p.chmod(p.stat().st_mode & ~0o222)
    before = sorted(str(p) for p in target.rglob("*"))
    env = {**os.environ, "PYTHONPATH": str(target), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    found = subprocess.run([sys.executable, "-c", "from tinycoder import ensure_model; print(ensure_model('test'))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    assert Path(found.stdout.strip()) == target / "tinycoder" / "models" / "test"
    assert sorted(str(p) for p in target.rglob("*")) == before and not (tmp_path / "cache").exists()


def test_a_variant_shipped_in_bf16_keeps_its_weights_rounded_and_loads_as_float32(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tinycoder import shipped

    monkeypatch.setitem(shipped.STORAGE, "test", "bf16")
    root = tmp_path / "models"
    target = shipped.ship("test", SHIPPED_ROOT / "test", "this machine", "a test", root=root)
    assert read_ship_manifest("test", root)["storage"] == "bf16"
    before, after = load_file(SHIPPED_ROOT / "test" / "model.safetensors"), load_file(target / "model.safetensors")
    assert before.keys() == after.keys() and all(t.dtype == torch.bfloat16 for t in after.values())
    assert all(torch.equal(after[k], v.to(torch.bfloat16)) for k, v in before.items())
    assert (target / "model.safetensors").stat().st_size < 0.55 * (SHIPPED_ROOT / "test" / "model.safetensors").stat().st_size
    assert shipped_model("test", root=root) == (target, None)  # its checksums are the stored files'
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    weights = dict(model.named_parameters())
    name = next(k for k in before if k in weights)
    assert weights[name].dtype == torch.float32 and torch.equal(weights[name].data, before[name].to(torch.bfloat16).float())


@pytest.mark.parametrize("variant", SHIPPED)
def test_a_shipped_manifest_names_no_path_of_the_machine_that_built_it(variant):
    """A continuation's manifest once recorded its parent's cache directory; shipped text names no local path."""
    from tinycoder.cache import cache_root

    local = (str(cache_root()), str(Path.home()), str(ROOT))
    for name in ("tinycoder.json", "shipped.json", "config.json"):
        text = (SHIPPED_ROOT / variant / name).read_text()
        assert not any(path in text for path in local), f"tinycoder/models/{variant}/{name} names a local path"
