"""The model cache: keyed directories, one build under concurrency, nothing half-written on failure."""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tinycoder import model_dir
from tinycoder.settings import VARIANTS, describe
from tinycoder.cache import MANIFEST, build_once, cache_key, cache_root


def _slow_build(log: str, delay: float):
    def build(tmp: Path) -> None:
        with open(log, "a") as fh:
            fh.write("build\n")
        time.sleep(delay)
        (tmp / "weights").write_text("w")
        (tmp / MANIFEST).write_text("{}")

    return build


def _worker(root: str, log: str, out: str) -> None:
    path = build_once(Path(root), "m-key", _slow_build(log, 1.0))
    Path(out).write_text(str(path))


def test_builds_once_and_reuses(tmp_path):
    log = tmp_path / "log"
    first = build_once(tmp_path / "root", "m-key", _slow_build(str(log), 0.0))
    second = build_once(tmp_path / "root", "m-key", _slow_build(str(log), 0.0))
    assert first == second == tmp_path / "root" / "m-key"
    assert (first / "weights").read_text() == "w"
    assert log.read_text().count("build") == 1
    assert not [p for p in (tmp_path / "root").iterdir() if ".building-" in p.name]


def test_two_processes_share_one_build(tmp_path):
    log, root = tmp_path / "log", tmp_path / "root"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(str(root), str(log), str(tmp_path / f"out{i}"))) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert log.read_text().count("build") == 1
    assert (tmp_path / "out0").read_text() == (tmp_path / "out1").read_text() == str(root / "m-key")


def test_a_failed_build_leaves_nothing_and_can_be_retried(tmp_path):
    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_once(tmp_path, "m-key", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-key.lock"]
    with pytest.raises(RuntimeError, match="without writing"):
        build_once(tmp_path, "m-key", lambda tmp: (tmp / "weights").write_text("w"))
    assert build_once(tmp_path, "m-key", _slow_build(str(tmp_path / "log"), 0.0)).is_dir()


def test_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "populora" / "tiny-coder"
    assert model_dir("test", 0).parent == tmp_path / "populora" / "tiny-coder"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "populora" / "tiny-coder"


def test_key_depends_on_settings_seed_and_version(monkeypatch):
    test = VARIANTS["test"]
    base = cache_key(describe(test, 0))
    assert base == cache_key(describe(test, 0))
    assert base != cache_key(describe(test, 1))
    assert base != cache_key(describe(replace(test, vocab_size=test.vocab_size + 1), 0))
    assert base != cache_key(describe(VARIANTS["default"], 0))
    monkeypatch.setattr("tinycoder.settings.GENERATOR_VERSION", -1)
    assert base != cache_key(describe(test, 0))


def test_unknown_variant_and_bad_seed_are_clear_errors(tmp_path):
    from tinycoder import ensure_model

    with pytest.raises(ValueError, match="unknown tiny-coder variant 'huge'"):
        ensure_model("huge", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="seed"):
        ensure_model("test", seed=-1, cache_dir=tmp_path)


def test_the_config_schema_names_every_variant():
    """``model.tiny_variant`` is validated before torch is imported, so the schema lists the variants itself."""
    from typing import get_args

    from configs.schema import ModelConfig

    assert set(get_args(ModelConfig.model_fields["tiny_variant"].annotation)) == set(VARIANTS)


def test_a_killed_builds_temporary_directory_and_named_leftovers_go_under_the_lock(tmp_path):
    """A build killed outright (SIGKILL) leaves its ``.<name>.building-*`` directory; the next build removes it, and
    the ``leftovers`` (a build's saved progress) once the model is in place, also when it was there already."""
    stale = tmp_path / ".m-key.building-abc123"
    (stale / "sub").mkdir(parents=True)
    other = tmp_path / ".m-other.building-abc123"  # another entry's: not this lock's to remove
    other.mkdir()
    progress = tmp_path / "m-key.progress"
    progress.mkdir()
    build_once(tmp_path, "m-key", _slow_build(str(tmp_path / "log"), 0.0), leftovers=(progress,))
    assert not stale.exists() and not progress.exists() and other.exists()
    progress.mkdir()  # left by a kill between the rename and the removal
    assert build_once(tmp_path, "m-key", _slow_build(str(tmp_path / "log"), 0.0), leftovers=(progress,)).is_dir()
    assert not progress.exists() and (tmp_path / "log").read_text().count("build") == 1
