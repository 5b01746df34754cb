"""Reading untrusted literal text in the caller, in time bounded by its length.

Outputs, argument lists and student answers are model-controlled text that the caller turns into
values. ``ast.literal_eval`` would do it, but it builds sets and dicts from whatever the text holds:
values whose hashes all collide (the multiples of ``2**61 - 1``, complex numbers whose parts cancel
in ``hash``) make every insertion probe every earlier one, so a 300,000-character set takes
seconds and a 20-million-character one hours, in the caller, under whatever lock it holds.

``read`` accepts exactly the grammar of ``ast.literal_eval`` (constants, tuples, lists, sets,
``set()``, dicts, a sign on a number, a real plus or minus an imaginary number) and builds the same
value, except that a set or dict in which more than ``MAX_SHARED_HASH`` unequal values share one
hash is refused: with at most that many values per hash, building the container and comparing it
with another costs at most ``MAX_SHARED_HASH`` probes per element. No honest output comes near it
(a set's repr holds no two equal values, and unequal ones collide by chance about once in
``2**61``).

``parse`` is the one place that calls ``ast.parse`` on text of a run or a model: CPython 3.11's
parser keeps the depth of the tree it builds in state shared between threads, so two threads
parsing at once can fail with "AST constructor recursion depth mismatch". ``PARSER_LOCK`` is held
around ``ast.parse`` alone; building values and comparing them happen outside it.
"""

from __future__ import annotations

import ast
import threading
from collections import Counter
from typing import Any

PARSER_LOCK = threading.Lock()
MAX_SHARED_HASH = 64
PARSE_ERRORS = (SyntaxError, ValueError, TypeError, MemoryError, RecursionError)


class LiteralError(ValueError):
    """The text is not one Python literal, or holds a set or dict this module refuses to build."""


def parse(text: str, mode: str = "eval", filename: str = "<unknown>") -> ast.AST:
    """``ast.parse`` under ``PARSER_LOCK`` (see the module docstring); raises what it raises."""
    with PARSER_LOCK:
        return ast.parse(text, filename, mode)


def _number(node: ast.AST) -> int | float | complex:
    if type(node) is ast.Constant and type(node.value) in (int, float, complex):
        return node.value
    raise LiteralError(f"not a Python literal: a {type(node).__name__} node")


def _signed_number(node: ast.AST) -> int | float | complex:
    if type(node) is ast.UnaryOp and type(node.op) in (ast.UAdd, ast.USub):
        value = _number(node.operand)
        return -value if type(node.op) is ast.USub else +value
    return _number(node)


def _distinct_hashes(keys: list[Any]) -> None:
    """Refuse ``keys`` when more than ``MAX_SHARED_HASH`` unequal ones share a hash value.

    Hashing each key costs its size; the counts are a dict keyed by the hash values themselves
    (distinct ints, so they do not collide). Only a group over the bound is looked at: each member is
    compared with the group's distinct values found so far, of which there are at most
    ``MAX_SHARED_HASH`` before the keys are refused (equal duplicates insert in one probe)."""
    try:
        hashes = [hash(key) for key in keys]
    except TypeError as exc:
        raise LiteralError(f"not a Python literal: an unhashable set element or dict key ({exc})") from None
    crowded = {h for h, n in Counter(hashes).items() if n > MAX_SHARED_HASH}
    if not crowded:
        return
    distinct: dict[int, list[Any]] = {h: [] for h in crowded}
    for h, key in zip(hashes, keys):
        if h not in distinct or any(key == seen for seen in distinct[h]):
            continue
        distinct[h].append(key)
        if len(distinct[h]) > MAX_SHARED_HASH:
            raise LiteralError(f"not read: a set or dict holds more than {MAX_SHARED_HASH} unequal values of one hash value "
                               f"({h}); such text is refused, not read")


def bounded_set(values: list[Any]) -> set[Any]:
    """``set(values)`` with the bound of the module docstring: raises ``LiteralError`` when more than
    ``MAX_SHARED_HASH`` unequal values share one hash (or one is unhashable). For callers that turn
    an already-read list into a set (evalplus's set-compared tasks)."""
    _distinct_hashes(values)
    return set(values)


def build(node: ast.AST) -> Any:
    """The value of a literal expression tree (``ast.literal_eval``'s grammar), with the bound of
    the module docstring on sets and dicts. Raises ``LiteralError`` naming what is wrong."""
    kind = type(node)
    if kind is ast.Expression:
        return build(node.body)  # type: ignore[attr-defined]
    if kind is ast.Constant:
        return node.value  # type: ignore[attr-defined]
    if kind is ast.Tuple:
        return tuple([build(e) for e in node.elts])  # type: ignore[attr-defined]
    if kind is ast.List:
        return [build(e) for e in node.elts]  # type: ignore[attr-defined]
    if kind is ast.Set:
        return bounded_set([build(e) for e in node.elts])  # type: ignore[attr-defined]
    if kind is ast.Call and type(node.func) is ast.Name and node.func.id == "set" and not node.args and not node.keywords:  # type: ignore[attr-defined]
        return set()
    if kind is ast.Dict:
        if any(k is None for k in node.keys) or len(node.keys) != len(node.values):  # type: ignore[attr-defined]
            raise LiteralError("not a Python literal: a dict with ** unpacking")
        keys = [build(k) for k in node.keys]  # type: ignore[attr-defined]
        values = [build(v) for v in node.values]  # type: ignore[attr-defined]
        _distinct_hashes(keys)
        return dict(zip(keys, values))
    if kind is ast.BinOp and type(node.op) in (ast.Add, ast.Sub):  # type: ignore[attr-defined]
        left, right = _signed_number(node.left), _number(node.right)  # type: ignore[attr-defined]
        if isinstance(left, (int, float)) and isinstance(right, complex):
            return left + right if type(node.op) is ast.Add else left - right  # type: ignore[attr-defined]
        raise LiteralError("not a Python literal: an operation other than real +/- imaginary")
    return _signed_number(node)


def read(text: str) -> Any:
    """The value of literal ``text`` (leading spaces and tabs ignored, as ``ast.literal_eval``
    does). Raises ``LiteralError``; never anything else for any string."""
    if not isinstance(text, str):
        raise LiteralError(f"expected text, got {type(text).__name__}")
    try:
        tree = parse(text.lstrip(" \t"))
    except PARSE_ERRORS as exc:
        raise LiteralError(f"not a Python literal: {type(exc).__name__}: {str(exc)[:80]}") from None
    return build_checked(tree)


def build_checked(node: ast.AST) -> Any:
    """``build``, with the interpreter's own failures on pathological values (memory, depth) as ``LiteralError``."""
    try:
        return build(node)
    except LiteralError:
        raise
    except (MemoryError, RecursionError, TypeError, ValueError) as exc:
        raise LiteralError(f"not a Python literal: {type(exc).__name__}: {str(exc)[:80]}") from None


def equal(a_text: str, b_text: str) -> bool:
    """Value equality of two literal texts (``1.0`` equals ``1``, ``(1,2)`` equals ``(1, 2)``);
    False when either is not a literal this module reads."""
    try:
        a, b = read(a_text), read(b_text)
    except LiteralError:
        return False
    try:
        return bool(a == b)
    except (RecursionError, MemoryError, TypeError, ValueError):
        return False
