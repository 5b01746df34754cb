"""How evalplus judges HumanEval+ / MBPP+ answers, restated for programs run in our sandbox.

Release matched: **evalplus main @ 26d6d00** (2025-10-02; the newest source, after the PyPI release
0.3.1, which differs in two ways noted below). Facts read in ``evalplus/eval/__init__.py``,
``evalplus/eval/_special_oracle.py``, ``evalplus/evaluate.py``, ``evalplus/gen/util/__init__.py`` and
``evalplus/config.py``; the code here is ours.

Defaults (``evalplus.config`` / ``evalplus.eval``):

- per-input time limit ``max(MIN_TIME_LIMIT_S, TIME_LIMIT_FACTOR * t_ref)`` with ``t_ref`` the
  reference solution's wall time on that very input: 4.0 s and 4.0 (0.3.1: a 1.0 s floor);
- a process for the base inputs and one for the plus inputs, each killed after
  ``min(PER_TASK_CAP_S, sum of its limits) + 1`` s;
- memory: 4 GiB of address space (``EVALPLUS_MAX_MEMORY_BYTES``);
- tolerances: ``atol`` from the task's row; when it is 0 and the expected value is a float or a
  non-empty list/tuple of floats, 1e-6 (and, as in evalplus, that 1e-6 then stays for the rest of
  that part's inputs); ``numpy.allclose(out, exp, rtol=1e-7, atol=atol)`` after the same type and,
  for a list/tuple, the same length.

Per input (``same``): exact equality, then the special oracles keyed by the dataset (``mbpp`` for
``Mbpp/`` task ids, else ``humaneval``) and the **entry point name**, as evalplus keys them:

- mbpp ``are_equivalent`` (Mbpp/164): any answer is accepted;
- mbpp ``sum_div`` (Mbpp/295): 0 is accepted besides the expected value;
- mbpp ``surface_Area`` (Mbpp/581): also ``|out - round(b^2 + 2 b sqrt((b/2)^2 + h^2))| <= atol``
  (the slant height read as the perpendicular height);
- mbpp ``digit_distance_nums`` (Mbpp/558): also the digit distance after zero-padding both numbers
  to one length;
- mbpp ``MBPP_OUTPUT_SET_EQ_TASKS`` (eight entry points): ``set(out) == set(exp)`` replaces equality;
- mbpp ``MBPP_OUTPUT_NOT_NONE_TASKS`` (three): the reference's outputs are recorded as
  ``out is not None``; a bool answer must equal that, any other answer passes when it is not None;
- humaneval ``find_zero`` (HumanEval/32): ``|poly(xs, out)| <= atol`` with evalplus's own ``poly``
  (``sum(c * math.pow(x, i))``) on the task's own ``xs``, nothing else (0.3.1 never recorded this
  input as passed, so every answer failed there; fixed on main by 6eb1e19). evalplus passes the
  candidate's possibly mutated ``xs``; here the task's copy is used, so emptying ``xs`` gains nothing.

Then the float rules above (``allclose``: numpy's broadcasting and inf/NaN rules in plain Python,
with one bound: a broadcast of more than ``max(both sizes, BROADCAST_BOUND)`` elements is not close,
where numpy would compare every pair; only an output shaped unlike the expected value gets there).
An input fails on any exception, on a call over its time limit, or on a wrong value; evaluation of a
part stops at its first failing input. A sample is **base**-correct when every base input passes and
**plus**-correct when every base and every plus input passes.

Where each step runs. evalplus compares inside the process that runs the candidate, with the
expected outputs in it; here **no expected output enters a candidate's process**. The candidate's
program (``candidate_program``) only calls the candidate on the base inputs, then the plus inputs,
times each call against its own limit (limits are not secret), stops a part at an exception or a
time-over, and returns per input the repr of its output as text (``_ep_plain`` first turns the
stdlib types that compare equal to a literal into it: ``Counter``/``OrderedDict``/``defaultdict`` to
dict, ``frozenset`` and dict key/item views to set, named tuples to tuple, ``IntEnum`` to int; where
the task's rule reads one fact of an output that is still not literal data, that fact:
``program_rule``). The
caller reads each repr with the bounded reader (``read_value``: ``verifier.literals`` plus the names
``inf``/``nan``) and applies the rules here (``judge_part``), stopping at the first failing input of
each part. An output whose repr does not read back is a wrong answer (its repr, truncated, is the
reason). The plus inputs run after base inputs that returned, even when a base value turns out wrong
(the program cannot know; evalplus too runs both parts): the verdict is unchanged.
"""

from __future__ import annotations

import ast
import math
from typing import Any, Callable

from verifier import literals

MIN_TIME_LIMIT_S = 4.0
TIME_LIMIT_FACTOR = 4.0
PER_TASK_CAP_S = 60.0
MEMORY_MB = 4096
FLOAT_ATOL = 1e-6
ALLCLOSE_RTOL = 1e-7
BROADCAST_BOUND = 10_000
OUTPUT_CHARS = 4_000_000  # repr characters one part returns at most (escaped twice that; the judge reads 20 M)

MBPP_OUTPUT_NOT_NONE_TASKS: frozenset[str] = frozenset({"check_str", "text_match_three", "text_starta_endb"})
MBPP_OUTPUT_SET_EQ_TASKS: frozenset[str] = frozenset({
    "similar_elements",  # Mbpp/2
    "find_char_long",  # Mbpp/7
    "common_in_nested_lists",  # Mbpp/111
    "extract_singly",  # Mbpp/140
    "larg_nnum",  # Mbpp/232
    "intersection_array",  # Mbpp/249
    "find_dissimilar",  # Mbpp/579
    "Diff",  # Mbpp/769
})
MBPP_ALTERNATIVE_ANSWER_TASKS: frozenset[str] = frozenset({"are_equivalent", "sum_div", "surface_Area", "digit_distance_nums"})


def dataset_of(task_id: str) -> str:
    """evalplus's dataset name for a task: ``mbpp`` for ``Mbpp/...`` ids, else ``humaneval``."""
    return "mbpp" if task_id.lower().startswith("mbpp/") else "humaneval"


def time_limits(reference_times: list[float], floor_s: float, factor: float) -> list[float]:
    """Per-input limits: ``max(floor_s, factor * t)`` for each reference time ``t``."""
    return [max(floor_s, factor * t) for t in reference_times]


def part_deadline(limits: list[float]) -> float:
    """The outside deadline of one part (base or plus): ``min(cap, sum of limits) + 1`` s."""
    return min(PER_TASK_CAP_S, sum(limits)) + 1.0



# -- reading outputs in the caller ----------------------------------------------------------------

# The names ``repr`` writes for non-finite floats (and complex parts); each read makes a new object.
NON_FINITE: dict[str, Callable[[], float | complex]] = {
    "inf": lambda: float("inf"), "nan": lambda: float("nan"),
    "infj": lambda: complex(0, float("inf")), "nanj": lambda: complex(0, float("nan")),
}


def read_value(text: str) -> Any:
    """The value of a repr that may name ``inf``/``nan`` (``repr`` of non-finite floats, and
    ``infj``/``nanj`` of complex parts), read with ``verifier.literals`` (bounded in time by the
    text's length). Each NaN is a new float, as values that crossed a process are (``[nan] ==
    [nan]`` is then False, as in evalplus). Raises ``literals.LiteralError``."""
    if not isinstance(text, str):
        raise literals.LiteralError(f"expected text, got {type(text).__name__}")
    try:
        tree = literals.parse(text.lstrip(" \t"))
    except literals.PARSE_ERRORS as exc:
        raise literals.LiteralError(f"not a Python literal: {type(exc).__name__}: {str(exc)[:80]}") from None
    for node in ast.walk(tree):  # iterative: no recursion on deep text
        for field, value in ast.iter_fields(node):
            if type(value) is ast.Name and value.id in NON_FINITE:
                setattr(node, field, ast.Constant(NON_FINITE[value.id]()))
            elif type(value) is list:
                value[:] = [ast.Constant(NON_FINITE[v.id]()) if type(v) is ast.Name and v.id in NON_FINITE else v for v in value]
    return literals.build_checked(tree)


# -- the rules, applied in the caller -------------------------------------------------------------


def poly(xs: list, x: Any) -> float:
    """evalplus's ``poly`` (HumanEval/32's helper)."""
    return sum([c * math.pow(x, i) for i, c in enumerate(xs)])


def surface_area(base_edge: Any, height: Any) -> Any:
    """Mbpp/581's alternative answer: the slant height read as the perpendicular height."""
    slant = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 2 * base_edge * slant)


def digit_distance(a: Any, b: Any) -> int:
    """Mbpp/558's alternative answer: the digit distance after zero-padding to one length."""
    x, y = str(a), str(b)
    width = max(len(x), len(y))
    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(width), y.zfill(width)))


def is_floats(x: Any) -> bool:
    """evalplus's test for the 1e-6 rule: a float, or a non-empty list/tuple of floats."""
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(v, float) for v in x)


def _array(x: Any) -> tuple[tuple[int, ...], list] | None:
    """(shape, flat values) of nested lists/tuples of numbers; None where numpy would raise (ragged, non-numeric)."""
    if isinstance(x, (list, tuple)):
        parts = [_array(v) for v in x]
        if any(p is None for p in parts) or any(p[0] != parts[0][0] for p in parts):  # type: ignore[index]
            return None
        inner = parts[0][0] if parts else ()  # type: ignore[index]
        return ((len(x),) + inner, [v for p in parts for v in p[1]])  # type: ignore[index]
    if isinstance(x, (bool, int, float, complex)):
        return ((), [x])
    return None


def _finite(x: Any) -> bool:
    if isinstance(x, complex):
        return math.isfinite(x.real) and math.isfinite(x.imag)
    return math.isfinite(x)


def _close(x: Any, y: Any, rtol: float, atol: float) -> bool:
    if not (_finite(x) and _finite(y)):
        return x == y
    return abs(x - y) <= atol + rtol * abs(y)


def allclose(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """``numpy.allclose(a, b, rtol, atol)`` for nested lists/tuples of numbers: broadcasting,
    infinities close only to themselves, NaN to nothing, ragged or non-numeric data not close (numpy
    raises there). A broadcast over ``max(len a, len b, BROADCAST_BOUND)`` elements is not close
    (module docstring)."""
    pa, pb = _array(a), _array(b)
    if pa is None or pb is None:
        return False
    (sa, fa), (sb, fb) = pa, pb
    n = max(len(sa), len(sb))
    sa, sb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    shape = []
    for x, y in zip(sa, sb):
        if x != y and x != 1 and y != 1:
            return False
        shape.append(y if x == 1 else x)
    total = math.prod(shape)
    if total > max(len(fa), len(fb), BROADCAST_BOUND):
        return False

    def strides(s: tuple[int, ...]) -> list[int]:
        out, step = [], 1
        for d in reversed(s):
            out.append(0 if d == 1 else step)
            step *= d
        return list(reversed(out))

    ta, tb = strides(sa), strides(sb)
    for k in range(total):
        ia = ib = 0
        rest = k
        for axis in range(n - 1, -1, -1):
            rest, digit = divmod(rest, shape[axis])
            ia += digit * ta[axis]
            ib += digit * tb[axis]
        if not _close(fa[ia], fb[ib], rtol, atol):
            return False
    return True


def same(out: Any, exp: Any, args: list, atol: float, dataset: str, entry_point: str) -> tuple[bool, float]:
    """Whether ``out`` passes for expected ``exp`` on input ``args`` (module docstring), and the
    tolerance for the part's next input (the 1e-6 rule sticks once set). Sets are built with
    ``literals.bounded_set``; any exception is the caller's to treat as a wrong answer."""
    exact = out == exp
    if dataset == "mbpp":
        if entry_point == "are_equivalent":
            exact = True
        elif entry_point == "sum_div":
            exact = exact or out == 0
        elif entry_point == "surface_Area":
            exact = exact or abs(out - surface_area(*args)) <= atol
        elif entry_point == "digit_distance_nums":
            exact = exact or out == digit_distance(*args)
        elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
            exact = literals.bounded_set(list(out)) == literals.bounded_set(list(exp))
        elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:
            exact = (out == exp) if isinstance(out, bool) else (exp == (out is not None))
    if dataset == "humaneval" and entry_point == "find_zero":
        return abs(poly(*args, out)) <= atol, atol
    if atol == 0 and is_floats(exp):
        atol = FLOAT_ATOL
    if not exact and atol != 0:
        if type(out) != type(exp):
            return False, atol
        if isinstance(exp, (list, tuple)) and len(out) != len(exp):
            return False, atol
        return allclose(out, exp, ALLCLOSE_RTOL, atol), atol
    return bool(exact), atol


# -- the programs run in the sandbox ---------------------------------------------------------------

# In-program code shared by the reference's and the candidate's programs (after the benchmark code;
# names start with ``_ep_`` so that code's own helpers are not shadowed by accident). ``_ep_plain``:
# the literal value equal (``==``) to a stdlib value that is not a literal (module docstring);
# anything else is left for ``repr``. ``_ep_run``: one part, as the module docstring says.
RUN_SOURCE = '''
import time as _ep_time
_ep_perf = _ep_time.perf_counter
_ep_views = (type({}.keys()), type({}.items()))
def _ep_plain(x):
    kind = type(x)
    if kind in (int, float, complex, str, bytes, bool, type(None)):
        return x
    if isinstance(x, dict):
        return {_ep_plain(k): _ep_plain(v) for k, v in x.items()}
    if isinstance(x, (set, frozenset) + _ep_views):
        return {_ep_plain(v) for v in x}
    if isinstance(x, list):
        return [_ep_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple([_ep_plain(v) for v in x])
    for base in (int, float, complex, str, bytes):
        if isinstance(x, base):
            return base(x)
    return x
_ep_literal_types = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set)
def _ep_sent(out, rule):
    value = _ep_plain(out)
    if type(value) not in _ep_literal_types:
        if rule == "not_none":
            return out is not None
        if rule == "set_eq":
            return _ep_plain(set(value))
    return value
def _ep_text(x):
    return "".join([repr(x)])
def _ep_run(fn, inputs, limits, rule):
    outputs, size = [], 0
    for i, args in enumerate(inputs):
        try:
            start = _ep_perf()
            out = fn(*args)
            took = _ep_perf() - start
        except BaseException as exc:
            return (outputs, ("error", i, _ep_text(exc)[:200]))
        if took > limits[i]:
            return (outputs, ("time", i, took, limits[i]))
        try:
            text = _ep_text(_ep_sent(out, rule))
        except BaseException as exc:
            return (outputs, ("wrong", i, "an output that could not be written as data: " + _ep_text(exc)[:160]))
        size += len(text)
        if size > %(output_chars)d:
            return (outputs, ("wrong", i, "an output whose repr has " + str(len(text)) + " characters, past the judge's bound of %(output_chars)d for a part"))
        outputs.append(text)
    return (outputs, None)
''' % {"output_chars": OUTPUT_CHARS}


def reference_program(code: str, entry_point: str, base: list, plus: list, not_none: bool) -> str:
    """A program whose ``f()`` runs the reference ``code`` on a deep copy of every base and plus
    input, timing each call alone (``time.perf_counter`` around the call, as evalplus's
    ``trusted_exec`` times around it), and returns ``[(repr(outputs), times), ...]`` for base and
    plus, the outputs made plain (``_ep_plain``). With ``not_none`` the outputs are ``out is not
    None`` (evalplus's NOT_NONE tasks)."""
    return (
        f"{code}\n\nimport copy as _ep_copy\n{RUN_SOURCE}\n"
        f"_EP_PARTS = ({base!r}, {plus!r})\n_EP_FN = {entry_point}\n"
        "def f():\n    result = []\n    for part in _EP_PARTS:\n        values, times = [], []\n"
        "        for args in part:\n            args = _ep_copy.deepcopy(args)\n            start = _ep_perf()\n"
        "            value = _EP_FN(*args)\n            times.append(_ep_perf() - start)\n"
        f"            values.append(value is not None if {not_none!r} else _ep_plain(value))\n"
        "        result.append((_ep_text(values), times))\n    return result\n"
    )


def program_rule(task_id: str, entry_point: str) -> str:
    """What a candidate's program sends for an output that is not literal data (``_ep_sent``), where
    the task's rule reads only one fact of it: ``"not_none"`` (the NOT_NONE tasks: ``out is not
    None``), ``"set_eq"`` (the set tasks: ``set(out)``, so a generator passes as in evalplus), else
    ``""`` (its repr, which does not read back: a wrong answer)."""
    if dataset_of(task_id) != "mbpp":
        return ""
    return "not_none" if entry_point in MBPP_OUTPUT_NOT_NONE_TASKS else "set_eq" if entry_point in MBPP_OUTPUT_SET_EQ_TASKS else ""


def candidate_program(code: str, task_id: str, entry_point: str, base: list, plus: list, limits_base: list[float],
                      limits_plus: list[float]) -> str:
    """A program whose ``f()`` runs the candidate ``code`` on the base inputs, then (when none raised
    or ran over its limit) on the plus inputs, in this one process, and returns one ``(outputs,
    stop)`` per part it ran: ``outputs`` the reprs of the values returned, ``stop`` None or why the
    part stopped at input ``len(outputs)`` (``("error", i, repr of the exception)``, ``("time", i,
    seconds, limit)``, ``("wrong", i, why the output could not be written as data)``); outputs go
    through ``_ep_sent`` (``program_rule``). Nothing of the expected
    outputs is in it: the caller judges (``verdict``)."""
    return (
        f"{code}\n\n_EP_FN = {entry_point}\n{RUN_SOURCE}\n"
        f"_EP_BASE = {base!r}\n_EP_PLUS = {plus!r}\n_EP_LIM_BASE = {limits_base!r}\n_EP_LIM_PLUS = {limits_plus!r}\n"
        f"_EP_RULE = {program_rule(task_id, entry_point)!r}\n"
        "def f():\n    base = _ep_run(_EP_FN, _EP_BASE, _EP_LIM_BASE, _EP_RULE)\n"
        "    if base[1] is not None:\n        return (base,)\n"
        "    return (base, _ep_run(_EP_FN, _EP_PLUS, _EP_LIM_PLUS, _EP_RULE))\n"
    )


# -- judging a candidate program's result in the caller ---------------------------------------------


class MalformedResult(ValueError):
    """A candidate program's return value is not what ``candidate_program`` returns (the candidate
    can write any result of its own process): a failed run, never a pass."""


def _stop_of(stop: Any, index: int) -> tuple | None:
    if stop is None:
        return None
    shapes = {"error": (str,), "time": ((int, float), (int, float)), "wrong": (str,)}
    if type(stop) is not tuple or len(stop) < 2 or stop[0] not in shapes or stop[1] != index or type(stop[1]) is not int:
        raise MalformedResult(f"a part's stop is not one the program writes: {str(stop)[:120]}")
    rest = stop[2:]
    kinds = shapes[stop[0]]
    if len(rest) != len(kinds) or not all(isinstance(v, k) and type(v) is not bool for v, k in zip(rest, kinds)):
        raise MalformedResult(f"a part's stop is not one the program writes: {str(stop)[:120]}")
    return stop


def parts_of(value: Any) -> list[tuple[list[str], tuple | None]]:
    """The ``(outputs, stop)`` parts of a candidate program's return value, checked for shape."""
    if type(value) is not tuple or not 1 <= len(value) <= 2:
        raise MalformedResult("the program's result is not one or two parts")
    parts = []
    for part in value:
        if type(part) is not tuple or len(part) != 2 or type(part[0]) is not list or not all(type(t) is str for t in part[0]):
            raise MalformedResult("a part is not (outputs, stop)")
        parts.append((part[0], _stop_of(part[1], len(part[0]))))
    if len(parts) == 1 and parts[0][1] is None:
        raise MalformedResult("the plus part is missing after a base part that did not stop")
    return parts


def judge_part(name: str, outputs: list[str], stop: tuple | None, expected: list, inputs: list, dataset: str,
               entry_point: str, atol: float) -> tuple:
    """The verdict of one part, input by input, stopping at the first that fails: ``(name,
    "pass")``, ``(name, "wrong", i, repr)``, or the part's stop. Outputs are read with
    ``read_value``; one that does not read back, or whose comparison raises, is wrong."""
    if len(outputs) != len(expected) if stop is None else len(outputs) >= len(expected):
        raise MalformedResult(f"the {name} part answered {len(outputs)} of {len(expected)} inputs")
    for i, text in enumerate(outputs):
        try:
            out = read_value(text)
        except literals.LiteralError:
            return (name, "wrong", i, text[:200])
        try:
            ok, atol = same(out, expected[i], inputs[i], atol, dataset, entry_point)
        except Exception as exc:  # noqa: BLE001 - a value the rule cannot handle is a wrong answer
            return (name, "wrong", i, "comparing raised " + repr(exc)[:160])
        if not ok:
            return (name, "wrong", i, text[:200])
    return (name,) + stop if stop is not None else (name, "pass")


def verdict(value: Any, task_id: str, entry_point: str, atol: float, inputs: tuple[list, list],
            expected: tuple[list, list]) -> tuple:
    """The verdict (``describe``'s input) of a candidate program's return value, for the base and
    plus ``inputs`` it ran and their ``expected`` outputs. Raises ``MalformedResult``."""
    parts = parts_of(value)
    dataset = dataset_of(task_id)
    base = judge_part("base", *parts[0], expected[0], inputs[0], dataset, entry_point, atol)
    if base[1] != "pass":
        return base
    return judge_part("plus", *parts[1], expected[1], inputs[1], dataset, entry_point, atol)


def describe(verdict: tuple) -> tuple[bool, bool, str]:
    """(base passed, plus passed, reason) from a verdict."""
    part, kind = verdict[0], verdict[1]
    if kind == "pass":
        return True, part == "plus", ""
    base_ok = part == "plus"
    where = f"{part} input {verdict[2]}"
    if kind == "time":
        return base_ok, False, f"time limit: {where} took {verdict[3]:.3g} s, over its limit of {verdict[4]:.3g} s"
    if kind == "error":
        return base_ok, False, f"runtime error on {where}: {verdict[3]}"
    return base_ok, False, f"wrong answer on {where}: got {verdict[3]}"
