"""``python -m evaluation``: bad benchmark files stop only their own benchmark (file, line and task
named; nothing written as complete), and finished benchmarks are saved and taken on a rerun."""

from __future__ import annotations

import json

import pytest

import evaluation_files as files
from evaluation.__main__ import main


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_bad_file_is_named_and_the_other_benchmarks_are_still_evaluated(tmp_path, capsys):
    data = tmp_path / "data"
    files.humaneval_check(data / "HumanEval.jsonl")
    # Mbpp/124's second argument is a complex number in the release: "not a number" cannot be one
    bad = {"task_id": "Mbpp/124", "prompt": "p", "entry_point": "angle_complex", "canonical_solution": "def angle_complex(a, b):\n    return 0\n",
           "base_input": [[0, "1j"], [1, "not a number"]], "plus_input": [], "atol": 0}
    files.write_jsonl(data / "MbppPlus.jsonl", [bad])
    files.write_jsonl(data / "gsm8k.jsonl", [{"title": "no layout"}])
    run = tmp_path / "run"
    assert main([str(run), "--oracle", "--data", str(data), "--benchmarks", "humaneval,mbpp+,gsm8k", "--workers", "2"]) == 1
    err = capsys.readouterr().err
    assert f"error: mbpp+: {data / 'MbppPlus.jsonl'}:1 (task Mbpp/124): base_input cannot be deserialised (ValueError" in err
    assert f"error: gsm8k: {data / 'gsm8k.jsonl'}:1: fields ['title'] match no known benchmark layout" in err
    assert "INCOMPLETE: 2 benchmark(s) not evaluated (mbpp+, gsm8k)" in err
    results = json.loads((run / "eval/oracle/results.json").read_text())
    assert results["complete"] is False and set(results["errors"]) == {"mbpp+", "gsm8k"}
    assert list(results["benchmarks"]) == ["humaneval"]
    assert results["models"]["oracle (reference solutions)"]["benchmarks"]["humaneval"]["pass@1"] == 1.0
    assert "INCOMPLETE: not evaluated: mbpp+:" in (run / "eval/oracle/results.md").read_text()
    assert sorted(p.name for p in (run / "eval/oracle/finished").iterdir()) == ["humaneval.json"]


def test_finished_benchmarks_are_taken_on_a_rerun_and_redone_when_anything_changes(tmp_path, capsys):
    data = tmp_path / "data"
    files.humaneval_check(data / "HumanEval.jsonl")
    files.mbpp_plus(data / "MbppPlus.jsonl")
    run = tmp_path / "run"
    argv = [str(run), "--oracle", "--data", str(data), "--benchmarks", "humaneval,mbpp+", "--workers", "2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "plan: 1 models (oracle (reference solutions)) x 2 benchmarks (3 problems) x 1 samples = 3 reference runs" in err
    assert "[1/2] humaneval: 1 problems x 1 models done" in err and "[2/2] mbpp+: 2 problems x 1 models done" in err
    saved = run / "eval/oracle/finished/mbpp+.json"
    record = json.loads(saved.read_text())
    assert record["scores"]["oracle (reference solutions)"]["base_pass@1"] == 1.0
    # mark the saved record: a rerun that takes it (instead of judging again) reports the mark
    record["scores"]["oracle (reference solutions)"]["pass@1"] = 0.25
    saved.write_text(json.dumps(record))
    assert main(argv) == 0
    assert "[2/2] mbpp+: finished earlier, taken from" in capsys.readouterr().err
    scores = json.loads((run / "eval/oracle/results.json").read_text())["models"]["oracle (reference solutions)"]["benchmarks"]
    assert scores["mbpp+"]["pass@1"] == 0.25 and scores["humaneval"]["pass@1"] == 1.0
    # another limit (or an edited file, or --fresh) evaluates it again
    assert main(argv + ["--timeout-floor", "3"]) == 0
    assert "finished earlier" not in capsys.readouterr().err
    assert json.loads((run / "eval/oracle/results.json").read_text())["models"]["oracle (reference solutions)"]["benchmarks"]["mbpp+"]["pass@1"] == 1.0
