"""``gpu_check/check.py``'s ``system`` part (``gpu_check/system.py``) on CPU, in the stand-in mode: Ray hands the
one-GPU colocated layout a logical GPU and the actors run their CPU path.

In CI: the reference part (a) and the phase table (d) end to end on the tiny test model (the actors report their
devices from inside their processes; the learners map one base file; the engine gets new adapter versions every
step), the refusals (Ray blocked in gpu_check's process: the part is not run, one line names it and
gpu_check/pack_deps.sh; a GPU too small: the memory plan's verdict naming the GPU and the bytes short, nothing
started), and the judging pieces on made-up reports. The whole part with the kill (b) and the resume (c) takes 2 to 5
minutes on two cores (five systems started): ``POPULORA_GPU_SYSTEM_FULL=1`` runs it here too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["tasks.tasks_per_teacher=3", "tasks.rollouts_k=2", "inference.max_tokens=96", "evolution.enabled=false",
         "verifier.actors=1"]


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def run_script(*args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, int]:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


@pytest.mark.slow
def test_the_reference_part_runs_through_ray_and_reads_devices_inside_the_actors():
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    done, pid = run_script("-m", "gpu_check.system", "--standin", "--parts", "a,d", "--steps", "3",
                           "--checkpoint-every", "3", *SHORT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = last_json(done.stdout)
    assert result["status"] == "ok" and result["passed"] is True, result.get("checks")
    assert set(result["checks"]) == {"reference_ran", "on_device", "one_base", "handover"}
    assert result["device"]["expected_tensor_device"] == "cpu" and "stand-in" in result["device"]["why"]
    devices = result["devices"]
    assert set(devices) == {"inference", "learner-teacher", "learner-student"}
    pids = {report["pid"] for report in devices.values()}
    assert len(pids) == 3 and pid not in pids  # asked inside three actor processes, not this one's or the script's
    for report in devices.values():
        assert report["devices"] == ["cpu"] and report["gpu_ids"] == ["0"]  # Ray gave each the logical GPU
    base = result["one_base"]
    assert base["passed"] and base["in_shared_file"] == {"learner-teacher": True, "learner-student": True}
    assert all(span <= base["base_bytes"] for span in base["base_span"].values())
    versions = result["handover"]["versions_after_step"]
    assert list(versions) == ["1", "2"] and versions["1"] != versions["2"]
    assert result["sandbox"]["verifiers"].startswith(("ran in the full sandbox", "ran with verifier.allow_weak_sandbox"))
    phases = result["phases"]
    assert phases["planned_for"].startswith("cpu") and phases["step_s"]["measured"] > 0
    assert {"propose", "solve", "train", "handover", "checkpoint"} <= set(phases["phases"])
    assert all(t["planned_s"] is not None for name, t in phases["phases"].items() if name in ("propose", "train"))
    assert "[gpu_system]   propose" in done.stderr  # (d) printed


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("POPULORA_GPU_SYSTEM_FULL"), reason="2 to 5 minutes on two cores (five "
                    "systems started); POPULORA_GPU_SYSTEM_FULL=1 runs it")
def test_the_whole_system_part_on_the_standin_gpu():
    done, _ = run_script("-m", "gpu_check.system", "--standin", *SHORT, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    result = last_json(done.stdout)
    assert result["passed"] and all(result["checks"].values()), result["checks"]
    assert result["kill"]["compare"]["equal"] == result["resume"]["compare"]["equal"] == "bitwise"
    assert [r["actors"] for r in result["kill"]["recoveries"]] == [["learner-student"]]
    assert result["kill"]["recoveries"][0]["restored_step"] == 2
    assert all(r["devices"] == ["cpu"] for r in result["kill"]["devices_after_recovery"].values())


def test_without_ray_the_part_is_not_run_and_names_the_script_that_provides_it(tmp_path):
    blocked = ("import runpy, sys; sys.modules['ray'] = None; sys.argv = sys.argv[1:]; "
               "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
    done, _ = run_script("-c", blocked, "gpu_check", "--parts", "system", "--standin",
                         "--out", str(tmp_path / "gpu_check.json"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = last_json(done.stdout)
    part = report["parts"]["system"]
    assert part["status"] == "not_run" and "passed" not in part and report["ok"] is False
    assert "needs ray," in part["reason"] and "gpu_check/pack_deps.sh" in part["reason"]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ray" in lines[0] and "gpu_check/pack_deps.sh" in lines[0], done.stderr
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report


def test_a_gpu_too_small_is_the_memory_plans_verdict_before_anything_starts(tiny_qwen2, monkeypatch, capsys):
    import ray

    from gpu_check import check as gpu_check, system as gpu_system
    for name in ("POPULORA_GPU_STANDIN", "POPULORA_DETERMINISTIC", "CUBLAS_WORKSPACE_CONFIG", "POPULORA_LOG_DIR"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # restored after the test: main sets them
    code = gpu_system.main(["--standin", "--model-dir", str(tiny_qwen2), "--gpu-memory-gib", "0.05"])
    out, err = capsys.readouterr()
    assert code == 2 and not ray.is_initialized()
    result = last_json(out)
    assert result["status"] == "failed" and result["memory_plan"]["fits"] is False
    reason = result["reason"]
    assert reason.startswith("the layout does not fit stand-in logical GPU") and "0.05 GiB, --gpu-memory-gib" in reason
    assert "GPU 0 generating needs" in reason and "short" in reason
    assert err.strip() == f"gpu_system: {reason}" and "Traceback" not in err
    part = {"status": "failed", "result": result}
    assert gpu_check.judge("system", part)["passed"] is False


def test_the_judges_fail_what_they_should(tmp_path):
    from gpu_check import check as gpu_check, system as gpu_system
    import torch
    from safetensors.torch import save

    # devices read inside the actors: one tensor elsewhere, or an actor that did not answer, fails
    good = {"inference": {"devices": ["cuda:0"]}, "learner-teacher": {"devices": ["cuda:0"]}}
    assert gpu_system.on_device(good, "cuda") == (True, [])
    assert not gpu_system.on_device({**good, "learner-student": {"devices": ["cpu", "cuda:0"]}}, "cuda")[0]
    assert not gpu_system.on_device({**good, "learner-student": {"error": "RayActorError"}}, "cuda")[0]
    assert not gpu_system.on_device({}, "cpu")[0]

    # one base: the second learner (the IPC mapping) may add at most a tenth of the base beyond its own LoRA slots
    def learner(held: str, after_base: int, after: int) -> dict:
        return {"base_bytes": 1000, "base_span": 1000, "base_held": held, "in_shared_file": None,
                "allocated_after_base": after_base, "allocated_after_construction": after, "own_bytes": 300}

    owner = learner("its own CUDA copy, shared by IPC", 1000, 1300)
    shared = {"learner-teacher": owner, "learner-student": learner("a CUDA IPC mapping of another learner's copy", 0, 350)}
    verdict = gpu_system.one_base(shared, ["learner-teacher", "learner-student"], on_cuda=True)
    assert verdict["passed"] and verdict["extra_bytes"] == 50 and verdict["second_learner"] == "learner-student"
    copied = {**shared, "learner-student": learner("a CUDA IPC mapping of another learner's copy", 0, 1400)}
    assert not gpu_system.one_base(copied, ["learner-teacher", "learner-student"], on_cuda=True)["passed"]
    scattered = {**shared, "learner-student": {**shared["learner-student"], "base_span": 2000}}
    assert not gpu_system.one_base(scattered, ["learner-teacher", "learner-student"], on_cuda=True)["passed"]
    private = {name: {**r, "in_shared_file": name == "learner-teacher"} for name, r in shared.items()}
    assert not gpu_system.one_base(private, ["learner-teacher", "learner-student"], on_cuda=False)["passed"]

    # adapters handed over: a step that left the engine's versions as they were fails
    moving = {1: {"t0": 1, "s0": 1}, 2: {"t0": 2, "s0": 1}}
    assert gpu_system.handed_over(moving, 2)["passed"]
    assert not gpu_system.handed_over({**moving, 3: moving[2]}, 2)["passed"]
    assert not gpu_system.handed_over({1: moving[1]}, 2)["passed"]

    # equality: bitwise; a tiny difference passes only where an op without a deterministic kernel ran
    def state(value: float) -> tuple:
        adapter = save({"w": torch.tensor([1.0, value])})
        return {"ratings": {"t0": 25.0}}, {"0/adapters/t0/adapter_model.safetensors": adapter}, [{"step": 1, "x": 0.5}]

    assert gpu_system.compare(state(2.0), state(2.0), False) == {"equal": "bitwise", "passed": True}
    near = gpu_system.compare(state(2.0), state(2.0 + 1e-6), tolerance_allowed=False)
    assert near["equal"] == "within_tolerance" and not near["passed"] and "why_not_accepted" in near
    assert gpu_system.compare(state(2.0), state(2.0 + 1e-6), tolerance_allowed=True)["passed"]
    far = gpu_system.compare(state(2.0), state(3.0), tolerance_allowed=True)
    assert far["equal"] == "different" and not far["passed"] and far["max_difference"]["adapters"] == 1.0
    reordered = ({"ratings": {"t1": 25.0}}, *state(2.0)[1:])
    assert gpu_system.compare(state(2.0), reordered, True)["first_structural_difference"] == "league/ratings/{t0, t1}"

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "learner-student.log").write_text("UserWarning: scatter_add_cuda_kernel does not have a deterministic "
                                              "implementation, but you set 'torch.use_deterministic_algorithms(True, "
                                              "warn_only=True)'\n")
    assert gpu_system.nondeterministic_ops(logs) == ["scatter_add_cuda_kernel"]

    # gpu_check passes the part only when the script passed every one of its checks
    result = {"passed": True, "checks": {"on_device": True, "kill_equal": True}}
    assert gpu_check.judge("system", {"status": "ok", "result": result})["passed"]
    assert not gpu_check.judge("system", {"status": "ok", "result": {**result, "checks": {"on_device": False}}})["passed"]
    assert not gpu_check.judge("system", {"status": "failed", "result": result})["passed"]
    assert not gpu_check.judge("system", {"status": "not_run"})["passed"]


def test_the_vllm_part_says_why_it_did_not_run_and_leaves_ok_alone(tmp_path):
    """Here vLLM is absent or the CPU build, so the CUDA part reports not_run with the reason (exit 3); gpu_check
    judges it not passed and leaves it out of ``ok``, and passes it only when every check ran and passed."""
    from gpu_check import check as gpu_check
    from gpu_check.vllm_check import why_not_run

    reason = why_not_run("cuda")
    if reason is None:
        pytest.skip("CUDA vLLM is here: the part runs (python -m gpu_check --parts vllm)")
    done, _ = run_script("-m", "gpu_check.vllm_check", timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert last_json(done.stdout) == {"status": "not_run", "reason": reason}
    assert done.stderr.strip().splitlines()[-1] == f"gpu_check.vllm_check: not run: {reason}"
    result = {"passed": True, "checks": {"hot_swap": {"passed": True}}}
    assert gpu_check.judge("vllm", {"status": "ok", "result": result})["passed"]
    assert not gpu_check.judge("vllm", {"status": "ok", "result": {**result, "passed": False}})["passed"]
    assert not gpu_check.judge("vllm", {"status": "not_run", "result": {"status": "not_run"}})["passed"]
