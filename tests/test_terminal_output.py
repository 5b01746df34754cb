"""What a user sees in the terminal: the dashboard lines, nothing from the actors after the summary,
--quiet and --verbose, the actors' log files in the run directory, and no secret written anywhere.

The runs are real `launch.py` subprocesses on a local Ray cluster (the tiny test model, short overrides).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actors.cluster import dashboard_lines, dashboard_missing, token_source
from short_runs import ROOT, launch_env

ACTOR_LOGS = {"inference.log", "learner-teacher.log", "learner-student.log", "league.log", "verifier-0.log",
              "verifier-1.log"}
SUMMARY_KEYS = ("valid rate", "solve rate", "AST depth", "evolution", "logs:", "plots:", "export:")
ACTOR_OUTPUT_MARKS = ("Loading weights", "(LearnerActor", "(InferenceActor", "(VerifierActor", "(LeagueActor", "pid=")


def local_token() -> bytes | None:
    """The token a local cluster started from this environment uses (Ray's order: RAY_AUTH_TOKEN, the file
    RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token), or None where there is none. Never printed."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip().encode()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    token = path.read_bytes().strip() if path.is_file() else b""
    return token or None


def files_holding(secret: bytes, root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and secret in p.read_bytes()]


def after_summary(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run finished"))
    return lines[start + 1:]


# -- the dashboard lines -------------------------------------------------------------------------------------------


def test_local_dashboard_lines_give_the_url_and_the_login_command_never_a_token():
    lines = dashboard_lines("127.0.0.1:8266", token_auth=True, remote=False, env={"RAY_AUTH_TOKEN": "s3cr3t-value"})
    text = "\n".join(lines)
    assert "http://127.0.0.1:8266" in text and "ssh -L 8266:localhost:8266" in text
    assert "`ray get-auth-token`" in text and "RAY_AUTH_TOKEN variable" in text
    assert "s3cr3t-value" not in text
    assert "~/.ray/auth_token" in "\n".join(dashboard_lines("http://127.0.0.1:8265", True, remote=False, env={}))
    assert token_source({"RAY_AUTH_TOKEN_PATH": "/etc/ray-token"}) == "the file /etc/ray-token (RAY_AUTH_TOKEN_PATH)"


def test_dashboard_lines_without_auth_remote_and_missing():
    open_lines = dashboard_lines("127.0.0.1:8265", token_auth=False, remote=False, env={})
    assert "login: none" in open_lines[1] and "RAY_AUTH_MODE=disabled" in open_lines[1]
    remote = dashboard_lines("10.0.0.5:8265", token_auth=True, remote=True, env={})
    assert "head node" in remote[0] and "ssh -L 8265:localhost:8265 <head node>" in remote[0]
    assert "`ray get-auth-token` prints on the head node" in remote[1]
    (off,) = dashboard_lines(None, token_auth=True, remote=False, off=True)
    assert off.startswith("dashboard: not running: run.dashboard=false.") and "metrics.jsonl" in off
    (missing,) = dashboard_lines(None, token_auth=True, remote=False, missing="No module named 'aiohttp'")
    assert missing.startswith("dashboard: not running") and "ray[default]" in missing and "aiohttp" in missing
    assert dashboard_lines("", token_auth=False, remote=True, env={})[0].startswith("dashboard: not running")


def test_this_installation_has_the_dashboard():
    assert dashboard_missing() is None, "install.sh installs ray[default]; the dashboard tests below need it"


# -- route_output in a real process --------------------------------------------------------------------------------


def test_route_output_sends_prints_logging_and_child_processes_to_the_file(tmp_path):
    script = textwrap.dedent("""
        import logging, os, subprocess, sys
        from reporting.run_dir import route_output
        path = route_output("worker-x")
        print("from print")
        logging.getLogger("some.module").info("from logging")
        subprocess.run(["sh", "-c", "echo from a child >&2"], check=True)
        os.write(1, b"from fd 1\\n")
        print(path)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "POPULORA_LOG_DIR": str(tmp_path / "logs")})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == ""
    text = (tmp_path / "logs" / "worker-x.log").read_text()
    for line in ("--- worker-x: pid", "from print", "INFO some.module: from logging", "from a child", "from fd 1",
                 str(tmp_path / "logs" / "worker-x.log")):
        assert line in text
    unset = subprocess.run([sys.executable, "-c", "from reporting.run_dir import route_output; print(route_output('y'))"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "POPULORA_LOG_DIR"})
    assert unset.stdout.strip() == "None"


# -- the dashboard a local cluster serves ----------------------------------------------------------------------------

DASHBOARD_PROBE = """
import json, shutil, subprocess, sys, urllib.error, urllib.request
import ray
from actors.cluster import connect

def status(url, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code

connection = connect(1, log_dir=sys.argv[1])
line = connection.dashboard[0]
url = line.split()[1]
token = subprocess.run([shutil.which("ray") or "ray", "get-auth-token"], capture_output=True, text=True).stdout.strip()
try:
    print(json.dumps({"lines": connection.dashboard, "page": status(url + "/"),
                      "api_without_token": status(url + "/api/version"),
                      "api_with_cookie": status(url + "/api/version", {"Cookie": "ray-authentication-token=" + token}),
                      "api_with_wrong_token": status(url + "/api/version", {"Authorization": "Bearer wrong"})}))
finally:
    ray.shutdown()
"""


@pytest.mark.slow
def test_the_printed_dashboard_asks_for_the_token_ray_get_auth_token_prints(tmp_path):
    env = {k: v for k, v in launch_env().items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    out = subprocess.run([sys.executable, "-c", DASHBOARD_PROBE, str(tmp_path / "logs")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["lines"][0].startswith("dashboard: http://127.0.0.1:")
    assert "`ray get-auth-token`" in result["lines"][1]
    assert result["page"] == 200  # the login page itself is public
    assert result["api_without_token"] == 401 and result["api_with_wrong_token"] == 403
    assert result["api_with_cookie"] == 200  # what pasting the token into the page sets


# -- real runs -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_step_bar_draws_only_on_a_terminal(tmp_path):
    """``step_bar`` on a terminal (a pseudo-terminal here) draws; on a file it is off, and ``write`` still prints."""
    from actors.driver import step_bar

    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty, (tmp_path / "log").open("w") as log:
        assert not step_bar(3, "run", quiet=False, stream=tty).disable
        assert step_bar(3, "run", quiet=True, stream=tty).disable
        assert step_bar(3, "run", quiet=False, stream=log).disable
    os.close(leader)


def test_default_run_then_quiet_resume(short_run, short_run_resumed):
    first, run_dir = short_run, short_run.run_dir  # launch.py --steps 2, default output (conftest)
    assert first.returncode == 0, first.stderr[-3000:]
    out = first.stdout
    assert out.splitlines()[0] == f"run directory: {run_dir}"  # the first line names where the run goes
    assert "[populora] dashboard: http://127.0.0.1:" in out or "[populora] dashboard: not running" in out
    if "[populora] dashboard: http" in out:
        assert "[populora] dashboard login:" in out
        assert "`ray get-auth-token`" in out or "login: none" in out
    assert f"[populora] actor output: {run_dir}/logs/<actor>.log" in out
    assert "step    2/2" in out
    tail = after_summary(out)
    assert [line.split()[0] for line in tail] == ["valid", "solve", "AST", "evolution", "logs:", "plots:", "export:"]
    assert f"python -m evaluation.export {run_dir} --member s" in tail[-1]  # its strongest solver, a student
    both = out + first.stderr
    assert not [mark for mark in ACTOR_OUTPUT_MARKS if mark in both], "actor output reached the terminal"
    # stdout and stderr are pipes here, as under `ray job submit` or `> log`: the step lines alone, no progress bar
    assert "\r" not in both and "step/s" not in both and "s/step" not in both, first.stderr[-2000:]
    assert "Token authentication is enabled" not in first.stderr  # Ray's warning: our dashboard lines say it

    logs = run_dir / "logs"
    assert ACTOR_LOGS <= {p.name for p in logs.iterdir()}
    for name in ACTOR_LOGS:
        assert (logs / name).read_text().startswith(f"--- {name[:-4]}: pid ")
    driver_log = (logs / "driver.log").read_text()
    assert "step    2/2" in driver_log and "dashboard" in driver_log

    quiet = short_run_resumed  # a copy of the run resumed with --quiet for one more step
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    lines = quiet.stdout.splitlines()
    assert lines[0].startswith("run finished: steps 3..3") and len(lines) == 1 + len(SUMMARY_KEYS), quiet.stdout
    assert quiet.stderr.strip() == "", quiet.stderr[-2000:]
    assert "step    3/3" in (quiet.run_dir / "logs" / "driver.log").read_text()  # the progress still goes to the log

    token = local_token()
    if token is None:
        pytest.skip("no Ray token on this machine to look for (token authentication off)")
    leaks = files_holding(token, run_dir) + files_holding(token, quiet.run_dir)
    assert not leaks, f"the Ray token is written in {leaks}"
    in_terminal = [name for name, text in (("stdout", out), ("stderr", first.stderr), ("quiet stdout", quiet.stdout))
                   if token.decode() in text]
    assert not in_terminal, f"the Ray token is printed on {in_terminal}"


@pytest.mark.slow
def test_verbose_forwards_actor_output(single_agent_run):
    out, run_dir = single_agent_run, single_agent_run.run_dir  # launch.py ... --verbose (conftest)
    assert out.returncode == 0, out.stderr[-3000:]
    both = out.stdout + out.stderr
    assert "[populora] actor output: forwarded to this terminal (--verbose)" in out.stdout
    assert "[populora] dashboard: not running: run.dashboard=false." in out.stdout  # SHORT turns it off
    assert "Loading weights" in both and "(LearnerActor pid=" in both
    assert not any(p.name != "driver.log" for p in (run_dir / "logs").iterdir())
    assert "DEBUG" in (run_dir / "logs" / "driver.log").read_text()
