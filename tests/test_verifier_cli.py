"""``python -m verifier``: the debugging command line, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verifier", *args], cwd=REPO, input=stdin, capture_output=True, text=True, timeout=60)


def test_run_prints_the_verdict_as_json(tmp_path):
    program = tmp_path / "p.py"
    program.write_text("def f(s, n):\n    return s * n\n")
    ok = cli("run", str(program), "--args", "'ab', 3")
    assert ok.returncode == 0 and json.loads(ok.stdout.strip().splitlines()[-1])["output"] == "'ababab'"
    bad = cli("run", str(program), "--args", "'ab', x")
    verdict = json.loads(bad.stdout.strip().splitlines()[-1])
    assert bad.returncode == 1 and verdict["status"] == "bad_input" and "argument 2" in verdict["error"]
    piped = cli("run", "-", "--args", "1", stdin="import socket\ndef f(a):\n    return a\n")
    assert json.loads(piped.stdout)["status"] == "forbidden"


def test_run_names_bad_options(tmp_path):
    missing = cli("run", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    program = tmp_path / "p.py"
    program.write_text("def f():\n    return 1\n")
    bad_timeout = cli("run", str(program), "--timeout-s", "0")
    assert bad_timeout.returncode == 2 and "timeout_s" in bad_timeout.stderr


def test_defences_command():
    out = cli("defences")
    assert out.returncode == 0 and json.loads(out.stdout)["process_per_execution"] is True
