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

Per input (``same`` in ``JUDGE_SOURCE``): exact equality, then the special oracles keyed by the
dataset (``mbpp`` for ``Mbpp/`` task ids, else ``humaneval``) and the **entry point name**, as
evalplus keys them:

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
  (``sum(c * math.pow(x, i))``), nothing else (0.3.1 never recorded this input as passed, so every
  answer failed there; fixed on main by 6eb1e19).

Then the float rules above. An input fails on any exception, on a call over its time limit, or on a
wrong value; evaluation of a part stops at its first failing input. A sample is **base**-correct
when every base input passes and **plus**-correct when every base and every plus input passes.
"""

from __future__ import annotations

MIN_TIME_LIMIT_S = 4.0
TIME_LIMIT_FACTOR = 4.0
PER_TASK_CAP_S = 60.0
MEMORY_MB = 4096
FLOAT_ATOL = 1e-6
ALLCLOSE_RTOL = 1e-7

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


# In-program judging code (runs inside the sandbox, after the candidate's code). Names start with
# ``_ep_`` so a candidate's own helpers are not shadowed by accident. ``_ep_allclose`` is
# numpy.allclose for nested lists/tuples of numbers (broadcasting; infinities close only to
# themselves, NaN to nothing; ragged or non-numeric data fail, as numpy raises there).
JUDGE_SOURCE = '''
import math as _ep_math
import time as _ep_time
_ep_perf = _ep_time.perf_counter
def _ep_poly(xs, x):
    return sum([c * _ep_math.pow(x, i) for i, c in enumerate(xs)])
def _ep_surface_area(base_edge, height):
    slant = _ep_math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 2 * base_edge * slant)
def _ep_digit_distance(a, b):
    x, y = str(a), str(b)
    width = max(len(x), len(y))
    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(width), y.zfill(width)))
def _ep_is_floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(v, float) for v in x)
def _ep_array(x):
    if isinstance(x, (list, tuple)):
        parts = [_ep_array(v) for v in x]
        if any(p is None for p in parts) or any(p[0] != parts[0][0] for p in parts):
            return None
        inner = parts[0][0] if parts else ()
        return ((len(x),) + inner, [v for p in parts for v in p[1]])
    if isinstance(x, (bool, int, float, complex)):
        return ((), [x])
    return None
def _ep_finite(x):
    if isinstance(x, complex):
        return _ep_math.isfinite(x.real) and _ep_math.isfinite(x.imag)
    return _ep_math.isfinite(x)
def _ep_close(x, y, rtol, atol):
    if not (_ep_finite(x) and _ep_finite(y)):
        return x == y
    return abs(x - y) <= atol + rtol * abs(y)
def _ep_allclose(a, b, rtol, atol):
    pa, pb = _ep_array(a), _ep_array(b)
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
    def strides(s):
        out, step = [], 1
        for d in reversed(s):
            out.append(0 if d == 1 else step)
            step *= d
        return list(reversed(out))
    ta, tb = strides(sa), strides(sb)
    total = 1
    for d in shape:
        total *= d
    for k in range(total):
        ia = ib = 0
        rest = k
        for axis in range(n - 1, -1, -1):
            rest, digit = divmod(rest, shape[axis])
            ia += digit * ta[axis]
            ib += digit * tb[axis]
        if not _ep_close(fa[ia], fb[ib], rtol, atol):
            return False
    return True
def _ep_same(out, exp, args, atol):
    exact = out == exp
    if _EP_DATASET == "mbpp":
        if _EP_ENTRY == "are_equivalent":
            exact = True
        elif _EP_ENTRY == "sum_div":
            exact = exact or out == 0
        elif _EP_ENTRY == "surface_Area":
            exact = exact or abs(out - _ep_surface_area(*args)) <= atol
        elif _EP_ENTRY == "digit_distance_nums":
            exact = exact or out == _ep_digit_distance(*args)
        elif _EP_ENTRY in _EP_SET_EQ:
            exact = set(out) == set(exp)
        elif _EP_ENTRY in _EP_NOT_NONE:
            exact = (out == exp) if isinstance(out, bool) else (exp == (out is not None))
    if _EP_DATASET == "humaneval" and _EP_ENTRY == "find_zero":
        return abs(_ep_poly(*args, out)) <= atol, atol
    if atol == 0 and _ep_is_floats(exp):
        atol = %(float_atol)r
    if not exact and atol != 0:
        if type(out) != type(exp):
            return False, atol
        if isinstance(exp, (list, tuple)) and len(out) != len(exp):
            return False, atol
        return _ep_allclose(out, exp, %(rtol)r, atol), atol
    return bool(exact), atol
def _ep_part(fn, inputs, expected, limits):
    atol = _EP_ATOL
    for i, args in enumerate(inputs):
        try:
            start = _ep_perf()
            out = fn(*args)
            took = _ep_perf() - start
        except BaseException as exc:
            return ("error", i, repr(exc)[:200])
        if took > limits[i]:
            return ("time", i, took, limits[i])
        try:
            ok, atol = _ep_same(out, expected[i], args, atol)
        except BaseException as exc:
            return ("wrong", i, "comparing raised " + repr(exc)[:160])
        if not ok:
            return ("wrong", i, repr(out)[:200])
    return ("pass",)
''' % {"float_atol": FLOAT_ATOL, "rtol": ALLCLOSE_RTOL}


def _header(task_id: str, entry_point: str, atol: float) -> str:
    return (f"_EP_DATASET = {dataset_of(task_id)!r}\n_EP_ENTRY = {entry_point!r}\n_EP_ATOL = {atol!r}\n"
            f"_EP_SET_EQ = {sorted(MBPP_OUTPUT_SET_EQ_TASKS)!r}\n_EP_NOT_NONE = {sorted(MBPP_OUTPUT_NOT_NONE_TASKS)!r}\n")


def reference_program(code: str, entry_point: str, base: list, plus: list, not_none: bool) -> str:
    """A program whose ``f()`` runs the reference ``code`` on a deep copy of every base and plus
    input, timing each call alone (``time.perf_counter`` around the call, as evalplus's
    ``trusted_exec`` times around it), and returns ``[(repr(outputs), times), ...]`` for base and
    plus. With ``not_none`` the outputs are ``out is not None`` (evalplus's NOT_NONE tasks)."""
    return (
        f"{code}\n\nimport copy as _ep_copy\nimport time as _ep_time\n_ep_perf = _ep_time.perf_counter\n"
        f"_EP_PARTS = ({base!r}, {plus!r})\n_EP_FN = {entry_point}\n"
        "def f():\n    result = []\n    for part in _EP_PARTS:\n        values, times = [], []\n"
        "        for args in part:\n            args = _ep_copy.deepcopy(args)\n            start = _ep_perf()\n"
        "            value = _EP_FN(*args)\n            times.append(_ep_perf() - start)\n"
        f"            values.append(value is not None if {not_none!r} else value)\n"
        "        result.append((repr(values), times))\n    return result\n"
    )


def candidate_program(code: str, task_id: str, entry_point: str, atol: float, base: list, plus: list,
                      expected_base: str, expected_plus: str, limits_base: list[float], limits_plus: list[float]) -> str:
    """A program whose ``f()`` judges the candidate ``code`` on the base inputs, then (when they all
    pass) on the plus inputs, in this one process, and returns ``(part, verdict...)``: ``("plus",
    "pass")`` when everything passed, else the first failing input of the part it stopped in
    (``"error"``, ``"time"`` with its time and limit, or ``"wrong"``). The expected outputs are the
    reference's reprs, written in as code."""
    return (
        f"{code}\n\n_EP_FN = {entry_point}\n{_header(task_id, entry_point, atol)}{JUDGE_SOURCE}\n"
        f"_EP_BASE = {base!r}\n_EP_PLUS = {plus!r}\n_EP_EXP_BASE = {expected_base}\n_EP_EXP_PLUS = {expected_plus}\n"
        f"_EP_LIM_BASE = {limits_base!r}\n_EP_LIM_PLUS = {limits_plus!r}\n"
        "def f():\n    base = _ep_part(_EP_FN, _EP_BASE, _EP_EXP_BASE, _EP_LIM_BASE)\n"
        "    if base[0] != 'pass':\n        return ('base',) + base\n"
        "    return ('plus',) + _ep_part(_EP_FN, _EP_PLUS, _EP_EXP_PLUS, _EP_LIM_PLUS)\n"
    )


def describe(verdict: tuple) -> tuple[bool, bool, str]:
    """(base passed, plus passed, reason) from a candidate program's return value."""
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
