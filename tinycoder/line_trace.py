"""Per-line execution traces of generator programs: what a student that traces a program line by line writes
before its answer (``ExampleMix.student_trace = "lines"``).

A trace is the sequence of states a reader who runs the program in their head passes through: after every
executed assignment, augmented assignment or mutating call (``letters.append(w)``) in ``f``'s own body, the
variable it changed and its value; at the top of every ``for`` iteration, the loop variable(s). A helper ``g`` is
not traced inside (its calls are one step, as a reader would look them up). ``name = repr`` lines, one per event,
so a program of more lines, or of more iterations, is more steps, and each step is a chance to err.

:func:`instrument` rewrites a generator program with :mod:`ast` on the host (nothing is run here) so that its
``f`` returns the list of its events instead of its value; the corpus's verifier runs it on the task's input
(:func:`line_traces`), and :func:`render` reads the events back with the verifier's bounded literal reader.
A trace longer than the completion's budget keeps its first events and elides the rest with one ``...`` line:
the student then answers from there, as a model with a short context does.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from verifier import literals
from verifier.sandbox import ExecResult, Status

LOG = "trace_log"  # the instrumented program's event list (no leading underscore: the guard rejects those)
MAX_EVENTS = 64  # the instrumented program stops recording here, so its output stays bounded
ELIDED = "..."


def _event(name: str) -> ast.stmt:
    """``if len(trace_log) < MAX_EVENTS: trace_log.append(('name', repr(name)))``"""
    return ast.parse(f"if len({LOG}) < {MAX_EVENTS}:\n    {LOG}.append(({name!r}, repr({name})))").body[0]


def target_names(target: ast.expr) -> list[str]:
    """The variables an assignment to ``target`` changes: a name, the names of a tuple, the base of ``d[k]``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in target_names(element)]
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return target_names(target.value)
    return []


def changed(statement: ast.stmt) -> list[str]:
    """The variables ``statement`` changes, in order: assigned (a name, a tuple's names, the base of ``d[k]``),
    augmented-assigned, or mutated by a method call on a name (``nums.append(x)``, ``letters.pop()``)."""
    if isinstance(statement, ast.Assign):
        return [name for target in statement.targets for name in target_names(target)]
    if isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        return target_names(statement.target)
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return [func.value.id]  # nums.append(x), letters.pop()
    return []


def _traced_body(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(statement)  # a helper: one step where it is called
            continue
        if isinstance(statement, (ast.For, ast.AsyncFor)):
            statement.body = [_event(name) for name in target_names(statement.target)] + _traced_body(statement.body)
            statement.orelse = _traced_body(statement.orelse)
        elif isinstance(statement, (ast.While, ast.If)):
            statement.body = _traced_body(statement.body)
            statement.orelse = _traced_body(statement.orelse)
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            statement.body = _traced_body(statement.body)
        elif isinstance(statement, ast.Try):
            statement.body = _traced_body(statement.body)
            statement.orelse = _traced_body(statement.orelse)
            statement.finalbody = _traced_body(statement.finalbody)
            for handler in statement.handlers:
                handler.body = _traced_body(handler.body)
        out.append(statement)
        for name in dict.fromkeys(changed(statement)):
            out.append(_event(name))
    return out


def parse_f(source: str) -> ast.Module | None:
    """``source`` parsed, when it is one top-level ``def f`` (a generator program's form); else None."""
    try:
        module = ast.parse(source)
    except SyntaxError:
        return None
    if len(module.body) != 1 or not isinstance(module.body[0], ast.FunctionDef) or module.body[0].name != "f":
        return None
    return module


def instrument(source: str) -> str | None:
    """``source`` with ``f`` returning its list of ``(name, repr(value))`` events (module docstring) instead of its
    value; None when ``source`` is not one top-level ``def f``."""
    module = parse_f(source)
    if module is None:
        return None
    original = module.body[0]
    original.name = "run_f"
    original.body = _traced_body(original.body)
    arguments = ", ".join(arg.arg for arg in original.args.args)
    wrapper = ast.parse(f"def f({arguments}):\n    {LOG}.clear()\n    run_f({arguments})\n    return {LOG}").body[0]
    module.body = [ast.parse(f"{LOG} = []").body[0], original, wrapper]
    return ast.unparse(ast.fix_missing_locations(module)) + "\n"


def read_events(result: ExecResult) -> list[tuple[str, str]] | None:
    """The ``(name, repr)`` events of an instrumented run, read with the bounded literal reader; None when the run
    failed or its output is not a list of such pairs."""
    if result.status is not Status.OK or result.output is None:
        return None
    try:
        events = literals.read(result.output)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(events, list) or not all(
            isinstance(e, tuple) and len(e) == 2 and all(isinstance(part, str) for part in e) for e in events):
        return None
    return events


def render(result: ExecResult, budget: int) -> tuple[str, ...]:
    """The ``name = value`` lines of an instrumented run's events (:func:`read_events`), at most ``budget``
    characters of them, the rest elided as one ``...`` line; empty when the run gives no events."""
    events = read_events(result) or []
    lines: list[str] = []
    used = 0
    for at, (name, value) in enumerate(events):
        line = f"{name} = {value}"
        if used + len(line) + 1 > budget or (at == MAX_EVENTS - 1 and len(events) == MAX_EVENTS):
            lines.append(ELIDED)
            break
        lines.append(line)
        used += len(line) + 1
    return tuple(lines)


def _runs(executor, items: Sequence[tuple[str, str]]) -> list[ExecResult | None]:
    """Each ``(program, input)``'s instrumented run by ``executor`` (``Verifier.execute_many``: the sandbox), in one
    batch; None where the program cannot be instrumented."""
    sources = [instrument(program) for program, _ in items]
    runnable = [(source, args) for source, (_, args) in zip(sources, items) if source is not None]
    results = iter(executor.execute_many(runnable, repeats=1) if runnable else [])
    return [next(results) if source is not None else None for source in sources]


def line_traces(executor, items: Sequence[tuple[str, str]], budget: int) -> list[tuple[str, ...]]:
    """The rendered trace of each ``(program, input)`` (:func:`render`; empty where the program cannot be
    instrumented or its instrumented run fails)."""
    return [render(result, budget) if result is not None else () for result in _runs(executor, items)]


def step_counts(executor, items: Sequence[tuple[str, str]]) -> list[int | None]:
    """How many steps (events) running each ``(program, input)`` takes a line-by-line reader: the work a code_o task
    asks, set by the program and its input together (``MAX_EVENTS`` means at least that many); None where unknown."""
    counts = []
    for result in _runs(executor, items):
        events = None if result is None else read_events(result)
        counts.append(None if events is None else len(events))
    return counts
