"""HumanEval+ / MBPP+ judged as evalplus main @ 26d6d00 judges them (``evaluation.evalplus_rules``):
every special oracle, the float rules, per-input time limits, base and plus verdicts, the reference
cache and data errors, and the sanitiser. Every file is written here in the release layout; every
program runs in the real sandbox."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from evaluation import evalplus_rules as rules
from evaluation.code_judge import CodeJudge, JudgeLimits
from evaluation.datasets import load_benchmark
from evaluation.harness import oracle
from evaluation.references import file_digest
from evaluation.sanitize import longest_parseable, sanitize
from evaluation_files import write_jsonl


def row(task_id: str, entry: str, solution: str, base: list, plus: list, atol: float = 0, prompt: str = "") -> dict:
    return {"task_id": task_id, "prompt": prompt or f'"""\nTask {task_id}.\n"""\n', "entry_point": entry, "canonical_solution": solution,
            "base_input": base, "plus_input": plus, "atol": atol, "contract": ""}


MBPP_ROWS = [
    # set-compared (MBPP_OUTPUT_SET_EQ_TASKS); Mbpp/7's reference returns a list in one order
    row("Mbpp/7", "find_char_long", "import re\ndef find_char_long(text):\n    return re.findall(r'\\b\\w{4,}\\b', text)\n",
        [["Please move back to stream"]], [["Jing Eco and Tech"]]),
    # not None (MBPP_OUTPUT_NOT_NONE_TASKS): the reference returns a match object or None
    row("Mbpp/737", "check_str", "import re\ndef check_str(string):\n    return re.search('^[aeiouAEIOU][A-Za-z0-9_]*', string)\n",
        [["annie"], ["dawood"]], [["Else"]]),
    # alternative answers
    row("Mbpp/295", "sum_div", "def sum_div(number):\n    return sum(d for d in range(1, number) if number % d == 0)\n", [[8], [12]], [[7]]),
    row("Mbpp/164", "are_equivalent", "def are_equivalent(a, b):\n    return a == b\n", [[36, 57]], [[2, 4]]),
    row("Mbpp/581", "surface_Area", "def surface_Area(b, s):\n    return 2 * b * s + b ** 2\n", [[3, 4]], [[4, 5]]),
    row("Mbpp/558", "digit_distance_nums",
        "def digit_distance_nums(n1, n2):\n    return sum(abs(int(a) - int(b)) for a, b in zip(str(n1), str(n2)))\n",
        [[123, 256]], [[123, 45]]),
    # a tolerance from the row: allclose(rtol=1e-7, atol) after the same type and length
    row("Mbpp/900", "halves", "def halves(xs):\n    return [x / 2 for x in xs]\n", [[[1, 2, 3]]], [[[10, 20]]], atol=1e-3),
    # slow on one plus input only (a per-input limit catches it)
    row("Mbpp/901", "square", "def square(n):\n    return n * n\n", [[2], [3]], [[4], [7], [5]]),
    # non-finite inputs and outputs (written as inf in programs and reprs)
    row("Mbpp/905", "clamp", "def clamp(x):\n    return x if x < 10 else float('inf')\n", [[5.0], [20.0]], [[float("inf")]]),
    # a dict output (a Counter compares equal to it, as in evalplus)
    row("Mbpp/906", "freq", "def freq(xs):\n    out = {}\n    for x in xs:\n        out[x] = out.get(x, 0) + 1\n    return out\n",
        [[[1, 1, 2]]], [[["a", "b", "a"]]]),
    # a reference that fails on its own input: a data error of this task only
    row("Mbpp/902", "inverse", "def inverse(x):\n    return 1 / x\n", [[2]], [[0]]),
]

HE_POLY = ("import math\n\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n"
           'def find_zero(xs):\n    """A zero of the polynomial with coefficients xs."""\n')
HE_ROWS = [
    row("HumanEval/32", "find_zero",
        "    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > 0:\n        lo, hi = 2 * lo, 2 * hi\n"
        "    for _ in range(100):\n        mid = (lo + hi) / 2\n        if poly(xs, mid) * poly(xs, lo) > 0:\n            lo = mid\n"
        "        else:\n            hi = mid\n    return lo\n",
        [[[1, 2]], [[-6, 11, -6, 1]]], [[[5, -1]]], atol=1e-6, prompt=HE_POLY),
]

# (task id, answer, passes): right answers that only the task's special rule accepts, and wrong ones
CASES = [
    ("Mbpp/7", "def find_char_long(text):\n    return sorted(w for w in text.split() if len(w) >= 4)[::-1]\n", True),
    ("Mbpp/7", "def find_char_long(text):\n    return [w for w in text.split() if len(w) >= 3]\n", False),
    ("Mbpp/7", "def find_char_long(text):\n    return (w for w in text.split() if len(w) >= 4)\n", True),  # set(generator)
    ("Mbpp/737", "import re\ndef check_str(s):\n    return re.match('[aeiouAEIOU]', s)\n", True),  # a match object is not None
    ("Mbpp/737", "def check_str(s):\n    return 'yes' if s[0] in 'aeiouAEIOU' else None\n", True),
    ("Mbpp/737", "def check_str(s):\n    return s[0] in 'aeiouAEIOU'\n", True),  # a bool must equal "not None"
    ("Mbpp/737", "def check_str(s):\n    return s[0] not in 'aeiouAEIOU'\n", False),
    ("Mbpp/737", "def check_str(s):\n    return 'always'\n", False),
    ("Mbpp/295", "def sum_div(n):\n    return 0\n", True),  # evalplus accepts 0 besides the sum
    ("Mbpp/295", "def sum_div(n):\n    return sum(d for d in range(1, n + 1) if n % d == 0)\n", False),
    ("Mbpp/164", "def are_equivalent(a, b):\n    return 'anything'\n", True),
    ("Mbpp/164", "def are_equivalent(a, b):\n    return 1 / 0\n", False),  # an exception still fails
    ("Mbpp/581", "import math\ndef surface_Area(b, h):\n    return round(b * b + 2 * b * math.sqrt((b / 2) ** 2 + h * h))\n", True),
    ("Mbpp/581", "def surface_Area(b, h):\n    return b * b\n", False),
    ("Mbpp/558", "def digit_distance_nums(a, b):\n    x, y = str(a), str(b)\n    w = max(len(x), len(y))\n"
     "    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(w), y.zfill(w)))\n", True),
    ("Mbpp/558", "def digit_distance_nums(a, b):\n    return abs(a - b)\n", False),
    ("Mbpp/900", "def halves(xs):\n    return [x / 2 + 5e-4 for x in xs]\n", True),
    ("Mbpp/900", "def halves(xs):\n    return tuple(x / 2 for x in xs)\n", False),  # same type first
    ("Mbpp/900", "def halves(xs):\n    return [x / 2 + 5e-3 for x in xs]\n", False),
    # Newton from 10 finds the root 3 of (x-1)(x-2)(x-3) where the reference finds 1: only |poly(xs, out)| <= atol accepts it
    ("HumanEval/32", "def find_zero(xs):\n    x = 10.0\n    for _ in range(100):\n"
     "        d = sum(i * c * x ** (i - 1) for i, c in enumerate(xs) if i)\n"
     "        x = x - sum(c * x ** i for i, c in enumerate(xs)) / d\n    return x\n", True),
    ("HumanEval/32", "def find_zero(xs):\n    return 0.123\n", False),
    ("Mbpp/905", "import math\ndef clamp(x):\n    return x if x < 10 else math.inf\n", True),
    ("Mbpp/905", "def clamp(x):\n    return min(x, 1e308)\n", False),
    ("Mbpp/906", "from collections import Counter\ndef freq(xs):\n    return Counter(xs)\n", True),
    ("Mbpp/906", "def freq(xs):\n    return sorted(set(xs))\n", False),
    # equal to everything in its own process; sent as the int it is (evalplus, comparing in-process, accepts it)
    ("Mbpp/901", "class Eq(int):\n    def __eq__(self, other):\n        return True\ndef square(n):\n    return Eq(0)\n", False),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("evalplus")
    return {"mbpp+": write_jsonl(root / "MbppPlus.jsonl", MBPP_ROWS), "humaneval+": write_jsonl(root / "HumanEvalPlus.jsonl.gz", HE_ROWS, gz=True)}


@pytest.fixture(scope="module")
def problems(files) -> dict[str, object]:
    return {p.task_id: p for name, path in files.items() for p in load_benchmark(name, [path])}


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with CodeJudge(JudgeLimits(floor_s=0.25, factor=4.0, workers=2, cache_dir=cache)) as j:
        yield j


def test_every_special_rule_accepts_the_right_answer_and_rejects_the_wrong_one(problems, judge):
    outcomes = judge.judge([(problems[task], sanitize(f"```python\n{code}```", problems[task].entry_point)) for task, code, _ in CASES])
    got = [(task, o.passed) for (task, _, _), o in zip(CASES, outcomes)]
    assert got == [(task, ok) for task, _, ok in CASES], [(t, o.reason) for (t, _, _), o in zip(CASES, outcomes)]
    assert all(o.base_passed is not None for o in outcomes)


def test_oracle_is_100_percent_and_the_reference_data_error_is_named(problems, judge):
    score = oracle(list(problems.values()), judge, None)
    assert score["data_errors"] == ["Mbpp/902"]
    assert score["n"] == len(MBPP_ROWS) + len(HE_ROWS)
    assert score["pass@1"] == score["base_pass@1"] == pytest.approx((score["n"] - 1) / score["n"])
    failing = [t for t in score["tasks"] if not t["passed"][0]]
    assert [t["task_id"] for t in failing] == ["Mbpp/902"]
    assert "data error" in failing[0]["reasons"][0] and "ZeroDivisionError" in failing[0]["reasons"][0]


def test_each_input_has_its_own_limit_and_the_first_one_over_it_is_named(problems, judge):
    slow = ("import time\ndef square(n):\n    start = time.perf_counter()\n"
            "    while n == 7 and time.perf_counter() - start < 0.6:\n        pass\n    return n * n\n")  # 0.6 s > its 0.25 s limit
    wrong_plus = "def square(n):\n    return n * n if n < 4 else 0\n"
    late_error = "def square(n):\n    return n * n if n != 3 else None.x\n"
    slow_out, wrong_out, error_out = judge.judge([(problems["Mbpp/901"], slow), (problems["Mbpp/901"], wrong_plus),
                                                  (problems["Mbpp/901"], late_error)])
    assert (slow_out.base_passed, slow_out.passed) == (True, False)
    assert slow_out.reason.startswith("time limit: plus input 1 took"), slow_out.reason
    base_limits, plus_limits = judge.limits_of(problems["Mbpp/901"])
    assert len(base_limits) == 2 and len(plus_limits) == 3 and min(base_limits + plus_limits) >= 0.25
    assert (wrong_out.base_passed, wrong_out.passed) == (True, False) and wrong_out.reason == "wrong answer on plus input 0: got 0"
    assert (error_out.base_passed, error_out.passed) == (False, False)
    assert error_out.reason.startswith("runtime error on base input 1: AttributeError")


def test_the_input_that_never_returns_is_named_by_running_each_input_of_its_part_alone(tmp_path):
    """A call that never returns leaves nothing from its process; only then is the hung part re-run
    input by input, each alone under its own limit, stopping at the first that times out."""
    path = write_jsonl(tmp_path / "MbppPlus.jsonl", [row("Mbpp/903", "double", "def double(n):\n    return 2 * n\n",
                                                         [[1], [2]], [[3], [5], [7]])])
    [p] = load_benchmark("mbpp+", [path])
    plus_hang = "def double(n):\n    if n == 5:\n        while True:\n            pass\n    return 2 * n\n"  # plus input 1
    base_hang = "def double(n):\n    if n == 2:\n        while True:\n            pass\n    return 2 * n\n"  # base input 1
    with CodeJudge(JudgeLimits(floor_s=0.1, factor=4.0, workers=3, cache_dir=tmp_path / "cache")) as judge:
        judge.prepare([p])
        runs: list[int] = []
        execute = judge._execute
        judge._execute = lambda batch, role="candidate": (runs.append(len(batch)) if batch else None) or execute(batch, role)  # processes per batch
        right, wrong = judge.judge([(p, "def double(n):\n    return n + n\n"), (p, "def double(n):\n    return 3 * n\n")])
        assert (right.passed, wrong.passed) == (True, False) and runs == [2]  # no timeout: one process per task
        runs.clear()
        plus_out, base_out = judge.judge([(p, plus_hang), (p, base_hang)])
    assert (plus_out.base_passed, plus_out.passed) == (True, False)
    assert plus_out.reason == "time limit: plus input 1 did not return within its limit of 0.1 s", plus_out.reason
    assert (base_out.base_passed, base_out.passed) == (False, False)
    assert base_out.reason == "time limit: base input 1 did not return within its limit of 0.1 s", base_out.reason
    # both runs, both base re-runs (the plus hang keeps its base verdict), then per round one input of
    # each task still searched: (plus 0, base 0), (plus 1, base 1: both hang); nothing after the input that hung
    assert runs == [2, 2, 2, 2]



# -- what a candidate can see ------------------------------------------------------------------------

# Looks where expected outputs used to be (globals of its own module named _EP_EXP*, any public global
# list as long as the base inputs), then the module's own _EP names (the scan works: it sees the inputs).
HUNTER = """import dataclasses
_seen = []
def tag(n):
    k = len(_seen)
    _seen.append(n)
    try:
        return _EP_EXP_BASE[k]
    except NameError:
        pass
    try:
        return _EP_EXP_PLUS[k - 2]
    except NameError:
        pass
    main = dataclasses.sys.modules['__main__']
    for name in dir(main):
        value = getattr(main, name) if not name.startswith('_') else None
        if isinstance(value, list) and len(value) == 2 and value is not _seen:
            return value[k % 2]
    return sorted(name for name in dir(main) if name.startswith('_EP'))
"""
GC_HUNTER = """import dataclasses
def tag(n):
    gc = dataclasses.sys.modules.get('gc') or __import__('gc')
    for obj in gc.get_objects():
        if isinstance(obj, list) and len(obj) == 2 and all(isinstance(v, str) for v in obj):
            return obj[0]
    return None
"""


def test_no_expected_output_enters_a_candidates_process(tmp_path):
    """The candidate's programs hold its code, the inputs and the limits only: a candidate that
    hunts its own process for the expected outputs finds nothing and is judged wrong; an honest one
    passes; references ran on verifiers no candidate used."""
    path = write_jsonl(tmp_path / "MbppPlus.jsonl", [row("Mbpp/904", "tag", "def tag(n):\n    return 'sealed-' + str(n * 7919)\n",
                                                         [[1], [2]], [[3]])])
    [p] = load_benchmark("mbpp+", [path])
    secrets = ["'sealed-7919'", "'sealed-15838'", "'sealed-23757'"]
    with CodeJudge(JudgeLimits(floor_s=0.25, workers=2, cache_dir=tmp_path / "cache")) as judge:
        programs: list[tuple[str, str]] = []
        execute = judge._execute

        def spy(batch, role="candidate"):  # records what each role's verifiers get, then runs it
            programs.extend((role, program) for program, _ in batch)
            return execute(batch, role)

        judge._execute = spy
        honest, hunter, gc_hunter = judge.judge([(p, "def tag(n):\n    return 'sealed-' + str(7919 * n)\n"), (p, HUNTER), (p, GC_HUNTER)])
        roles = {role: {id(v) for (r, _), v in judge._verifiers.items() if r == role} for role in ("reference", "candidate")}
    assert honest.passed, honest
    assert (hunter.passed, hunter.base_passed) == (False, False)
    assert hunter.reason.startswith("wrong answer on base input 0: got ['_EP_BASE', '_EP_FN'"), hunter.reason
    assert "EXP" not in hunter.reason
    assert not gc_hunter.passed and gc_hunter.reason.startswith("forbidden"), gc_hunter  # gc introspection ends the run
    candidates = [program for role, program in programs if role == "candidate"]
    assert len(candidates) == 3 and [role for role, _ in programs] == ["reference"] + ["candidate"] * 3
    assert not any(secret in program for program in candidates for secret in secrets)
    assert roles["reference"] and roles["candidate"] and not roles["reference"] & roles["candidate"]



def test_the_caller_judges_what_a_program_returns_and_refuses_other_shapes():
    """``evalplus_rules.verdict``: values compared input by input; a result the program does not
    write (the candidate controls its own process) is refused, never a pass."""
    inputs, expected = ([[1], [2]], [[3]]), ([1, 4], [9])
    assert rules.verdict(((["1", "4"], None), (["9"], None)), "Mbpp/1", "sq", 0, inputs, expected) == ("plus", "pass")
    assert rules.verdict(((["1", "5"], None), (["9"], None)), "Mbpp/1", "sq", 0, inputs, expected) == ("base", "wrong", 1, "5")
    assert rules.verdict(((["1", "<sq object>"], None), (["9"], None)), "Mbpp/1", "sq", 0, inputs, expected)[3] == "<sq object>"
    # a wrong value before the input that stopped the part is the verdict
    assert rules.verdict(((["2"], ("time", 1, 3.0, 1.0)),), "Mbpp/1", "sq", 0, inputs, expected) == ("base", "wrong", 0, "2")
    assert rules.verdict(((["1"], ("time", 1, 3.0, 1.0)),), "Mbpp/1", "sq", 0, inputs, expected) == ("base", "time", 1, 3.0, 1.0)
    forged = [((["1", "4"], None),), ((["1", "4", "9"], None), ([], None)), ((["1"], ("time", 0, 3.0, 1.0)),),
              ((["1"], ("pass",)),), (("1", None),), "pass", ((["1", "4"], None), (["9"], ("error", 1, "x")))]
    for value in forged:
        with pytest.raises(rules.MalformedResult):
            rules.verdict(value, "Mbpp/1", "sq", 0, inputs, expected)
    # reprs of non-finite floats read back; each NaN is its own object, as across processes
    assert rules.read_value("[-inf, (1+infj)]") == [float("-inf"), complex(1, float("inf"))]
    assert rules.read_value("[nan]") != rules.read_value("[nan]")
    # numpy's broadcasting, bounded: an (n, 1) answer to an (n,) float list is compared pair by pair only when small
    assert rules.allclose([[1.0]] * 3, [1.0] * 3, rules.ALLCLOSE_RTOL, 1e-6)
    big = 2 * rules.BROADCAST_BOUND  # numpy: True after 4e8 pairs (minutes in Python); here refused at once
    start = time.perf_counter()
    assert not rules.allclose([[1.0]] * big, [1.0] * big, rules.ALLCLOSE_RTOL, 1e-6)
    assert time.perf_counter() - start < 10.0

def colliding(k: int, collide: bool) -> str:
    """Python source of the k-th complex number of a family whose hashes all collide (``collide``)
    or not: hash(a + bj) = hash(a) + 1000003 hash(b)."""
    return f"complex(1000003 * {k}, {'-' if collide else ''}{k})"


def test_hash_colliding_outputs_are_judged_wrong_in_bounded_time(problems, tmp_path):
    """A list of 40,000 values of one hash for a set-compared task (the caller makes it a set), and
    an object whose repr is such a set: both wrong, in about the time the same sizes take without
    collisions (building those two sets unbounded takes over a minute on this machine)."""
    n = 40_000

    def answers(collide: bool) -> list:
        as_list = f"def find_char_long(text):\n    return [{colliding('k', collide)} for k in range(2, {n + 2})]\n"
        as_repr = ("class Shown:\n    def __repr__(self):\n"
                   f"        return '{{' + ', '.join(repr({colliding('k', collide)}) for k in range(2, {n + 2})) + '}}'\n"
                   "def square(n):\n    return Shown()\n")
        return [(problems["Mbpp/7"], as_list), (problems["Mbpp/901"], as_repr)]

    with CodeJudge(JudgeLimits(floor_s=2.0, workers=2, cache_dir=tmp_path)) as judge:
        judge.prepare([problems["Mbpp/7"], problems["Mbpp/901"]])
        start = time.perf_counter()
        control = judge.judge(answers(collide=False))
        control_s = time.perf_counter() - start
        start = time.perf_counter()
        hostile = judge.judge(answers(collide=True))
        hostile_s = time.perf_counter() - start
    assert not any(o.passed for o in control + hostile)
    assert hostile[0].reason.startswith("wrong answer on base input 0: got comparing raised LiteralError"), hostile[0].reason
    assert "one hash value" in hostile[0].reason
    assert hostile[1].reason.startswith("wrong answer on base input 0: got {(2000006-2j), "), hostile[1].reason
    assert hostile_s < 2 * control_s + 2.0, (hostile_s, control_s)  # unbounded: over a minute here


def test_reference_times_are_cached_by_the_file_hash(files, tmp_path):
    problems = load_benchmark("mbpp+", [files["mbpp+"]])
    with CodeJudge(JudgeLimits(floor_s=0.25, workers=2, cache_dir=tmp_path)) as first:
        first.prepare(problems)
        assert first.measured == len(problems)
    cached = json.loads((tmp_path / "references" / f"{file_digest(files['mbpp+'])}.json").read_text())["tasks"]
    assert set(cached) == {p.task_id for p in problems} and "ZeroDivisionError" in cached["Mbpp/902"]["error"]
    assert cached["Mbpp/737"]["expected_base"] == "[True, False]"  # not None, as evalplus records it
    with CodeJudge(JudgeLimits(floor_s=0.25, workers=2, cache_dir=tmp_path)) as second:
        second.prepare(problems)
        assert second.measured == 0 and second.limits_of(problems[0]) == first.limits_of(problems[0])
        assert set(second.data_errors) == {problems[-1].source}
    edited = write_jsonl(tmp_path / "MbppPlus.jsonl", MBPP_ROWS[:1])  # another file: measured again
    with CodeJudge(JudgeLimits(floor_s=0.25, workers=2, cache_dir=tmp_path)) as third:
        third.prepare(load_benchmark("mbpp+", [edited]))
        assert third.measured == 1


# -- the sanitiser ---------------------------------------------------------------------------------


def brute_force_window(text: str) -> str:
    """evalplus's rule 1 by trying every (start, end) pair in order."""
    import ast
    import re

    lines = re.sub(r"\x1b(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])", "", text).split("\n")
    best, pair = 0, (0, 0)
    for i in range(len(lines)):
        for j in range(i + 1, len(lines)):
            try:
                ast.parse("\n".join(lines[i : j + 1]))
            except SyntaxError:
                continue
            count = sum(1 for line in lines[i : j + 1] if line.strip())
            if count > best:
                best, pair = count, (i, j)
    return "\n".join(lines[pair[0] : pair[1] + 1])


RESPONSES = [
    "Here is the code:\n```python\nimport math\n\ndef f(x):\n    return helper(x) + math.pi\n\ndef helper(y):\n    return y\n\n\n"
    "def unused():\n    return 0\n\nprint(f(1))\n```\nDone.",
    "```python\ndef g(a):\n    return a\n```\n\nand a second block\n```python\nx = 1\ny = 2\nz = 3\nw = 4\n```\n",
    "\x1b[32mdef f(x):\x1b[0m\n    return x\n",
    "no code at all\njust words\n",
    "def f(x):\n    return x\n\n\n\nfoo(\n",
    "a\n\n\ndef f():\n    return 1\n\n\n\n",
]


@pytest.mark.parametrize("text", RESPONSES)
def test_the_window_is_the_one_evalplus_picks(text):
    assert longest_parseable(text) == brute_force_window(text)


def test_sanitize_keeps_imports_and_what_the_entry_point_reaches():
    assert sanitize(RESPONSES[0], "f") == "import math\ndef f(x):\n    return helper(x) + math.pi\ndef helper(y):\n    return y"
    assert sanitize(RESPONSES[1], "g") == "x = 1\ny = 2\nz = 3\nw = 4"  # the longer block wins; g is not in it
    assert sanitize(RESPONSES[2], "f") == "def f(x):\n    return x"  # ANSI escapes removed
    code = ("import functools\n@functools.cache\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
            "def solve(n):\n    return fib(n)\nK = 3\nK = 4\ndef no_return(n):\n    print(n)\nif __name__ == '__main__':\n    solve(3)\n")
    # decorated definitions are dropped (evalplus's tree-sitter sees a decorated_definition); the first K stays
    assert sanitize(code, None) == "import functools\ndef solve(n):\n    return fib(n)\nK = 3"
    assert sanitize("def f(:\n  pass\nok", "f") == "def f(:"  # nothing parses: the first line
