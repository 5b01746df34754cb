"""The system on a real local Ray cluster: an end-to-end run, named actors, resume, job submit, placement,
a verifier killed mid-batch, and the report on a real run.

All runs use the tiny test model (built once per machine and cached) and a short configuration. Every
Ray cluster here binds loopback only (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, set in conftest).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from private_heads import start_head, stop_processes_under
from short_runs import ROOT, SHORT, launch, launch_env

from reporting.run_dir import RunDirectory


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from tinycoder import ensure_model

    return ensure_model("test", progress=False)


def metrics(run_dir: Path) -> list[dict]:
    return RunDirectory(run_dir).read_metrics()


def test_learning_off_is_a_control_in_which_no_adapter_changes(tiny_model, tmp_path):
    """rl.train=false (with evolution off): the loop samples, validates, judges and fills the buffers, and no
    adapter changes; nothing is handed over."""
    from safetensors.torch import load_file

    run_dir = tmp_path / "control"
    done = launch("--run-dir", str(run_dir), "--steps", "2", "--quiet", *SHORT, "rl.train=false", "evolution.enabled=false")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["train"] for r in rows] == [{}, {}] and "handover" not in rows[0]["phase_seconds"]
    assert rows[0]["valid_rate"] > 0
    steps = [sorted((run_dir / "checkpoints" / f"step-{s}" / "learners").rglob("adapter_model.safetensors")) for s in (1, 2)]
    assert steps[0] and len(steps[0]) == len(steps[1])
    for a, b in zip(*steps):
        ta, tb = load_file(a), load_file(b)
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert RunDirectory(run_dir).read_side("proposals")  # the records are kept in the control too


@pytest.mark.slow
def test_the_dynamics_preset_runs_four_by_four_with_a_family_a_teacher_and_step(tiny_model, tmp_path):
    """configs/tiny-dynamics.yaml through launch.py (the paper's regime): 4 teachers + 4 students, each teacher's 6 tasks of a
    step one family, families[(step + position) % 3], and an evolution step that replaces one member per role by a
    child of the others; with league.matching=cover_students every student plays every step."""
    run_dir = tmp_path / "dynamics"
    done = launch("--config", "configs/tiny-dynamics.yaml", "--run-dir", str(run_dir), "--steps", "2", "--quiet",
                  "model.tiny_variant=test", "tasks.rollouts_k=2", "inference.max_tokens=96", "evolution.period=1",
                  "run.checkpoint_every=2", "verifier.actors=1", "run.dashboard=false", "league.matching=cover_students")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["idle_student_share"] for r in rows] == [0.0, 0.0]
    assert all(len({s for _, s in r["matches"]}) == 4 for r in rows)  # four teachers, four distinct students
    teachers = ["t0", "t1", "t2", "t3"]  # the founders, who play step 1 (step 1's row lists the league after its child)
    assert sorted({p["member"] for p in RunDirectory(run_dir).read_side("proposals") if p["step"] == 1}) == teachers
    assert sum(m["role"] == "student" for m in rows[0]["members"]) == 4
    families = ["code_o", "code_i", "code_f"]
    proposals = RunDirectory(run_dir).read_side("proposals")
    step_teachers = {1: teachers, 2: [m["id"] for m in rows[1]["members"] if m["role"] == "teacher"]}  # after step 1's child
    for step in (1, 2):
        for position, teacher in enumerate(step_teachers[step]):  # the step's pairs list the teachers in the league's order
            mine = [p["family"] for p in proposals if p["step"] == step and p["member"] == teacher]
            assert mine == [families[(step + position) % 3]] * 6
    events = rows[0]["evolution"]  # due every step (period 1), never at the last step
    assert sorted(e["role"] for e in events) == ["student", "teacher"] and rows[1]["evolution"] == []
    for event in events:
        assert event["replaced"] not in event["parents"] and event["child"] in {m["id"] for m in rows[0]["members"]}
    assert sum(m["role"] == "teacher" for m in rows[1]["members"]) == 4


@pytest.mark.slow
def test_end_to_end_run_then_resume(short_run, short_run_resumed, tmp_path):
    first, run_dir = short_run, short_run.run_dir  # launch.py --steps 2 with SHORT_RUN (conftest)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    keys = {"step", "members", "valid_rate", "solve_rate", "teacher_reward", "student_reward", "program_ast_depth",
            "program_cyclomatic", "program_loc", "program_variables", "coverage", "phase_seconds", "evolution",
            "written_programs", "buffer_programs", "buffer_seed_share", "buffer_program_loc", "rho_by_teacher"}
    assert keys <= set(rows[0])
    assert rows[0]["buffer_programs"] > 0 and rows[0]["buffer_seed_share"] == 1.0  # step 1 draws only seed tasks
    for row in rows:  # every member's mean token entropy and update norm, every step (rl.log_entropy)
        assert row["train"] and all(stats["entropy"] > 0 for stats in row["train"].values())
        for member, stats in row["train"].items():  # a zero gradient (every reward of a group equal) moves nothing
            assert row[f"update_norm/{member}"] == stats["update_norm"] and (stats["update_norm"] > 0) == (stats["grad_norm"] > 0)
    assert not any("kl_to_base" in stats for stats in rows[0]["train"].values())  # the readout every 2 steps
    assert all(stats["kl_to_base"] == rows[1][f"kl_to_base/{m}"] >= 0 and stats["kl_to_base_tokens"] > 0
               for m, stats in rows[1]["train"].items())
    assert rows[0]["idle_student_share"] in (0.0, 0.5) and "| idle " in first.stdout
    proposals = RunDirectory(run_dir).read_side("proposals")  # one record per proposal, with its advantage
    assert len([p for p in proposals if p["step"] == 1]) == 3 * sum(m["role"] == "teacher" for m in rows[0]["members"])
    assert all(p["advantage"] is not None or p["completion_tokens"] == 0 for p in proposals)
    assert set(rows[1]["rho_by_teacher"]) == {m["id"] for m in rows[1]["members"] if m["role"] == "teacher"}  # no child
    assert set(rows[0]["phase_seconds"]) == {"match", "propose", "validate", "solve", "judge", "train", "handover", "record",
                                             "evolve"}
    tokens = rows[0]["tokens"]  # what the time plan's --from-run reads
    assert tokens["teacher"]["sequences"] > 0 and tokens["teacher"]["prompt"] > tokens["teacher"]["sequences"]
    assert tokens["student"]["completion"] >= 0
    saved = RunDirectory(run_dir).read_events("checkpoint")
    assert [e["checkpoint_step"] for e in saved] == [1, 2] and all(e["seconds"] > 0 for e in saved)  # checkpoint_every=1
    assert {m["role"] for m in rows[0]["members"]} == {"teacher", "student"}
    assert rows[0]["evolution"], "evolution is due every step (SHORT_RUN: period 1)"
    assert rows[1]["evolution"] == [], "but never at the run's last step: that child would never train"
    event = rows[0]["evolution"][0]
    assert event["child"] in {m["id"] for m in rows[0]["members"]}
    assert any(m["parent"] for m in rows[1]["members"])
    assert "step    2/2" in first.stdout and "run finished" in first.stdout
    checkpoint = run_dir / "checkpoints" / "step-2"
    saved_league = json.loads((checkpoint / "league.json").read_text())
    assert list((checkpoint / "learners").rglob("adapter_model.safetensors"))
    for learner in (checkpoint / "learners").iterdir():  # teachers train at their own rate, students at tiny.yaml's
        members = json.loads((learner / "slots.json").read_text())["slots"]
        lrs = torch.load(learner / "optimizers.pt")["lrs"]
        expected = 3e-4 if {saved_league["roles"][m] for m in members} == {"teacher"} else 5e-4
        assert lrs == pytest.approx([expected] * len(lrs))
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))

    # Resuming from the step-1 checkpoint (taken after step 1's evolution) recomputes step 2 identically.
    replay_dir = tmp_path / "replay"
    shutil.copytree(run_dir, replay_dir)
    (replay_dir / "checkpoints" / "latest").write_text("step-1")
    # SIGTERM once its steps run (`ray job stop`, a scheduler's pre-emption): recorded as interrupted, resumable.
    stopped = subprocess.Popen([sys.executable, "launch.py", "--resume", str(replay_dir), "run.dashboard=false"], cwd=ROOT,
                               env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status_path = replay_dir / "status.json"
    while stopped.poll() is None and json.loads(status_path.read_text() or "{}").get("state") != "running":
        time.sleep(0.02)
    stopped.send_signal(signal.SIGTERM)
    _, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert f"terminated (SIGTERM); resume with: python launch.py --resume {replay_dir}" in err
    status = json.loads(status_path.read_text())
    assert (status["state"], status["last_step"], status["cause"]) == ("interrupted", 1, "stopped by SIGTERM")
    # Without --steps a resume finishes the run it resumes: to its planned last step (2), named in its first line.
    replay = launch("--resume", str(replay_dir), "run.dashboard=false")
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert "at step 2, ending at step 2" in replay.stdout
    assert [r["step"] for r in metrics(replay_dir)] == [1, 2]
    untimed = [{k: v for k, v in row.items() if k != "phase_seconds"} for row in (rows[1], metrics(replay_dir)[1])]
    assert untimed[0] == untimed[1]
    again = launch("--resume", str(replay_dir), "run.dashboard=false")  # nothing left to run: said, exit 0
    assert again.returncode == 0 and "already reached its planned last step 2" in again.stdout
    # Resumed to a later last step (4), the run evolves at its next due step, 3, which is no longer the last, and not at 4.
    further = launch("--resume", str(replay_dir), "--steps", "2", "--quiet", "run.dashboard=false")
    assert further.returncode == 0, further.stderr[-3000:]
    longer = metrics(replay_dir)
    assert [r["step"] for r in longer] == [1, 2, 3, 4] and longer[2]["evolution"] and longer[3]["evolution"] == []
    assert longer[2]["evolution"][0]["child"] in {m["id"] for m in longer[3]["members"]}

    second = short_run_resumed  # a copy of the run resumed from its latest checkpoint for one more step (--quiet)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "league state equal to the saved one" in (second.run_dir / "logs" / "driver.log").read_text()
    assert [r["step"] for r in metrics(second.run_dir)] == [1, 2, 3]
    resumed_rows = metrics(second.run_dir)
    assert resumed_rows[2]["evolution"] == []  # step 3 is its last
    resumed_members = {m["id"] for m in resumed_rows[2]["members"]}
    assert resumed_members == set(saved_league["roles"])  # the league continued from the saved state

    reported = tmp_path / "reported"
    shutil.copytree(second.run_dir, reported)
    report = subprocess.run([sys.executable, "-m", "reporting", str(reported)], cwd=ROOT, capture_output=True,
                            text=True, timeout=180)
    assert report.returncode == 0, report.stderr
    assert len(list((reported / "plots").glob("*.png"))) == 5


@pytest.mark.slow
def test_ray_job_submit_runs_a_short_job_with_token_auth(tiny_model, tmp_path):
    ray_bin = Path(sys.executable).with_name("ray")
    ray_cmd = str(ray_bin) if ray_bin.exists() else shutil.which("ray")
    temp = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))  # AF_UNIX socket paths must stay < 108 bytes
    # stopped alone at the end by its --temp-dir (never `ray stop`, which stops every Ray process on the machine)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    if not (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH") or (Path.home() / ".ray" / "auth_token").is_file()):
        token = tmp_path / "auth_token"  # a machine where no local cluster has generated one yet (this test alone)
        token.write_text(secrets.token_hex(32))
        env["RAY_AUTH_TOKEN_PATH"] = str(token)
    start, (_, dash, _) = start_head(  # the agent's default port may be another cluster's on this machine
        lambda ports: [ray_cmd, "start", "--head", f"--port={ports[0]}", f"--dashboard-port={ports[1]}",
                       "--dashboard-host=127.0.0.1", f"--dashboard-agent-listen-port={ports[2]}", "--num-cpus=2",
                       f"--temp-dir={temp}"],
        ports=3, tmpdir=str(temp), env=env, timeout=120)
    assert start.returncode == 0, start.stderr
    root = tmp_path / "runs-root"  # run.root: a relative --run-dir of a job goes under it, not into Ray's copy
    run_dir = root / "job-run"
    try:
        for _ in range(12):  # the head's dashboard agent takes a while to register on a busy machine
            job = subprocess.run(
                [ray_cmd, "job", "submit", "--address", f"http://127.0.0.1:{dash}", "--working-dir", str(ROOT),
                 "--runtime-env-json", json.dumps({"env_vars": {"XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))}}),
                 "--", "python", "launch.py", "--run-dir", "job-run", "--steps", "1", *SHORT, "evolution.enabled=false",
                 f"run.root={root}"],
                env=env, capture_output=True, text=True, timeout=600,
            )
            if "No available agent to submit job" not in job.stdout + job.stderr:
                break
            time.sleep(5)
        assert job.returncode == 0, (job.stdout[-3000:], job.stderr[-3000:])
        assert "succeeded" in job.stdout.lower()
        assert "connecting: Ray cluster at" in job.stdout
        # the job's first line names the resolved run directory; nothing of the run is in Ray's temporary directory
        assert f"\nrun directory: {run_dir}\n" in job.stdout, job.stdout[-3000:]
        assert not [p for p in temp.rglob("job-run")], "the run landed in Ray's copy of the working directory"
    finally:
        stop_processes_under(str(temp))
        shutil.rmtree(temp, ignore_errors=True)
    assert not run_dir.resolve().is_relative_to(temp.resolve())
    assert [r["step"] for r in metrics(run_dir)] == [1]  # still there after the head and its temp dir are gone
    assert (run_dir / "checkpoints" / "step-1" / "manifest.json").is_file()
