"""Exact outputs: a run's value counts only when its repr reads back as the very same value.

Two checks, one per side of the sandbox:

- ``value_problem`` runs in the confined child on the returned object itself: every part must be
  of an exact literal type (``int``, ``str``, ``list``, ...; no subclasses, whose repr may say
  anything) and no container may contain itself (a self-referencing list reprs as ``[[...]]``,
  which reads back as ``[[Ellipsis]]``).
- ``output_problem`` runs in the caller on the text: it must be one Python literal that
  ``verifier.literals`` reads (in time bounded by its length) and hold no ``...`` (the recursion marker of ``repr``; a genuine
  ``Ellipsis`` reprs as a name, which is not a literal).

Standard library only: the fork server imports this module.
"""

from __future__ import annotations

import ast

from verifier.literals import LiteralError, PARSE_ERRORS, build_checked, parse

LITERAL_SCALARS: frozenset[type] = frozenset({int, float, complex, str, bytes, bool, type(None)})
LITERAL_CONTAINERS: frozenset[type] = frozenset({tuple, list, dict, set})


def value_problem(value: object, max_items: int = 1_000_000) -> str | None:
    """Why ``repr(value)`` would not read back as ``value``, or None. Iterative (no recursion
    limit), visits at most ``max_items`` parts (an output that large is refused by size anyway)."""
    stack: list[tuple[object, bool]] = [(value, False)]
    open_containers: set[int] = set()
    seen = 0
    while stack:
        item, leaving = stack.pop()
        if leaving:
            open_containers.discard(id(item))
            continue
        seen += 1
        if seen > max_items:
            return "output has too many parts to check"
        kind = type(item)
        if kind in LITERAL_SCALARS:
            continue
        if kind not in LITERAL_CONTAINERS:
            return f"output holds a {kind.__name__}, whose repr is not a Python literal of the same value"
        if id(item) in open_containers:
            return f"output {kind.__name__} contains itself: its repr does not read back as the value"
        open_containers.add(id(item))
        stack.append((item, True))
        if kind is dict:
            for key, val in item.items():  # type: ignore[union-attr]
                stack.append((key, False))
                stack.append((val, False))
        else:
            stack.extend((part, False) for part in item)  # type: ignore[union-attr]
    return None


def output_problem(output: str) -> str | None:
    """None when ``output`` is one Python literal holding no recursion marker, else the reason."""
    try:
        tree = parse(output, "eval")
    except PARSE_ERRORS:
        return f"output is not a Python literal: {output[:80]}"
    try:
        build_checked(tree)
    except LiteralError as exc:
        return f"output is not a Python literal ({str(exc)[:120]}): {output[:80]}"
    for node in ast.walk(tree):
        if type(node) is ast.Constant and node.value is Ellipsis:
            return f"output holds '...', the repr of a container that contains itself: {output[:80]}"
    return None
