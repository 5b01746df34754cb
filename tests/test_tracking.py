"""Experiment tracking (``reporting.tracking``): TensorBoard, W&B (offline) and MLflow (a local file store) driven
through ``RunDirectory`` with the real backends and read back with each one's own reader; resume and rewound steps; a
tracker that fails mid-run (a killed W&B service, an MLflow store that cannot be written); the launch-time checks; one
resumed launch with every backend on.

No network: W&B runs with ``WANDB_MODE=offline`` and ``WANDB_DIR`` in the test's temporary directory (its records are
read from the offline run's transaction log, ``wandb_records``), MLflow with a ``file:`` store in the run directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from configs import ConfigError, load_config
from reporting.run_dir import RunDirectory
from reporting.tracking import (SAMPLE_COLUMNS, TRACKING_FILE, check_tracking, sample_table, scalars, tracking_problems,
                                wandb_credentials)
from configs.loading import dotted_settings
from reporting.tracking.mlflow_backend import ALLOW_FILE_STORE, metric_name
from short_runs import ROOT, launch

wandb = pytest.importorskip("wandb", reason="the tracking extra: pip install -e '.[tracking]'")
mlflow = pytest.importorskip("mlflow", reason="the tracking extra: pip install -e '.[tracking]'")

from wandb_records import offline_runs  # noqa: E402  (needs wandb)

ALL = "logging.backends=[tensorboard,wandb,mlflow]"
W_AND_B_NOISE = {"_step", "_runtime", "_timestamp", "step"}


def row(step: int, session: int = 1) -> dict:
    """A metrics row with the keys the loop writes (synthetic values; ``session`` tells a repeated step's values
    apart), its sample proposals and an evaluation score whose benchmark name MLflow cannot take as is."""
    return {
        "step": step, "valid_rate": 0.5 + step / 100, "solve_rate": session + step / 10, "coverage": 10 * step,
        "teacher_reward": 0.1, "has_flag": True,
        "members": [{"id": "t0", "role": "teacher", "mu": 25.0 + step, "sigma": 8.0},
                    {"id": "s0", "role": "student", "mu": 25.0 - step, "sigma": 8.0}],
        "phase_seconds": {"propose": 1.5, "solve": 2.0}, "evolution": [], "eval/humaneval+/t0": 0.25 * session,
        "examples": [{"kind": "proposal", "member": "t0", "family": "code_o", "valid": True, "reason": None,
                      "text": "def f(a):\n    return a | 1", "answer": {"member": "s0", "text": "3", "correct": False,
                                                                        "reason": "wrong output"}},
                     {"kind": "proposal", "member": "t0", "family": "code_i", "valid": False, "reason": "no f",
                      "text": "print(1)"}],
    }


KEYS = {"valid_rate", "solve_rate", "coverage", "teacher_reward", "eval/humaneval+/t0", "phase_seconds/propose",
        "phase_seconds/solve", "mu/t0", "mu/s0"}


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    """W&B offline, its files under tmp_path/wandb-dir; MLflow at its default store, nothing set for it."""
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(ALLOW_FILE_STORE, raising=False)  # the default store needs no such variable (checked below)
    return wandb_dir


def session(root: Path, steps: list[int], overrides: list[str], number: int = 1, start_step: int | None = None,
            rewind_to: int | None = None) -> RunDirectory:
    """One session of a run in ``root``: open the trackers, log ``steps`` (after ``rewind_to``, the steps after it
    again, as a recovery does), close."""
    config = load_config(None, overrides)
    run = RunDirectory(root)
    if not (root / "config.yaml").exists():
        run.create(config)
    run.open_tracking(config.logging, config, start_step)
    for step in steps:
        run.append_metrics(row(step, number))
    if rewind_to is not None:
        run.truncate_metrics(rewind_to)
        for step in range(rewind_to + 1, steps[-1] + 1):
            run.append_metrics(row(step, number + 10))
    run.close()
    return run


def tensorboard_scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows of RUN_DIR/tensorboard (its own loader, purges applied): tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(root / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def mlflow_client(root: Path):
    from mlflow.tracking import MlflowClient

    kept = json.loads((root / TRACKING_FILE).read_text())["mlflow"]
    return MlflowClient(tracking_uri=kept["tracking_uri"]), kept["run_id"]


def next_second() -> None:
    """Wait for the clock's next second: W&B names an offline run's directory by the second it started."""
    time.sleep(1.05 - time.time() % 1)


# pure core -----------------------------------------------------------------------------------------------------------
def test_scalars_are_the_numeric_keys_phase_seconds_and_ratings():
    assert set(scalars(row(3))) == KEYS  # booleans, lists and the step itself are not scalars
    assert scalars(row(3))["mu/t0"] == 28.0 and scalars(row(3))["phase_seconds/solve"] == 2.0


def test_sample_table_has_a_row_per_proposal_with_its_answer():
    table = sample_table(4, row(4)["examples"])
    assert [list(r) for r in table] == [list(SAMPLE_COLUMNS)] * 2
    assert table[0] == {"step": 4, "teacher": "t0", "family": "code_o", "valid": True, "reason": None,
                        "proposal": "def f(a):\n    return a | 1", "student": "s0", "answer": "3", "correct": False,
                        "answer_reason": "wrong output"}
    assert table[1]["answer"] is None and table[1]["reason"] == "no f"


def test_mlflow_metric_names_replace_only_what_mlflow_refuses():
    assert metric_name("eval/humaneval+/t0") == "eval/humaneval_plus/t0"
    assert metric_name("phase_seconds/solve") == "phase_seconds/solve"
    assert metric_name("a b:c.d-e") == "a b:c.d-e" and metric_name("x@y") == "x_y"


def test_logging_config_takes_known_backends_once():
    assert load_config().logging.backends == ["tensorboard"] and load_config().logging.samples_every == 10
    with pytest.raises(ConfigError, match="logging.backends.0"):
        load_config(None, ["logging.backends=[neptune]"])
    with pytest.raises(ConfigError, match="twice"):
        load_config(None, ["logging.backends=[wandb,wandb]"])


def test_problems_name_the_key_and_the_fix(tmp_path):
    env = {"HOME": str(tmp_path)}
    missing = tracking_problems(["tensorboard", "mlflow"], env, lambda module: module != "mlflow", lambda: True)
    assert len(missing) == 1 and "logging.backends includes mlflow" in missing[0] and "[tracking]" in missing[0]
    keyless = tracking_problems(["wandb"], env, lambda module: True, lambda: False)
    assert len(keyless) == 1 and "wandb login" in keyless[0] and "WANDB_MODE=offline" in keyless[0]
    for quiet in ("offline", "disabled", "dryrun"):
        assert tracking_problems(["wandb"], {**env, "WANDB_MODE": quiet}, lambda module: True, lambda: False) == []
    assert tracking_problems(["wandb"], env, lambda module: True, lambda: True) == []


def test_wandb_credentials_from_the_environment_or_netrc(tmp_path):
    env = {"HOME": str(tmp_path)}
    assert not wandb_credentials(env)
    assert wandb_credentials({**env, "WANDB_API_KEY": "x" * 40})
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_credentials(env)
    assert not wandb_credentials({**env, "WANDB_BASE_URL": "https://wandb.example.org"})  # a key for another host
    other = tmp_path / "other-netrc"
    other.write_text("machine wandb.example.org login user password " + "k" * 40 + "\n")
    assert wandb_credentials({**env, "WANDB_BASE_URL": "https://wandb.example.org", "NETRC": str(other)})


# the backends, read back -------------------------------------------------------------------------------------------
def test_every_backend_gets_the_same_scalars_and_the_samples_table(tmp_path, offline):
    root = tmp_path / "run"
    session(root, [1, 2, 3], [ALL, "logging.samples_every=2", "run.name=tracked"])
    kept = json.loads((root / TRACKING_FILE).read_text())
    assert set(kept) == {"wandb", "mlflow"}

    shown = tensorboard_scalars(root)
    assert set(shown) == KEYS
    assert shown["solve_rate"] == [(1, pytest.approx(1.1)), (2, pytest.approx(1.2)), (3, pytest.approx(1.3))]

    (run,) = offline_runs(offline, kept["wandb"]["run_id"])  # W&B's files under WANDB_DIR, the id kept in RUN_DIR
    assert run.complete and kept["wandb"]["offline_dirs"] == [str(run.directory)]
    scalar_rows = [r for r in run.history if "solve_rate" in r]
    assert {k for r in scalar_rows for k in r} - W_AND_B_NOISE == KEYS
    assert [r["step"] for r in scalar_rows] == [1, 2, 3]
    assert run.summary["solve_rate"] == pytest.approx(1.3) and run.summary["step"] == 3
    summary_file = run.directory / "files" / "wandb-summary.json"
    if summary_file.exists():  # wandb versions that write it offline (wandb/wandb#11279)
        assert json.loads(summary_file.read_text())["solve_rate"] == pytest.approx(1.3)
    (table_row,) = [r for r in run.history if "samples/path" in r]  # a logged table: its file's path and shape
    assert table_row["step"] == 2 and table_row["samples/nrows"] == 2
    table_file = run.directory / "files" / table_row["samples/path"]
    table = json.loads(table_file.read_text())
    assert table["columns"] == list(SAMPLE_COLUMNS) and table["data"][0][SAMPLE_COLUMNS.index("answer")] == "3"

    # MLflow: the SQLite store in the run directory, which a fresh client (as `mlflow ui`'s server) opens with no
    # MLFLOW_ALLOW_FILE_STORE; every setting a parameter under its dotted key, as launch.py takes it back
    assert kept["mlflow"]["tracking_uri"] == f"sqlite:///{root.absolute() / 'mlflow.db'}" and ALLOW_FILE_STORE not in os.environ
    client, run_id = mlflow_client(root)
    logged = client.get_run(run_id)
    config = load_config(None, [ALL, "logging.samples_every=2", "run.name=tracked"])
    settings = dotted_settings(config.model_dump(mode="json"))
    assert logged.data.params == settings and len(settings) > 100  # more than one log_batch call takes
    assert logged.data.params["logging.samples_every"] == "2" and logged.data.params["run.name"] == "tracked"
    assert load_config(None, [f"{k}={v}" for k, v in logged.data.params.items()]) == config  # they read back
    assert {k: v for k, v in logged.data.tags.items() if k.startswith("populora.") and k != "populora.run_dir"} == {
        "populora.tiny_variant": "default", "populora.population": "2 teachers + 2 students",
        "populora.inference_backend": config.inference.backend}  # as resolved: hf on a CPU machine
    assert client.get_experiment(logged.info.experiment_id).artifact_location == (root / "mlartifacts").as_uri()
    assert set(logged.data.metrics) == {metric_name(k) for k in KEYS}
    assert logged.info.status == "FINISHED" and logged.info.run_name == "tracked"
    history = client.get_metric_history(run_id, "eval/humaneval_plus/t0")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.25), (3, 0.25)]
    samples = json.loads((Path(client.download_artifacts(run_id, "samples/step-000002.json"))).read_text())
    assert samples["columns"] == list(SAMPLE_COLUMNS) and len(samples["data"]) == 2
    assert "run:" in Path(client.download_artifacts(run_id, "config.yaml")).read_text()


def test_resume_continues_the_same_tracked_runs_and_repeated_steps_are_kept(tmp_path, offline):
    root = tmp_path / "run"
    # Session 1: steps 1-4, then a recovery back to step 2's checkpoint, which repeats steps 3 and 4.
    session(root, [1, 2, 3, 4], [ALL], number=1, rewind_to=2)
    first = json.loads((root / TRACKING_FILE).read_text())
    assert [(s, round(v, 3)) for s, v in tensorboard_scalars(root)["solve_rate"]] == [(1, 1.1), (2, 1.2), (3, 11.3),
                                                                                     (4, 11.4)]
    next_second()
    # Session 2: --resume from the step-2 checkpoint (metrics cut back to it): steps 3-5 again, new values.
    RunDirectory(root).truncate_metrics(2)
    session(root, [3, 4, 5], [ALL, "rl.learning_rate=0.001"], number=2, start_step=3)  # other settings: tags
    second = json.loads((root / TRACKING_FILE).read_text())
    assert second["wandb"]["run_id"] == first["wandb"]["run_id"]
    assert second["mlflow"]["run_id"] == first["mlflow"]["run_id"]

    # TensorBoard: each step once, with the value its latest session wrote (the purge markers hide the others).
    assert tensorboard_scalars(root)["solve_rate"] == [
        (1, pytest.approx(1.1)), (2, pytest.approx(1.2)), (3, pytest.approx(2.3)), (4, pytest.approx(2.4)),
        (5, pytest.approx(2.5))]

    # W&B: the same run id in both offline sessions; the rewound steps are new rows, none dropped.
    runs = offline_runs(offline, first["wandb"]["run_id"])
    assert len(runs) == 2 and {r.run_id for r in runs} == {first["wandb"]["run_id"]}
    steps = [[(r["step"], round(r["solve_rate"], 3)) for r in run.history if "solve_rate" in r] for run in runs]
    assert steps[0] == [(1, 1.1), (2, 1.2), (3, 1.3), (4, 1.4), (3, 11.3), (4, 11.4)]
    assert steps[1] == [(3, 2.3), (4, 2.4), (5, 2.5)]
    assert [r["_step"] for r in runs[0].history if "solve_rate" in r] == list(range(6))  # W&B's own step only rises

    # MLflow: one run; a repeated step is a second value at that step; the latest value is the newest at the top step.
    client, run_id = mlflow_client(root)
    history = [(m.step, round(m.value, 3)) for m in client.get_metric_history(run_id, "solve_rate")]
    assert history == [(1, 1.1), (2, 1.2), (3, 1.3), (4, 1.4), (3, 11.3), (4, 11.4), (3, 2.3), (4, 2.4), (5, 2.5)]
    assert client.get_run(run_id).data.metrics["solve_rate"] == pytest.approx(2.5)
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    # parameters cannot change: they keep the first session's settings; the resumed one's changes are tags
    data = client.get_run(run_id).data
    assert data.params["rl.learning_rate"] == "0.0005"
    assert {k: v for k, v in data.tags.items() if k.startswith("populora.resumed")} == {
        "populora.resumed.rl.learning_rate": "0.001", "populora.resumed_at_step": "3"}


def test_wandb_drops_a_rewound_step_given_as_its_own_step(tmp_path, offline):
    """Why the W&B backend logs ``step`` as a key: W&B's own step rejects a rewind (the measurement in the docs)."""
    run = wandb.init(project="populora-test", dir=str(offline), settings=wandb.Settings(console="off"))
    for step in (1, 2, 3, 2, 3, 4):
        run.log({"x": step}, step=step)
    run.finish()
    (logged,) = offline_runs(offline, run.id)
    assert [r["_step"] for r in logged.history if "x" in r] == [1, 2, 3, 4]  # the second 2 and 3 are gone


# a tracker that fails mid-run ----------------------------------------------------------------------------------------
def tracking_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "populora.tracking" and r.levelno == logging.WARNING]


def test_a_store_that_cannot_be_written_drops_mlflow_with_one_warning(tmp_path, offline, caplog):
    root = tmp_path / "run"
    # a file store (named, as a user may): its directory can be made unwritable under the open client
    config = load_config(None, ["logging.backends=[tensorboard,mlflow]", f"logging.mlflow_tracking_uri={(root / 'mlruns').as_uri()}"])
    run = RunDirectory(root)
    run.create(config)
    run.open_tracking(config.logging, config)
    run.append_metrics(row(1))
    shutil.rmtree(root / "mlruns")
    (root / "mlruns").write_text("not a directory")  # the store's directory is gone and cannot be made again
    with caplog.at_level(logging.WARNING, logger="populora.tracking"):
        for step in (2, 3, 4):
            run.append_metrics(row(step))
        run.close()
    warnings = tracking_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("tracking: mlflow failed at step 2")
    assert "tensorboard keep every step" in warnings[0]
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3, 4]
    assert [s for s, _ in tensorboard_scalars(root)["solve_rate"]] == [1, 2, 3, 4]


def test_a_tracked_run_that_cannot_be_continued_is_one_warning(tmp_path, offline, caplog):
    root = tmp_path / "run"
    root.mkdir()
    gone = {"mlflow": {"run_id": "0" * 32, "tracking_uri": (root / "gone").as_uri()}}  # a store without that run
    (root / TRACKING_FILE).write_text(json.dumps(gone))
    config = load_config(None, ["logging.backends=[tensorboard,mlflow]"])
    run = RunDirectory(root)
    with caplog.at_level(logging.WARNING, logger="populora.tracking"):
        assert run.open_tracking(config.logging, config, start_step=3) == ["tensorboard"]
        run.append_metrics(row(3))
        run.close()
    warnings = tracking_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("tracking: mlflow could not start"), warnings
    assert [s for s, _ in tensorboard_scalars(root)["solve_rate"]] == [3]


def test_a_killed_wandb_service_drops_wandb_with_one_warning(tmp_path, offline, caplog):
    import psutil

    root = tmp_path / "run"
    config = load_config(None, [ALL])
    run = RunDirectory(root)
    run.create(config)
    run.open_tracking(config.logging, config)
    run.append_metrics(row(1))
    services = [p for p in psutil.Process().children(recursive=True) if p.name() == "wandb-core"]
    assert services, "no wandb-core service process under this one"
    for service in services:
        os.kill(service.pid, signal.SIGKILL)
        service.wait(10)
    with caplog.at_level(logging.WARNING, logger="populora.tracking"):
        for step in (2, 3, 4):
            run.append_metrics(row(step))
        run.close()
    warnings = tracking_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("tracking: wandb failed at step 2"), warnings
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3, 4]
    assert [s for s, _ in tensorboard_scalars(root)["solve_rate"]] == [1, 2, 3, 4]
    client, run_id = mlflow_client(root)
    assert [m.step for m in client.get_metric_history(run_id, "solve_rate")] == [1, 2, 3, 4]
    again = wandb.init(project="populora-test", dir=str(offline), settings=wandb.Settings(console="off"))
    again.log({"x": 1})  # W&B itself starts a new service for the next run
    again.finish()


# the launch-time checks --------------------------------------------------------------------------------------------
def dry_run(*overrides: str, env: dict[str, str], block: str | None = None) -> subprocess.CompletedProcess:
    """``python launch.py --dry-run`` with ``overrides`` in ``env``; ``block``: a module made unimportable first, as
    where it is not installed (``sys.modules[name] = None``, Python's own way of refusing an import)."""
    code = ("import runpy, sys\n"
            + (f"sys.modules[{block!r}] = None\n" if block else "")
            + f"sys.argv = ['launch.py', '--dry-run', *{list(overrides)!r}]\n"
            + "runpy.run_path('launch.py', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_dry_run_stops_on_a_missing_package_or_wandb_online_without_a_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
    env.update(HOME=str(tmp_path), RAY_ADDRESS="local", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    keyless = dry_run("logging.backends=[tensorboard,wandb]", env=env)
    assert keyless.returncode == 2, keyless.stdout[-2000:] + keyless.stderr[-2000:]
    assert keyless.stdout == ""  # stopped before the dry run printed anything
    lines = keyless.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: logging.backends includes wandb in online mode"), lines
    assert "wandb login" in lines[0]

    missing = dry_run("logging.backends=[mlflow]", env=env, block="mlflow")
    lines = missing.stderr.strip().splitlines()
    assert missing.returncode == 2 and len(lines) == 1, missing.stderr[-2000:]
    assert lines[0].startswith("error: logging.backends includes mlflow, but the mlflow package is not installed")
    assert "pip install -e '.[tracking]'" in lines[0]

    assert check_tracking(["tensorboard", "wandb", "mlflow"], {**env, "WANDB_MODE": "offline"}) is None


# the driver -------------------------------------------------------------------------------------------------------
def test_a_resumed_launch_tracks_its_steps_in_every_backend(short_run, tmp_path):
    """`launch.py --resume` of a copy of the shared short run (steps 1-2) for one more step with every backend on:
    the driver opens the trackers, step 3 reaches each with the keys of its metrics.jsonl row, and the samples table."""
    assert short_run.returncode == 0, short_run.stderr[-3000:]
    run_dir = tmp_path / "run"
    shutil.copytree(short_run.run_dir, run_dir)
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    done = launch("--resume", str(run_dir), "--steps", "1", "run.dashboard=false", ALL, "logging.samples_every=1",
                  env={"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"tracking: tensorboard, wandb, mlflow ({run_dir / TRACKING_FILE})" in done.stdout
    store = f"sqlite:///{run_dir / 'mlflow.db'}"  # the tracking URI printed, with the command that opens it
    assert f"[populora] mlflow: {store} (view it with: mlflow ui --backend-store-uri {store})" in done.stdout
    assert "tracking:" not in done.stderr  # no tracker failed
    step_row = RunDirectory(run_dir).read_metrics()[-1]
    assert step_row["step"] == 3
    keys = set(scalars(step_row))

    client, run_id = mlflow_client(run_dir)
    assert set(client.get_run(run_id).data.metrics) == {metric_name(k) for k in keys}
    data = client.get_run(run_id).data  # a tracker new to the run: the resumed session's settings as parameters
    assert data.params["model.tiny_variant"] == "test" and data.params["run.dashboard"] == "false"
    assert data.tags["populora.tiny_variant"] == "test" and data.tags["populora.inference_backend"] == data.params["inference.backend"]
    assert [m.step for m in client.get_metric_history(run_id, "valid_rate")] == [3]
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == ["samples/step-000003.json"]

    kept = json.loads((run_dir / TRACKING_FILE).read_text())
    (logged,) = offline_runs(wandb_dir, kept["wandb"]["run_id"])
    scalar_rows = [r for r in logged.history if "valid_rate" in r]
    assert [r["step"] for r in scalar_rows] == [3] and set(scalar_rows[0]) - W_AND_B_NOISE == keys
    assert any("samples/path" in r for r in logged.history)

    shown = tensorboard_scalars(run_dir)  # steps 1-2 from the first launch, 3 from this one
    assert [s for s, _ in shown["valid_rate"]] == [1, 2, 3]
