"""Code from a model's answer, cut out the way evalplus's sanitiser cuts it (evalplus main @ 26d6d00).

evalplus (``evalplus/sanitize.py``) judges ``sanitize(response, entry_point)``; the rules, restated:

1. **Longest parseable window** (``longest_parseable``): ANSI escape sequences are removed, the text
   is split into lines, and among all windows of *at least two* consecutive lines that parse as
   Python (``ast.parse``), the one with the most non-blank lines wins; ties go to the earliest start,
   then the earliest end. When no window parses, the first line is kept.
2. **Reachable definitions** (``reachable_definitions``): of that window's top-level statements keep
   every import; classes; functions that contain a ``return`` anywhere in their body; and plain
   assignments (a statement that is an assignment). A name already kept is not kept again (the first
   definition wins; a tuple or attribute target has no name, so only the first such assignment is
   kept). Decorated functions and classes are dropped (evalplus's tree-sitter sees a
   ``decorated_definition``, which it does not keep). With an entry point, definitions are kept only
   when reachable from it through the identifiers each definition mentions. Imports come first,
   then the kept definitions in source order, joined by newlines.
3. If that is empty (after stripping), the window of rule 1 is the answer.

evalplus parses with tree-sitter; this module uses :mod:`ast` on text rule 1 already proved to
parse, so the two agree except where evalplus's tree walk for ``return`` stops early (a quirk of its
cursor bookkeeping that can miss a ``return`` placed after long single-child chains).
"""

from __future__ import annotations

import ast
import re

ANSI_ESCAPE = re.compile(r"\x1b(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False


def longest_parseable(text: str) -> str:
    """Rule 1: the window of >= 2 lines that parses and has the most non-blank lines (earliest wins).

    Same answer as trying every (start, end) pair in order, computed with fewer parses: for each
    start the ends are tried from the last line down, only while the window could still beat the best
    so far (the count of non-blank lines grows with the end), then the earliest end with the same
    count that parses is taken."""
    lines = ANSI_ESCAPE.sub("", text).split("\n")
    n = len(lines)
    filled = [0] * (n + 1)  # filled[k]: non-blank lines among lines[:k]
    for k, line in enumerate(lines):
        filled[k + 1] = filled[k] + (1 if line.strip() else 0)
    best, best_pair = 0, (0, 0)
    for i in range(n):
        if filled[n] - filled[i] <= best:
            break  # no window starting here (or later) can have more non-blank lines
        for j in range(n - 1, i, -1):
            count = filled[j + 1] - filled[i]
            if count <= best:
                break
            if _parses("\n".join(lines[i : j + 1])):
                # the earliest end with this count (ends differing only by blank lines) that parses
                first = j
                while first - 1 > i and filled[first] - filled[i] == count:
                    first -= 1
                for end in range(first, j + 1):
                    if end == j or _parses("\n".join(lines[i : end + 1])):
                        best, best_pair = count, (i, end)
                        break
                break
    return "\n".join(lines[best_pair[0] : best_pair[1] + 1])


def _mentioned(node: ast.AST) -> set[str]:
    """Every identifier a definition mentions (names, attributes, parameters, keywords, aliases)."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)
        elif isinstance(sub, ast.keyword) and sub.arg:
            names.add(sub.arg)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(sub.name)
        elif isinstance(sub, ast.alias):
            names.add((sub.asname or sub.name).split(".")[0])
        elif isinstance(sub, (ast.Global, ast.Nonlocal)):
            names.update(sub.names)
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            names.add(sub.name)
    return names


def _has_return(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Return) for sub in ast.walk(node))


def _segment(lines: list[str], node: ast.AST) -> str:
    """The source text of ``node`` (from its first to its last character)."""
    first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
    if first == last:
        return lines[first][node.col_offset : node.end_col_offset]  # type: ignore[attr-defined]
    return "\n".join([lines[first][node.col_offset :], *lines[first + 1 : last], lines[last][: node.end_col_offset]])  # type: ignore[attr-defined]


def reachable_definitions(code: str, entry_point: str | None) -> str:
    """Rule 2 on ``code`` (text that parses): imports, then the kept definitions reachable from
    ``entry_point`` (all kept definitions when it is None or empty)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    lines = code.split("\n")
    imports: list[ast.stmt] = []
    definitions: list[tuple[str | None, ast.AST]] = []
    taken: set[str | None] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            imports.append(stmt)
            continue
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if stmt.decorator_list:
                continue
            if not isinstance(stmt, ast.ClassDef) and not _has_return(stmt):
                continue
            name: str | None = stmt.name
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
            name = target.id if isinstance(target, ast.Name) else None
        else:
            continue
        if name in taken:
            continue
        taken.add(name)
        definitions.append((name, stmt))
    keep = {name for name, _ in definitions}
    if entry_point:
        deps = {name: _mentioned(node) for name, node in definitions}
        keep, queue = {entry_point}, [entry_point]
        while queue:
            for other in deps.get(queue.pop(0), ()):
                if other not in keep:
                    keep.add(other)
                    queue.append(other)
    parts = [_segment(lines, node) for node in imports]
    parts += [_segment(lines, node) for name, node in definitions if name in keep]
    return "\n".join(parts)


def sanitize(response: str, entry_point: str | None = None) -> str:
    """evalplus's ``sanitize``: rule 2 on rule 1's window, stripped; rule 1's window if that is empty."""
    window = longest_parseable(response)
    kept = reachable_definitions(window, entry_point).strip()
    return kept or window
