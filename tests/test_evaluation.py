"""Benchmark evaluation: readers, judging in the sandbox, math grading, pass@k, --oracle.

Every benchmark file is written by the tests (``evaluation_files``); code runs in real sandbox
processes; math is graded by the real Math-Verify worker and by the fallback."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import pickle
from math import comb
from pathlib import Path

import pytest

import evaluation_files as files
from evaluation.__main__ import main
from evaluation.code_judge import CodeJudge, JudgeLimits, stdout_matches
from evaluation.datasets import BenchmarkFileError, decode_private_tests, load_benchmark, mbpp_deserialize
from evaluation.math_grade import MathGrader, extract_answer, math_verify_available, normalised_equal
from evaluation.passk import mean_pass_at_k, pass_at_k
from evaluation.prompts import extract_code
from test_verifier_sandbox import ESCAPE_TO_OS

ALL = "humaneval+,mbpp+,humaneval,mbpp,livecodebench,math500,gsm8k,aime24,amc23,minerva,olympiadbench"


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    """Reference times are cached under $XDG_CACHE_HOME: a fresh one per test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    limits = JudgeLimits(floor_s=2.0, factor=4.0, livecodebench_timeout_s=2.0, workers=2, cache_dir=tmp_path_factory.mktemp("cache"))
    with CodeJudge(limits) as j:
        yield j


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "data"
    files.write_all(root)
    return root


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


# -- --oracle ------------------------------------------------------------------------------------


def test_oracle_scores_every_layout_100_percent_and_leaves_the_data_alone(data, tmp_path, capsys):
    before = tree_digest(data)
    assert main([str(tmp_path / "run"), "--oracle", "--data", str(data), "--benchmarks", ALL, "--timeout-floor", "2", "--workers", "2"]) == 0
    results = json.loads((tmp_path / "run/eval/oracle/results.json").read_text())
    scores = results["models"]["oracle (reference solutions)"]["benchmarks"]
    assert set(scores) == set(ALL.split(","))
    for name, score in scores.items():
        assert score["pass@1"] == 1.0, (name, [t["reasons"] for t in score["tasks"]])
        assert score["n"] >= 1
    assert scores["livecodebench"]["n"] == 2 and scores["humaneval+"]["n"] == 2
    assert (tmp_path / "run/eval/oracle/results.png").stat().st_size > 1000
    assert "| oracle (reference solutions) | 100.0 |" in capsys.readouterr().out
    assert tree_digest(data) == before


# -- wrong and hostile answers -----------------------------------------------------------------------


def test_wrong_solutions_fail_in_every_layout(data, judge):
    he = load_benchmark("humaneval+", [data / "HumanEvalPlus-v0.1.10.jsonl.gz"])
    mbpp = load_benchmark("mbpp+", [data / "MbppPlus.jsonl"])
    check = load_benchmark("humaneval", [data / "HumanEval.jsonl.gz"])
    asserts = load_benchmark("mbpp", [data / "mbpp.jsonl"])
    lcb = load_benchmark("livecodebench", [data / "livecodebench/test.jsonl"])
    items = [
        (he[0], "def add_halves(a, b):\n    return (a + b) / 2 + 1e-9\n"),  # within the 1e-6 float rule: right
        (he[0], "def add_halves(a, b):\n    return (a + b) / 2 + 1e-3\n"),
        (he[1], "def find_zero(xs):\n    return 0.123\n"),
        (mbpp[0], "def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n"),
        (mbpp[1], "def is_not_prime(n):\n    return n % 2 == 0\n"),
        (check[0], "    return x + 2\n"),
        (asserts[0], "def remove_occ(s, ch):\n    return s[1:-1]\n"),
        (lcb[0], "input()\ninput()\nprint(3)\n"),  # passes the public test, fails the private ones
        (lcb[1], "class Solution:\n    def maxPair(self, nums, k):\n        return sorted(nums)[:k]\n"),
        (lcb[1], None),
    ]
    outcomes = judge.judge(items)
    assert outcomes[0].passed, outcomes[0]
    assert [o.passed for o in outcomes[1:]] == [False] * 9, outcomes
    assert outcomes[1].reason.startswith("wrong answer on base input 0")
    assert outcomes[7].reason.startswith("test 1:")  # the public test passed, the first private one failed
    assert outcomes[9].reason == "no code block in the answer"


def test_a_hang_is_killed_at_the_sum_of_the_limits(data, judge):
    he = load_benchmark("humaneval+", [data / "HumanEvalPlus-v0.1.10.jsonl.gz"])
    [outcome] = judge.judge([(he[0], "def add_halves(a, b):\n    while True:\n        pass\n")])
    assert not outcome.passed and outcome.base_passed is False
    # killed at the outside deadline, then named by running the base inputs one by one (the first one hangs)
    assert outcome.reason == "time limit: base input 0 did not return within its limit of 2 s"
    assert judge.limits_of(he[0]) == ([2.0, 2.0], [2.0])  # max(floor 2 s, 4 x a few microseconds) per input


HOSTILE = [
    "import os\ndef f(a):\n    return os.fork()",
    "import subprocess\ndef f(a):\n    return subprocess.run(['id']).returncode",
    "import socket\ndef f(a):\n    return socket.socket()",
    "def f(a):\n    return open('/etc/passwd').read()",
    "def f(a):\n    return ().__class__.__base__.__subclasses__()",
    "def f(a):\n    return (x for x in ()).gi_frame.f_back.f_globals",
]


def test_hostile_answers_are_contained(judge, tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("precious")
    from evaluation.datasets import CodeProblem

    problem = CodeProblem("humaneval+", "hostile/0", "evalplus", "", "hostile:1", entry_point="f",
                          reference="def f(a):\n    return a\n", base_inputs=[[0]])
    escapes = [ESCAPE_TO_OS.format(op=op) for op in (f"os.remove({str(canary)!r})", f"os.system('touch {canary}.new')", "os.kill(os.getppid(), 9)")]
    stdin_task = load_benchmark("livecodebench", [files.livecodebench(tmp_path / "lcb.jsonl")])[0]
    items = [(problem, code) for code in HOSTILE + escapes]
    items += [(stdin_task, f"import os\nos.remove({str(canary)!r})\n"), (stdin_task, "import sys\nsys.stdout.write(open('/etc/passwd').read())\n")]
    outcomes = judge.judge(items)
    assert all(not o.passed for o in outcomes), outcomes
    assert all(o.reason.startswith(("forbidden", "test 0: forbidden")) for o in outcomes), [o.reason for o in outcomes]
    assert canary.read_text() == "precious" and not Path(f"{canary}.new").exists()
    assert judge.judge([(problem, "def f(a):\n    return a\n")])[0].passed  # the judge still works


# -- malformed files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, lines, message",
    [
        ("humaneval+", ['{"task_id": "HumanEval/0", "prompt": "p", "entry_point": "f", "canonical_solution": "", "base_input": 3, "plus_input": []}'],
         r"x\.jsonl:1 \(task HumanEval/0\): field 'base_input' should be list"),
        ("mbpp+", ["", "{not json"], r"x\.jsonl:2: not a JSON object"),
        ("math500", ['{"problem": "1+1?", "answer": "2"}', '{"title": "?"}'], r"x\.jsonl:2: fields \['title'\] match no known"),
        ("gsm8k", ['{"task_id": "HumanEval/1", "prompt": "p", "entry_point": "f", "canonical_solution": "", "test": "def check(c): pass"}'],
         r"x\.jsonl:1 \(task HumanEval/1\): gsm8k is a math benchmark but this row is a code row"),
        ("livecodebench", ['{"question_content": "q", "public_test_cases": "[]", "private_test_cases": "@@@", "metadata": "{}"}'],
         r"x\.jsonl:1: private_test_cases is neither JSON"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, name, lines, message):
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BenchmarkFileError, match=message):
        load_benchmark(name, [path])


def test_private_tests_never_unpickle_objects(tmp_path):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(os.system)  # a global reference: an unrestricted unpickler would import it
    import base64
    import zlib

    text = base64.b64encode(zlib.compress(payload)).decode()
    with pytest.raises(BenchmarkFileError, match="refusing to load posix.system"):
        decode_private_tests(text, "f.jsonl:3")
    assert not marker.exists()
    tests = [{"input": "1", "output": "2", "testtype": "stdin"}]
    assert decode_private_tests(files.pickled_tests(tests), "f.jsonl:1") == tests


def test_missing_file_and_cli_errors(tmp_path, capsys):
    assert main([str(tmp_path / "run"), "--oracle", "--data", str(tmp_path), "--benchmarks", "mbpp+"]) == 2
    assert "no file for 'mbpp+'" in capsys.readouterr().err
    assert main([str(tmp_path / "run"), "--data", str(tmp_path), "--benchmarks", "mbpp+=" + str(files.mbpp_plus(tmp_path / "m.jsonl"))]) == 2
    assert "no checkpoint" in capsys.readouterr().err


# -- details of the readers --------------------------------------------------------------------------


def test_mbpp_plus_arguments_are_deserialised():
    assert mbpp_deserialize("Mbpp/2", [[[1, 2], [3]]]) == [[(1, 2), (3,)]]
    assert mbpp_deserialize("Mbpp/63", [[[[1, 2], [3, 4]]]]) == [[[(1, 2), (3, 4)]]]
    assert mbpp_deserialize("Mbpp/252", [["1+2j"]]) == [[1 + 2j]]
    assert mbpp_deserialize("Mbpp/580", [[[1, [2, 3]]]]) == [[(1, (2, 3))]]
    assert mbpp_deserialize("Mbpp/4", [[[1, 2]]]) == [[[1, 2]]]


def test_gzip_and_plain_layouts_read_the_same(tmp_path):
    a = load_benchmark("humaneval", [files.humaneval_check(tmp_path / "HumanEval.jsonl.gz")])
    b = load_benchmark("humaneval", [files.humaneval_check(tmp_path / "HumanEval.jsonl")])
    assert [(p.task_id, p.reference, p.test) for p in a] == [(p.task_id, p.reference, p.test) for p in b]
    with gzip.open(tmp_path / "HumanEval.jsonl.gz", "rt") as handle:
        assert json.loads(handle.readline())["task_id"] == "HumanEval/1"


def test_math_answers_come_from_the_layout(data):
    answers = {name: load_benchmark(name, [data / name / "test.jsonl"])[0].answer for name in files.MATH_ROWS}
    assert answers == {"math500": "\\frac{3}{4}", "gsm8k": "1198", "aime24": "24", "amc23": "27", "minerva": "4", "olympiadbench": "2"}


def test_stdout_rule_and_code_extraction():
    assert stdout_matches("3 \n4.0\n", "3\n4") and stdout_matches("1.50 2", "1.5 2.0") and not stdout_matches("3\n", "3\n4")
    text = "<think>```python\nx = 1\n```</think><answer>```python\ndef f():\n    return 2\n```</answer>"
    assert extract_code(text) == "def f():\n    return 2\n"
    assert extract_code("no code here") is None


# -- pass@k ------------------------------------------------------------------------------------------


def test_pass_at_k_equals_the_closed_form_and_the_subset_count():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                closed = 1 - comb(n - c, k) / comb(n, k)
                subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
                by_count = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(closed) == pytest.approx(by_count)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert mean_pass_at_k([(10, 3), (10, 0)], 1) == pytest.approx(0.15)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


# -- math grading ------------------------------------------------------------------------------------

EQUIVALENT = [("\\frac{3}{4}", "0.75"), ("\\frac{3}{4}", "\\dfrac{3}{4}"), ("27", "27.0"), ("1198", "1198"), ("-\\frac{1}{2}", "-1/2"), ("24", "24.00")]
DIFFERENT = [("\\frac{3}{4}", "0.7"), ("27", "28"), ("1198", "1189")]


@pytest.mark.parametrize("use", [pytest.param(True, marks=pytest.mark.skipif(not math_verify_available(), reason="math-verify missing")), False])
def test_math_equivalences(use):
    with MathGrader(use_math_verify=use) as grader:
        assert grader.grader == ("math-verify" if use else "fallback")
        assert [grader.grade(g, p)[0] for g, p in EQUIVALENT] == [True] * len(EQUIVALENT)
        wrong = [grader.grade(g, p) for g, p in DIFFERENT]
        assert [ok for ok, _ in wrong] == [False] * len(DIFFERENT)
        assert all(reason for _, reason in wrong)
        assert ("fallback grader" in wrong[0][1]) == (not use)
        assert grader.grade("2", None) == (False, "no answer found (no <answer> and no \\boxed{})")
    if use:
        with MathGrader(use_math_verify=True) as grader:
            assert grader.grade("\\sqrt{2}", "2^{1/2}")[0]  # symbolic, beyond the fallback
    assert not normalised_equal("\\sqrt{2}", "2^{1/2}")


def test_answer_extraction():
    assert extract_answer("<think>\\boxed{1}</think><answer>so \\boxed{\\frac{1}{2}}</answer>") == "\\frac{1}{2}"
    assert extract_answer("<answer> 42 </answer>") == "42"
    assert extract_answer("thus \\boxed{7} and \\boxed{8}") == "8"
    assert extract_answer("no answer") is None


def test_sys_is_an_in_program_stand_in_in_every_layout(data, judge):
    he = load_benchmark("humaneval", [data / "HumanEval.jsonl.gz"])
    lcb = load_benchmark("livecodebench", [data / "livecodebench/test.jsonl"])
    outcomes = judge.judge([
        (he[0], "import sys\ndef double(x):\n    sys.setrecursionlimit(10 ** 6)\n    return min(2 * x, sys.maxsize)\n"),
        (lcb[1], "from sys import maxsize\nclass Solution:\n    def maxPair(self, nums, k):\n        return sorted(nums)[-k:] if maxsize else []\n"),
        (lcb[0], "from sys import stdin\nn = int(stdin.readline())\nprint(sum(list(map(int, stdin.readline().split()))[:n]))\n"),
    ])
    assert [o.passed for o in outcomes] == [True, True, True], outcomes


def test_the_benchmark_profile_allows_benchmark_modules_and_nothing_more(judge, tmp_path):
    from evaluation.datasets import CodeProblem

    # HumanEval/162-style: the reference needs hashlib, outside the self-play allow-list
    problem = CodeProblem("humaneval", "md5/0", "check", 'def string_to_md5(text):\n    """md5 hex digest."""\n', "md5:1",
                          entry_point="string_to_md5", prefix='def string_to_md5(text):\n    """md5 hex digest."""\n',
                          reference='def string_to_md5(text):\n    import hashlib\n    return hashlib.md5(text.encode()).hexdigest()\n',
                          test="def check(candidate):\n    assert candidate('abc') == '900150983cd24fb0d6963f7d28e17f72'\n")
    canary = tmp_path / "canary.txt"
    canary.write_text("precious")
    outcomes = judge.judge([
        (problem, problem.reference),
        (problem, "import random, time, datetime\ndef string_to_md5(text):\n    return str(random.random() + time.time())\n"),
        (problem, f"import io\ndef string_to_md5(text):\n    return io.open({str(canary)!r}, 'w').write('x')\n"),
        (problem, "import random\ndef string_to_md5(text):\n    return random._os.system('id')\n"),
        (problem, "import shutil\ndef string_to_md5(text):\n    return 'x'\n"),
    ])
    assert outcomes[0].passed, outcomes[0]
    assert outcomes[1].reason.startswith("runtime_error: AssertionError"), outcomes[1]
    assert [o.reason.split(":")[0] for o in outcomes[2:]] == ["forbidden"] * 3, outcomes
    assert canary.read_text() == "precious"


def test_eval_of_arithmetic_in_the_benchmark_profile(judge):
    from evaluation.datasets import CodeProblem

    # HumanEval/160-style: the reference builds an expression and evals it
    prompt = 'def do_algebra(ops, nums):\n    """Evaluate nums joined by ops."""\n'
    reference = prompt + "    text = str(nums[0])\n    for op, n in zip(ops, nums[1:]):\n        text += op + str(n)\n    return eval(text)\n"
    problem = CodeProblem("humaneval", "alg/0", "check", prompt, "alg:1", entry_point="do_algebra", prefix=prompt, reference=reference,
                          test="def check(candidate):\n    assert candidate(['+', '*', '-'], [2, 3, 4, 5]) == 9\n"
                               "    assert candidate(['**', '//'], [2, 3, 3]) == 2\n")
    outcomes = judge.judge([
        (problem, reference[len(prompt):]),
        (problem, "def do_algebra(ops, nums):\n    return eval(\"__import__('os').getpid()\")\n"),
        (problem, "def do_algebra(ops, nums):\n    return exec('1')\n"),
    ])
    assert outcomes[0].passed, outcomes[0]
    assert outcomes[1].reason.startswith("runtime_error: ValueError: eval here reads arithmetic only"), outcomes[1]
    assert outcomes[2].reason.startswith("forbidden"), outcomes[2]
