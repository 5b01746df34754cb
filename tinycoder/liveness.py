"""Dead code in a generator program: variables and helpers of ``f`` its return value never depends on.

The generator chains phases and may define a helper ``g``; a phase whose result no later phase or return reads, or a
``g`` never called, lengthens the program without giving its solver more to do, so lines of code then overstate the
work a task asks. This is a syntactic backward dependency analysis of ``f``'s body (nothing is run):

- the names read by every ``return`` (and by the conditions of the blocks around it) are live;
- a statement that changes a live name (an assignment, an augmented assignment, a mutating call such as
  ``letters.append(w)``; ``tinycoder.line_trace.changed``) makes every name it reads live, and so do the conditions
  and loop iterables of the blocks around it; a ``for`` loop whose target is live makes its iterable's names live;
- repeated until nothing changes. A name ``f`` assigns, or a helper it defines, that is not live is dead.
"""

from __future__ import annotations

import ast

from tinycoder.line_trace import changed, parse_f, target_names


def _reads(node: ast.AST | None) -> set[str]:
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _statement_reads(statement: ast.stmt) -> set[str]:
    if isinstance(statement, ast.AugAssign):
        return _reads(statement.value) | _reads(statement.target) | set(changed(statement))
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return _reads(statement.value) | {name for target in targets for name in _reads(target)}
    return _reads(statement)


def _headers(statement: ast.stmt) -> set[str]:
    """What a compound statement reads to decide which of its children run."""
    if isinstance(statement, (ast.If, ast.While)):
        return _reads(statement.test)
    if isinstance(statement, ast.For):
        return _reads(statement.iter)
    return set()


def _walk(body: list[ast.stmt], around: frozenset[str], out: list[tuple[ast.stmt, frozenset[str]]]) -> None:
    """Every statement of ``body`` (nested blocks included, helper bodies not) with the names the blocks around it read."""
    for statement in body:
        out.append((statement, around))
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        inner = around | _headers(statement)
        for field in ("body", "orelse", "finalbody"):
            _walk(getattr(statement, field, []) or [], frozenset(inner), out)
        for handler in getattr(statement, "handlers", []) or []:
            _walk(handler.body, frozenset(inner), out)


def dead_code(source: str) -> list[str] | None:
    """The names ``f`` assigns, and the helpers it defines, that its return value never depends on (module
    docstring), in order of first definition; None when ``source`` is not one top-level ``def f``."""
    module = parse_f(source)
    if module is None:
        return None
    statements: list[tuple[ast.stmt, frozenset[str]]] = []
    _walk(module.body[0].body, frozenset(), statements)
    live: set[str] = set()
    for statement, around in statements:
        if isinstance(statement, ast.Return):
            live |= _reads(statement.value) | around
    grown = True
    while grown:
        grown = False
        for statement, around in statements:
            if isinstance(statement, ast.For) and set(target_names(statement.target)) & live:
                new = _reads(statement.iter) | around
            elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and set(changed(statement)) & live:
                new = _statement_reads(statement) | around
            else:
                continue
            if not new <= live:
                live |= new
                grown = True
    defined: list[str] = []
    for statement, _ in statements:
        names = [statement.name] if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) else changed(statement)
        defined += [name for name in names if name not in defined]
    return [name for name in defined if name not in live]

