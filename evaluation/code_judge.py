"""Judging code answers in the verifier's sandbox (``verifier.sandbox.Verifier``), one process per run.

Each run is a program the sandbox executes as ``f()`` in its own confined process with every layer
of the sandbox on (module allow-list, restricted builtins, audit hook, rlimits, namespaces,
Landlock, seccomp). The benchmark profile is built *inside the program*, never by loosening the
sandbox: stdin and stdout are in-program objects (``input``, ``print``, a ``sys`` stand-in with
``stdin``/``stdout``), and the test data are written into the program as Python literals. So files,
network and processes stay out exactly as for self-play programs; what the allow-list refuses
(``hashlib``, ``eval``, ``os``...) is judged FORBIDDEN, with the reason recorded.

Runs per layout:

- evalplus: the reference runs once per task on every input (expected outputs and its wall time
  per input, cached by the file's hash: ``references``); a candidate (``sanitize``d like evalplus
  does) then runs once per task, base inputs then plus inputs, each call timed in that process
  against its own limit ``max(floor_s, factor * t_ref)``, a part stopping at an exception or a
  time-over; the program returns each output's repr, and **this process** reads them
  (``evalplus_rules.read_value``, bounded) and judges them by evalplus's rules
  (``evalplus_rules.verdict``), stopping at the first failing input, which the reason names. Only
  when that run is killed at its outside deadline (a call that never returns): its base part alone
  again (the base verdict), then the hung part's inputs one sandboxed run each, under each input's
  own limit, until one is killed, which the reason names (at most that part's inputs more runs,
  for that task only: ``_name_hung_inputs``).
- check / mbpp_asserts: ``prefix + candidate + test`` then ``check(entry_point)`` / the asserts.
- livecodebench: one run per test; functional tests call the function (or ``Solution().method``)
  and compare as JSON values (tuples as lists); stdin tests compare stdout line by line after
  stripping, a line also matching when its whitespace-separated tokens are equal as decimals. The
  comparison happens here, on the run's value read with ``verifier.literals``.

What a candidate can see. References run on verifiers of their own (``ROLES``: a verifier's pool,
fork servers and zygote only ever run one role's programs). For the evalplus and LiveCodeBench
layouts no expected output enters a candidate's process: its program holds the candidate's code,
the inputs and the per-input time limits, and the values it returns are compared here. The check
and mbpp_asserts layouts are the one exception: like the official harnesses (HumanEval's
``check(candidate)``, MBPP's ``assert`` lines) they run the benchmark's own test code in the
candidate's process, with the expected values written in it. That test code is arbitrary Python
(loops, helpers, computed expectations), not data this judge could pull apart and compare outside,
so a candidate there can read what its tests expect; scores of those two layouts assume answers that
do not look.

Time limit of a run: evalplus layout: the sum of its inputs' limits (``evalplus_rules.part_deadline``
per part) killed from outside; other layouts: ``max(floor_s, factor * t_ref)`` for the whole run,
``floor_s`` where there is no reference (LiveCodeBench: ``livecodebench_timeout_s``).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

from evaluation import evalplus_rules as rules
from evaluation.datasets import CodeProblem
from evaluation.references import Reference, ReferenceCache
from verifier import literals
from verifier.guard import BENCHMARK_MODULES
from verifier.sandbox import ExecResult, Verifier


@dataclass(frozen=True)
class JudgeLimits:
    """Limits. evalplus: floor 4 s, factor 4, 4 GiB (``evalplus_rules``; AZR: 10 s and 8);
    LiveCodeBench 6 s per test. ``cache_dir``: where reference times are cached (default
    ``references.cache_root()``)."""

    floor_s: float = rules.MIN_TIME_LIMIT_S
    factor: float = rules.TIME_LIMIT_FACTOR
    livecodebench_timeout_s: float = 6.0
    memory_mb: int = rules.MEMORY_MB
    workers: int | None = None
    cache_dir: Path | None = None


@dataclass(frozen=True)
class Outcome:
    """A sample's verdict; ``base_passed`` is set for evalplus-layout tasks (``passed`` is then plus)."""

    passed: bool
    reason: str = ""
    base_passed: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "base_passed": self.base_passed}


def deadline_key(seconds: float) -> int:
    """Outside deadlines share verifiers: whole seconds up to 8 s, then powers of two."""
    whole = max(1, math.ceil(seconds))
    return whole if whole <= 8 else 1 << (whole - 1).bit_length()


MAX_CHARS = 20_000_000

LCB_IMPORTS = (
    "from typing import List, Dict, Tuple, Optional, Set\n"
    "import math, heapq, bisect, itertools, functools, collections, string, re\n"
    "from collections import deque, defaultdict, Counter, OrderedDict\n"
    "from functools import lru_cache, reduce\n"
    "from itertools import accumulate, permutations, combinations, product\n"
    "from heapq import heappush, heappop, heapify\n"
    "from bisect import bisect_left, bisect_right\n"
)

FLOAT_LITERALS = "inf = float('inf')\nnan = float('nan')\n"


STDIO = '''
class _Input:
    def __init__(self, text):
        self.text = text
        self.pos = 0
        self.buffer = _Bytes(self)
    def read(self, size=-1):
        end = len(self.text) if size is None or size < 0 else self.pos + size
        out = self.text[self.pos:end]
        self.pos += len(out)
        return out
    def readline(self, size=-1):
        end = self.text.find("\\n", self.pos)
        end = len(self.text) if end < 0 else end + 1
        out = self.text[self.pos:end]
        self.pos = end
        return out
    def readlines(self):
        return [line + "\\n" for line in self.read().split("\\n")]
    def __iter__(self):
        return iter(self.readlines())
class _Bytes:
    def __init__(self, source):
        self.source = source
    def read(self, size=-1):
        return self.source.read(size).encode()
    def readline(self, size=-1):
        return self.source.readline().encode()
    def readlines(self):
        return [line.encode() for line in self.source.readlines()]
class _Output:
    def __init__(self):
        self.parts = []
    def write(self, text):
        self.parts.append(str(text))
        return len(str(text))
    def flush(self):
        return None
    def getvalue(self):
        return "".join(self.parts)
class _Sys:
    maxsize = 9223372036854775807
    argv = [""]
    def __init__(self, text):
        self.stdin = _Input(text)
        self.stdout = _Output()
        self.stderr = _Output()
    def setrecursionlimit(self, n):
        return None
    def exit(self, code=None):
        raise SystemExit(code)
sys = _Sys(_STDIN)
def input(prompt=""):
    line = sys.stdin.readline()
    if not line:
        raise EOFError("EOF when reading a line")
    return line[:-1] if line.endswith("\\n") else line
def print(*args, sep=" ", end="\\n", file=None, flush=False):
    (file or sys.stdout).write(sep.join(str(a) for a in args) + end)
def exit(code=None):
    raise SystemExit(code)
quit = exit
'''


# ``eval`` for benchmark code that evaluates arithmetic it built itself (HumanEval/160): an in-program
# function (the builtin stays refused), reading only numbers, + - * / // % **, unary signs and
# parentheses; anything else raises ValueError.
EXPRESSION_EVAL = '''
def eval(text, *namespaces):
    import re as _re
    tokens = _re.findall(r"\\d+\\.\\d*(?:[eE][-+]?\\d+)?|\\d+(?:[eE][-+]?\\d+)?|\\*\\*|//|[-+*/%()]|\\S", str(text))
    pos = [0]
    def peek():
        return tokens[pos[0]] if pos[0] < len(tokens) else None
    def take():
        pos[0] += 1
        return tokens[pos[0] - 1] if pos[0] <= len(tokens) else None
    def atom():
        t = take()
        if t == "(":
            v = expr()
            if take() != ")":
                raise ValueError("unbalanced parentheses")
            return v
        if t is not None and t[0].isdigit():
            return float(t) if ("." in t or "e" in t or "E" in t) else int(t)
        raise ValueError("eval here reads arithmetic only, not " + repr(t))
    def unary():
        if peek() in ("+", "-"):
            return -unary() if take() == "-" else unary()
        return power()
    def power():
        base = atom()
        if peek() == "**":
            take()
            return base ** unary()
        return base
    def term():
        v = unary()
        while peek() in ("*", "/", "//", "%"):
            op = take()
            r = unary()
            v = v * r if op == "*" else v / r if op == "/" else v // r if op == "//" else v % r
        return v
    def expr():
        v = term()
        while peek() in ("+", "-"):
            v = v + term() if take() == "+" else v - term()
        return v
    value = expr()
    if peek() is not None:
        raise ValueError("eval here reads arithmetic only, not " + repr(peek()))
    return value
'''


def with_expression_eval(code: str) -> str:
    """``code`` preceded by the arithmetic-only ``eval`` when it calls ``eval``."""
    return EXPRESSION_EVAL + code if re.search(r"\beval\s*\(", code) else code


def _indent(code: str, prefix: str = "    ") -> str:
    return "".join(prefix + line if line.strip() else line for line in code.splitlines(True))


class _SysImports(ast.NodeTransformer):
    """``import sys`` binds the in-program ``sys`` stand-in; ``from sys import x`` becomes ``x = sys.x``."""

    def visit_Import(self, node: ast.Import) -> Any:
        kept = [a for a in node.names if a.name != "sys"]
        extra = [ast.Assign([ast.Name(a.asname, ast.Store())], ast.Name("sys", ast.Load())) for a in node.names if a.name == "sys" and a.asname]
        out: list[ast.stmt] = ([ast.Import(kept)] if kept else []) + extra
        return out or ast.Pass()

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        if node.module != "sys" or node.level:
            return node
        return [ast.Assign([ast.Name(a.asname or a.name, ast.Store())], ast.Attribute(ast.Name("sys", ast.Load()), a.name, ast.Load()))
                for a in node.names] or ast.Pass()


def imports_sys(tree: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Import) and any(a.name == "sys" for a in n.names)) or (isinstance(n, ast.ImportFrom) and n.module == "sys")
        for n in ast.walk(tree)
    )


def with_sys_standin(code: str) -> str:
    """``code`` with ``import sys`` bound to the in-program stand-in (empty stdin), when it imports sys;
    otherwise unchanged. The sandbox refuses the real ``sys``."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return code  # the sandbox reports the syntax error
    if not imports_sys(tree):
        return code
    future = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    body = _SysImports().visit(ast.Module(body=[s for s in tree.body if s not in future] or [ast.Pass()], type_ignores=[]))
    head = "".join(ast.unparse(s) + "\n" for s in future)
    return f"{head}_STDIN = ''\n{STDIO}\n{ast.unparse(ast.fix_missing_locations(body))}\n"


def stdin_program(code: str, stdin: str) -> str | None:
    """A program whose ``f()`` returns what ``code`` prints when fed ``stdin`` (None: not Python).

    The candidate's statements stay at module level (its globals keep working) inside a
    ``try: ... except SystemExit: pass``; ``__future__`` imports move to the top."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return None
    future = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    body = [s for s in tree.body if s not in future]
    tree = _SysImports().visit(ast.Module(body=body or [ast.Pass()], type_ignores=[]))
    wrapped = ast.Try(body=tree.body, handlers=[ast.ExceptHandler(ast.Name("SystemExit", ast.Load()), None, [ast.Pass()])],
                      orelse=[], finalbody=[])
    candidate = ast.unparse(ast.fix_missing_locations(ast.Module(body=[wrapped], type_ignores=[])))
    head = "".join(ast.unparse(s) + "\n" for s in future)
    return f"{head}{LCB_IMPORTS}_STDIN = {stdin!r}\n{STDIO}\n{candidate}\n\ndef f():\n    return sys.stdout.getvalue()\n"


def functional_program(code: str, func_name: str, args: list[Any]) -> str:
    """A program whose ``f()`` calls the candidate's ``func_name`` (on ``Solution()`` when the code
    defines that class) with ``args`` and returns the value with tuples as lists."""
    call = f"Solution().{func_name}" if "class Solution" in code else func_name
    return (
        f"{LCB_IMPORTS}{with_sys_standin(code)}\n\n_ARGS = {args!r}\n"
        "def _plain(v):\n    if isinstance(v, (list, tuple)):\n        return [_plain(x) for x in v]\n"
        "    if isinstance(v, dict):\n        return {k: _plain(x) for k, x in v.items()}\n    return v\n"
        f"_ENTRY = {call}\ndef f():\n    return _plain(_ENTRY(*_ARGS))\n"
    )


def _decimal(token: str) -> Decimal | None:
    try:
        return Decimal(token)
    except (InvalidOperation, ValueError):
        return None


def stdout_matches(got: str, expected: str) -> bool:
    """LiveCodeBench's stdin rule: stripped lines equal, or equal token by token as decimals."""
    a, b = got.strip().split("\n"), expected.strip().split("\n")
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        x, y = x.strip(), y.strip()
        if x == y:
            continue
        xs, ys = x.split(), y.split()
        if len(xs) != len(ys):
            return False
        for s, t in zip(xs, ys):
            ds, dt = _decimal(s), _decimal(t)
            if s != t and (ds is None or dt is None or ds != dt):
                return False
    return True


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def assemble(problem: CodeProblem, code: str) -> str:
    """The candidate's code joined to the task's prefix: HumanEval prompts carry imports and helper
    functions, so the code follows the prompt; a bare function body is appended to it."""
    if not problem.prefix:
        return code
    defines = False
    try:
        defines = any(isinstance(n, ast.FunctionDef) and n.name == problem.entry_point for n in ast.walk(ast.parse(code)))
    except (SyntaxError, ValueError, RecursionError):
        pass
    return problem.prefix + ("\n\n" + code if defines else code)


def _reason(result: ExecResult) -> str:
    return f"{result.status.value}: {result.error}"[:300] if result.error else result.status.value


ROLES = ("reference", "candidate")


class CodeJudge:
    """Judges candidate programs for :class:`CodeProblem` s through sandbox ``Verifier`` s: one per
    role (references and candidates never share one, so no pool, server or zygote that ran a
    candidate runs a reference) and distinct outside deadline (``deadline_key``), made on first use
    and reused."""

    def __init__(self, limits: JudgeLimits = JudgeLimits()):
        self.limits = limits
        self._verifiers: dict[tuple[str, int], Verifier] = {}
        self.cache = ReferenceCache(limits.cache_dir)
        self.references: dict[str, Reference] = {}  # evalplus task source -> its reference run
        self.expected: dict[str, tuple[list, list]] = {}  # evalplus task source -> its outputs (base, plus), read
        self.time_limit: dict[str, float] = {}  # per-run limit of the other layouts
        self.data_errors: dict[str, str] = {}
        self.measured = 0  # evalplus references run here (not found in the cache)

    def _verifier(self, role: str, timeout_s: float) -> Verifier:
        """The verifier of ``role`` (``ROLES``) for this outside deadline."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        key = (role, deadline_key(timeout_s))
        if key not in self._verifiers:
            self._verifiers[key] = Verifier(timeout_s=key[1], memory_mb=self.limits.memory_mb, max_output_chars=MAX_CHARS,
                                            max_program_chars=MAX_CHARS, workers=self.limits.workers,
                                            extra_modules=BENCHMARK_MODULES)
        return self._verifiers[key]

    def close(self) -> None:
        for verifier in self._verifiers.values():
            verifier.close()
        self._verifiers.clear()

    def __enter__(self) -> "CodeJudge":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _execute(self, runs: Sequence[tuple[str, float]], role: str = "candidate") -> list[ExecResult]:
        """Run (program, outside deadline) pairs on ``role``'s verifiers, one process each, batched
        per deadline; results in order."""
        results: list[ExecResult | None] = [None] * len(runs)
        groups: dict[int, list[int]] = {}
        for i, (_, limit) in enumerate(runs):
            groups.setdefault(deadline_key(limit), []).append(i)
        for key, indices in groups.items():
            out = self._verifier(role, key).execute_many([(runs[i][0], "") for i in indices], repeats=1)
            for i, r in zip(indices, out):
                results[i] = r
        return results  # type: ignore[return-value]

    # -- references --------------------------------------------------------------------------
    def limits_of(self, p: CodeProblem) -> tuple[list[float], list[float]]:
        """Per-input limits (base, plus) of an evalplus task: ``max(floor, factor * t_ref)``."""
        ref = self.references[p.source]
        return (rules.time_limits(list(ref.time_base), self.limits.floor_s, self.limits.factor),
                rules.time_limits(list(ref.time_plus), self.limits.floor_s, self.limits.factor))

    def prepare(self, problems: Sequence[CodeProblem]) -> None:
        """Each task's reference, once: evalplus tasks' outputs and per-input times (from the cache
        of their file, else measured in the sandbox and added to it); the other layouts' per-run
        limit ``max(floor, factor * t_ref)``. A reference that fails is a data error of that task."""
        generous = max(self.limits.floor_s, 10.0) * 3
        runs, owners = [], []
        queued: set[str] = set()  # a task asked for by several items is measured once
        for p in problems:
            if p.source in self.references or p.source in self.time_limit or p.source in self.data_errors or p.source in queued:
                continue
            queued.add(p.source)
            if p.layout == "evalplus":
                cached = self.cache.get(p.file_digest).get(p.task_id) if p.file_digest else None
                if cached is not None:
                    self._take_reference(p, cached)
                    continue
                code = with_expression_eval(with_sys_standin(f"{FLOAT_LITERALS}{p.reference}"))
                not_none = rules.program_rule(p.task_id, p.entry_point) == "not_none"
                program = rules.reference_program(code, p.entry_point, p.base_inputs, p.plus_inputs, not_none)
            elif p.layout == "livecodebench" or p.reference is None:
                self.time_limit[p.source] = self.limits.livecodebench_timeout_s if p.layout == "livecodebench" else self.limits.floor_s
                continue
            else:
                program = self._check_program(p, with_expression_eval(p.reference))
            runs.append((program, generous))
            owners.append(p)
        measured: dict[str, dict[str, Reference]] = {}
        for p, result in zip(owners, self._execute(runs, role="reference")):
            if p.layout != "evalplus":
                self.time_limit[p.source] = max(self.limits.floor_s, self.limits.factor * result.wall_s)
                if not result.ok:
                    self.data_errors[p.source] = f"the reference solution of {p.task_id} ({p.source}) fails: {_reason(result)}"
                continue
            self.measured += 1
            reference = self._reference_of(p, result)
            self._take_reference(p, reference)
            if p.file_digest:
                measured.setdefault(p.file_digest, {})[p.task_id] = reference
        for digest, tasks in measured.items():
            self.cache.add(digest, tasks)

    @staticmethod
    def _reference_of(p: CodeProblem, result: ExecResult) -> Reference:
        """A reference run's outputs (reprs) and times; its outputs are read in ``_take_reference``."""
        if not result.ok:
            return Reference(error=f"fails on its own inputs: {_reason(result)}")
        try:
            (base, time_base), (plus, time_plus) = literals.read(result.output)
            times = (tuple(float(t) for t in time_base), tuple(float(t) for t in time_plus))
        except (literals.LiteralError, TypeError, ValueError):
            return Reference(error=f"returned what its program does not write: {result.output[:120]}")
        if type(base) is not str or type(plus) is not str:
            return Reference(error=f"returned what its program does not write: {result.output[:120]}")
        return Reference(base, plus, *times)

    def _take_reference(self, p: CodeProblem, reference: Reference) -> None:
        """Keep a measured or cached reference with its outputs read (``rules.read_value``), or make
        the task a data error: the reference failed, does not match the task's inputs, or has an
        output whose repr this judge does not read."""
        why = reference.error
        if why is None and (len(reference.time_base) != len(p.base_inputs) or len(reference.time_plus) != len(p.plus_inputs)):
            why = "does not match the task's inputs (it did not answer every input)"
        if why is None:
            try:
                values = (rules.read_value(reference.expected_base), rules.read_value(reference.expected_plus))
            except literals.LiteralError as exc:
                values, why = ([], []), f"has an output whose repr this judge does not read ({str(exc)[:160]})"
            if why is None and [type(v) is list and len(v) for v in values] != [len(p.base_inputs), len(p.plus_inputs)]:
                why = "does not match the task's inputs (it did not answer every input)"
        if why is not None:
            self.data_errors[p.source] = f"the reference solution of {p.task_id} ({p.source}) {why}"
        else:
            self.references[p.source] = reference
            self.expected[p.source] = values

    # -- candidates --------------------------------------------------------------------------
    def _check_program(self, p: CodeProblem, full_code: str) -> str:
        if p.layout == "check":
            return f"{full_code}\n\n_ENTRY = {p.entry_point}\n{p.test}\n\ndef f():\n    check(_ENTRY)\n    return True\n"
        lines = p.test.splitlines()
        top = [l for l in lines if l.startswith(("import ", "from "))]
        asserts = [l for l in lines if l not in top]
        return "\n".join([full_code, "", *top, "def f():", *("    " + a for a in asserts), "    return True", ""])

    def _evalplus_program(self, p: CodeProblem, code: str) -> tuple[str, float]:
        """The candidate's program (inputs and limits only: ``rules.candidate_program``) and its
        outside deadline (the base part's plus the plus part's)."""
        limits_base, limits_plus = self.limits_of(p)
        program = rules.candidate_program(self._candidate_code(code), p.task_id, p.entry_point, p.base_inputs, p.plus_inputs,
                                          limits_base, limits_plus)
        return program, rules.part_deadline(limits_base) + rules.part_deadline(limits_plus)

    def _evalplus_outcome(self, p: CodeProblem, result: ExecResult, base_only: bool = False) -> Outcome:
        """The outcome of a candidate's evalplus run, judged here against the reference's outputs
        (``rules.verdict``); ``base_only``: a run of the base inputs alone (``passed`` is then the
        base verdict). A result the program does not write is a failure."""
        if not result.ok:
            return Outcome(False, _reason(result), base_passed=False)
        expected_base, expected_plus = self.expected[p.source]
        inputs = (p.base_inputs, [] if base_only else p.plus_inputs)
        try:
            value = literals.read(result.output)
            verdict = rules.verdict(value, p.task_id, p.entry_point, p.atol, inputs, (expected_base, [] if base_only else expected_plus))
        except (literals.LiteralError, rules.MalformedResult) as exc:
            return Outcome(False, f"bad_output: {exc}"[:300], base_passed=False)
        base_ok, plus_ok, reason = rules.describe(verdict)
        return Outcome(plus_ok, reason, base_passed=base_ok)

    def judge(self, items: Sequence[tuple[CodeProblem, str | None]]) -> list[Outcome]:
        """Verdicts for (problem, candidate code) pairs; code None means no code was found in the answer."""
        self.prepare([p for p, _ in items])
        outcomes: list[Outcome | None] = [None] * len(items)
        runs: list[tuple[str, float]] = []
        plan: list[tuple[int, str, Any]] = []  # (item index, kind, data) per run
        for i, (p, code) in enumerate(items):
            if p.source in self.data_errors:
                outcomes[i] = Outcome(False, f"data error: {self.data_errors[p.source]}",
                                      base_passed=False if p.layout == "evalplus" else None)
            elif code is None or not code.strip():
                outcomes[i] = Outcome(False, "no code block in the answer", base_passed=False if p.layout == "evalplus" else None)
            elif p.layout == "livecodebench":
                for t, test in enumerate(p.tests):
                    if test["testtype"] == "functional":
                        try:
                            args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]
                        except json.JSONDecodeError:
                            outcomes[i] = Outcome(False, f"data error: test {t} input is not JSON lines ({p.source})")
                            break
                        runs.append((functional_program(code, p.func_name, args), self.time_limit[p.source]))
                    else:
                        program = stdin_program(code, test["input"])
                        if program is None:
                            outcomes[i] = Outcome(False, "syntax_error: the code does not parse")
                            break
                        runs.append((program, self.time_limit[p.source]))
                    plan.append((i, test["testtype"], (t, test["output"])))
            elif p.layout == "evalplus":
                runs.append(self._evalplus_program(p, code))
                plan.append((i, p.layout, code))
            else:
                full = with_expression_eval(with_sys_standin(assemble(p, code)))
                runs.append((self._check_program(p, full), self.time_limit[p.source]))
                plan.append((i, p.layout, None))
        results = self._execute(runs)
        for (i, kind, data), result in zip(plan, results):
            if outcomes[i] is not None and not outcomes[i].passed:
                continue  # an earlier test of this item already failed
            outcomes[i] = self._evalplus_outcome(items[i][0], result) if kind == "evalplus" else self._verdict(kind, data, result)
        self._base_after_timeouts(items, plan, results, outcomes)
        return [o if o is not None else Outcome(False, "not run") for o in outcomes]

    def _base_after_timeouts(self, items: Sequence[tuple[CodeProblem, str | None]], plan: list[tuple[int, str, Any]],
                             results: list[ExecResult], outcomes: list[Outcome | None]) -> None:
        """After an evalplus run killed at its outside deadline (and only then): the base verdict and
        the input that hung.

        evalplus runs the base and the plus inputs in two processes, so a hang in the plus part
        leaves the base verdict standing. Here both parts share one process; a run killed at its
        outside deadline is run again on the base inputs alone (under the base part's deadline)
        to get that base verdict. The part that hung (base when that re-run times out too, else
        plus) is then searched for the input that hung (``_name_hung_inputs``)."""
        again = [(i, code) for (i, kind, code), r in zip(plan, results) if kind == "evalplus" and r.status.value == "timeout"]
        if not again:
            return
        runs = []
        for i, code in again:
            p = items[i][0]
            limits_base, _ = self.limits_of(p)
            program = rules.candidate_program(self._candidate_code(code), p.task_id, p.entry_point, p.base_inputs, [], limits_base, [])
            runs.append((program, rules.part_deadline(limits_base)))
        hung: list[tuple[int, str, str]] = []  # (item index, part, candidate code)
        for (i, code), result in zip(again, self._execute(runs)):
            base = self._evalplus_outcome(items[i][0], result, base_only=True)
            if base.passed or result.status.value == "timeout":
                part = "base" if not base.passed else "plus"
                hung.append((i, part, code))
                reason = (f"timeout: the {part} part ran past the sum of its inputs' limits (killed from outside; "
                          f"no input of it, run alone under its own limit, timed out)")
                outcomes[i] = Outcome(False, reason, base_passed=base.passed)
            else:
                outcomes[i] = Outcome(False, base.reason, base_passed=False)
        self._name_hung_inputs(items, hung, outcomes)

    @staticmethod
    def _candidate_code(code: str) -> str:
        """A candidate's code as its evalplus programs hold it: ``inf``/``nan`` defined (inputs may
        hold them), ``sys`` and ``eval`` stand-ins where it uses them."""
        return f"{FLOAT_LITERALS}{with_expression_eval(with_sys_standin(code))}"

    def _name_hung_inputs(self, items: Sequence[tuple[CodeProblem, str | None]], hung: list[tuple[int, str, str]],
                          outcomes: list[Outcome | None]) -> None:
        """Name the input that hung, for runs killed from outside only: the hung part's inputs are
        run again from its first input (none of that part is known to have passed: the killed
        process returned nothing), **each input in its own sandboxed run** under that input's own
        limit (outside deadline ``part_deadline([limit])``: the limit plus the usual 1 s margin),
        stopping at the first that is killed ("did not return within its limit") or returns over
        its limit. Rounds: one input per unresolved task per round, the tasks of a round in one
        batch. Bounded: at most the part's inputs more processes per timed-out task, none for any
        other task (a normal run stays one process). When no input times out alone (a hang that
        needs the earlier calls' state, or a part over the 60 s cap), the part-level reason stays."""
        state = {}  # item index -> (part, code, next input)
        for i, part, code in hung:
            state[i] = (part, code, 0)
        while state:
            runs, owners = [], []
            for i, (part, code, k) in list(state.items()):
                p = items[i][0]
                inputs = p.base_inputs if part == "base" else p.plus_inputs
                if k >= len(inputs):
                    del state[i]
                    continue
                limit = self.limits_of(p)[0 if part == "base" else 1][k]
                program = rules.candidate_program(self._candidate_code(code), p.task_id, p.entry_point, [inputs[k]], [], [limit], [])
                runs.append((program, rules.part_deadline([limit])))
                owners.append((i, part, k, limit))
            for (i, part, k, limit), result in zip(owners, self._execute(runs)):
                reason = None
                if result.status.value == "timeout":
                    reason = f"time limit: {part} input {k} did not return within its limit of {limit:.3g} s"
                elif result.ok:
                    try:
                        stop = rules.parts_of(literals.read(result.output))[0][1]
                    except (literals.LiteralError, rules.MalformedResult):
                        stop = None
                    if stop is not None and stop[0] == "time":
                        reason = f"time limit: {part} input {k} took {stop[2]:.3g} s, over its limit of {stop[3]:.3g} s"
                if reason is not None:
                    outcomes[i] = Outcome(False, reason, base_passed=outcomes[i].base_passed)
                    del state[i]
                else:
                    state[i] = (part, state[i][1], k + 1)

    @staticmethod
    def _verdict(kind: str, data: Any, result: ExecResult) -> Outcome:
        """The outcome of a check / MBPP-asserts run or of one LiveCodeBench test; the run's value is
        read with the bounded reader (``verifier.literals``) and compared here."""
        where = f"test {data[0]}: " if data else ""
        if not result.ok:
            return Outcome(False, where + _reason(result))
        if kind in ("check", "mbpp_asserts"):
            return Outcome(True)
        t, expected = data
        try:
            value = literals.read(result.output)
        except literals.LiteralError as exc:
            return Outcome(False, f"test {t}: bad_output: {exc}"[:300])
        if kind == "stdin":
            ok = isinstance(value, str) and stdout_matches(value, expected)
        else:
            try:
                ok = _plain(value) == _plain(json.loads(expected))
            except json.JSONDecodeError:
                ok = False
        return Outcome(True) if ok else Outcome(False, f"test {t}: wrong answer, got {str(value)[:120]!r}")
