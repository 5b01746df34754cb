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
  t_ref); a candidate then runs once per task on the same inputs, comparing in the sandbox and
  stopping at the first failing input. Comparison: equality; else with ``atol == 0`` and float
  expectations a 1e-6 tolerance; else (``atol != 0``) same type and length and
  ``|out - exp| <= atol + 1e-7 |exp|`` elementwise (numpy's allclose rule); ``find_zero`` checks
  ``|poly(xs, out)| <= atol``.
- check / mbpp_asserts: ``prefix + candidate + test`` then ``check(entry_point)`` / the asserts.
- livecodebench: one run per test; functional tests call the function (or ``Solution().method``)
  and compare as JSON values (tuples as lists); stdin tests compare stdout line by line after
  stripping, a line also matching when its whitespace-separated tokens are equal as decimals.

Time limit of a run: ``max(floor_s, factor * t_ref)`` (evalplus's rule, per task), ``floor_s`` where
there is no reference (LiveCodeBench: ``livecodebench_timeout_s``).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

from evaluation.datasets import CodeProblem
from verifier.guard import BENCHMARK_MODULES
from verifier.sandbox import ExecResult, Verifier


@dataclass(frozen=True)
class JudgeLimits:
    """Per-run limits. evalplus uses floor 4 s and factor 4 (AZR: 10 s and 8); LiveCodeBench 6 s."""

    floor_s: float = 4.0
    factor: float = 4.0
    livecodebench_timeout_s: float = 6.0
    memory_mb: int = 1024
    workers: int | None = None


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason}


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

COMPARE = '''
import copy as _copy
def _is_floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(v, float) for v in x)
def _flat(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]
def _close(out, exp, atol):
    if type(out) != type(exp) and not (isinstance(out, (int, float)) and isinstance(exp, (int, float))):
        return False
    a, b = _flat(out), _flat(exp)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
            if x != y:
                return False
        elif not abs(x - y) <= atol + 1e-7 * abs(y):
            return False
    return True
def _same(out, exp, args):
    if _ENTRY_NAME == "find_zero":
        return abs(poly(args[0], out)) <= (_ATOL or 1e-6)
    if out == exp:
        return True
    if _ATOL == 0 and _is_floats(exp):
        return _close(out, exp, 1e-6)
    if _ATOL != 0:
        return _close(out, exp, _ATOL)
    return False
'''

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


class CodeJudge:
    """Judges candidate programs for :class:`CodeProblem` s through sandbox ``Verifier`` s (one per
    distinct time limit, rounded up to whole seconds, made on first use and reused)."""

    def __init__(self, limits: JudgeLimits = JudgeLimits()):
        self.limits = limits
        self._verifiers: dict[int, Verifier] = {}
        self.expected: dict[str, str] = {}  # evalplus task source -> repr of the reference outputs
        self.time_limit: dict[str, float] = {}
        self.data_errors: dict[str, str] = {}

    def _verifier(self, timeout_s: float) -> Verifier:
        key = max(1, math.ceil(timeout_s))
        if key not in self._verifiers:
            self._verifiers[key] = Verifier(timeout_s=key, memory_mb=self.limits.memory_mb, max_output_chars=MAX_CHARS,
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

    def _execute(self, runs: Sequence[tuple[str, float]]) -> list[ExecResult]:
        """Run (program, time limit) pairs, one process each, batched per limit; results in order."""
        results: list[ExecResult | None] = [None] * len(runs)
        groups: dict[int, list[int]] = {}
        for i, (_, limit) in enumerate(runs):
            groups.setdefault(max(1, math.ceil(limit)), []).append(i)
        for key, indices in groups.items():
            out = self._verifier(key).execute_many([(runs[i][0], "") for i in indices], repeats=1)
            for i, r in zip(indices, out):
                results[i] = r
        return results  # type: ignore[return-value]

    # -- references --------------------------------------------------------------------------
    def prepare(self, problems: Sequence[CodeProblem]) -> None:
        """Run each task's reference once: evalplus expected outputs, and every task's time limit
        ``max(floor, factor * t_ref)``. A reference that fails is a data error of that task."""
        todo = [p for p in problems if p.source not in self.time_limit]
        runs, owners = [], []
        for p in todo:
            if p.layout == "livecodebench" or p.reference is None:
                self.time_limit[p.source] = self.limits.livecodebench_timeout_s if p.layout == "livecodebench" else self.limits.floor_s
                continue
            generous = max(self.limits.floor_s, 10.0) * 3
            if p.layout == "evalplus":
                program = (f"{FLOAT_LITERALS}{p.reference}\n\nimport copy as _copy\n_INPUTS = {p.inputs!r}\n"
                           f"_ENTRY = {p.entry_point}\ndef f():\n    return [_ENTRY(*_copy.deepcopy(a)) for a in _INPUTS]\n")
            else:
                program = self._check_program(p, with_expression_eval(p.reference))
            runs.append((program, generous))
            owners.append(p)
        for p, result in zip(owners, self._execute(runs)):
            limit = max(self.limits.floor_s, self.limits.factor * result.wall_s)
            self.time_limit[p.source] = limit
            if not result.ok:
                self.data_errors[p.source] = f"the reference solution of {p.task_id} ({p.source}) fails: {_reason(result)}"
            elif p.layout == "evalplus":
                self.expected[p.source] = result.output or "[]"

    # -- candidates --------------------------------------------------------------------------
    def _check_program(self, p: CodeProblem, full_code: str) -> str:
        if p.layout == "check":
            return f"{full_code}\n\n_ENTRY = {p.entry_point}\n{p.test}\n\ndef f():\n    check(_ENTRY)\n    return True\n"
        lines = p.test.splitlines()
        top = [l for l in lines if l.startswith(("import ", "from "))]
        asserts = [l for l in lines if l not in top]
        return "\n".join([full_code, "", *top, "def f():", *("    " + a for a in asserts), "    return True", ""])

    def _evalplus_program(self, p: CodeProblem, full_code: str) -> str:
        return (
            f"{FLOAT_LITERALS}{full_code}\n_ENTRY = {p.entry_point}\n{COMPARE}\n_ENTRY_NAME = {p.entry_point!r}\n_ATOL = {p.atol!r}\n"
            f"_INPUTS = {p.inputs!r}\n_EXPECTED = {self.expected[p.source]}\n"
            "def f():\n    for _i, _args in enumerate(_INPUTS):\n"
            "        _out = _ENTRY(*_copy.deepcopy(_args))\n"
            "        if not _same(_out, _EXPECTED[_i], _args):\n"
            "            return ('fail', _i, repr(_out)[:200])\n    return ('pass',)\n"
        )

    def judge(self, items: Sequence[tuple[CodeProblem, str | None]]) -> list[Outcome]:
        """Verdicts for (problem, candidate code) pairs; code None means no code was found in the answer."""
        self.prepare([p for p, _ in items])
        outcomes: list[Outcome | None] = [None] * len(items)
        runs: list[tuple[str, float]] = []
        plan: list[tuple[int, str, Any]] = []  # (item index, kind, data) per run
        for i, (p, code) in enumerate(items):
            if p.source in self.data_errors:
                outcomes[i] = Outcome(False, f"data error: {self.data_errors[p.source]}")
            elif code is None or not code.strip():
                outcomes[i] = Outcome(False, "no code block in the answer")
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
            else:
                full = with_expression_eval(with_sys_standin(assemble(p, code)))
                program = self._evalplus_program(p, full) if p.layout == "evalplus" else self._check_program(p, full)
                runs.append((program, self.time_limit[p.source]))
                plan.append((i, p.layout, None))
        results = self._execute(runs)
        for (i, kind, data), result in zip(plan, results):
            if outcomes[i] is not None and not outcomes[i].passed:
                continue  # an earlier test of this item already failed
            outcomes[i] = self._verdict(kind, data, result)
        return [o if o is not None else Outcome(False, "not run") for o in outcomes]

    @staticmethod
    def _verdict(kind: str, data: Any, result: ExecResult) -> Outcome:
        if not result.ok:
            where = f"test {data[0]}: " if data else ""
            return Outcome(False, where + _reason(result))
        value = ast.literal_eval(result.output) if result.output is not None else None
        if kind == "evalplus":
            if value == ("pass",):
                return Outcome(True)
            return Outcome(False, f"wrong answer on input {value[1]}: got {value[2]}")
        if kind in ("check", "mbpp_asserts"):
            return Outcome(True)
        t, expected = data
        if kind == "stdin":
            ok = isinstance(value, str) and stdout_matches(value, expected)
        else:
            try:
                ok = _plain(value) == _plain(json.loads(expected))
            except json.JSONDecodeError:
                ok = False
        return Outcome(True) if ok else Outcome(False, f"test {t}: wrong answer, got {str(value)[:120]!r}")
