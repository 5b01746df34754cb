"""Program metrics behind the paper's collapse-vs-expansion evidence, from the standard ``ast``.

- ``ast_depth``: longest root-to-leaf path of the AST (module = 1).
- ``cyclomatic``: McCabe's M = 1 + number of decision points, counted with radon's rules over the
  whole program: +1 per ``if``/``elif``/ternary, ``for``/``while`` (+1 more with ``else``),
  ``except`` handler (+1 for a ``try ... else``), ``assert``, comprehension (+1 per ``if`` in
  it), ``match`` case other than a wildcard, and ``len(values) - 1`` per ``and``/``or``.
- ``loc``: source lines that are neither blank nor comment-only.
- ``variables``: distinct names the program binds (assignment targets, parameters, loop and
  ``with``/``except`` targets).
- ``nodes``: number of AST nodes.

Coverage: ``structure_fingerprint`` is the set of AST node-type n-grams of the pre-order walk
(identifiers and constants play no part), and ``structure_hash`` a hash of the AST with every
identifier and constant abstracted, so two programs share it when they have the same structure.
``Coverage`` accumulates both over training (distinct n-grams growing = the problem space expanding).
"""

from __future__ import annotations

import ast
import hashlib
from typing import Iterable

_CONTEXTS = (ast.Load, ast.Store, ast.Del)


def _parse(program: str) -> ast.Module:
    try:
        return ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"program does not parse: {type(exc).__name__}: {exc}") from None


def _depth(tree: ast.AST) -> int:
    depth, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        depth = max(depth, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node) if not isinstance(child, _CONTEXTS))
    return depth


def _decisions(node: ast.AST) -> int:
    if isinstance(node, (ast.If, ast.IfExp, ast.Assert)):
        return 1
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        return 1 + bool(node.orelse)
    if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
        return len(node.handlers) + bool(node.orelse)
    if isinstance(node, ast.BoolOp):
        return len(node.values) - 1
    if isinstance(node, ast.comprehension):
        return 1 + len(node.ifs)
    if isinstance(node, ast.match_case):
        wildcard = isinstance(node.pattern, ast.MatchAs) and node.pattern.pattern is None and node.guard is None
        return 0 if wildcard else 1
    return 0


def _bound_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def program_metrics(program: str) -> dict[str, int]:
    """``ast_depth``, ``cyclomatic``, ``loc``, ``variables``, ``nodes`` of ``program`` (ValueError if it does not parse)."""
    tree = _parse(program)
    nodes = [n for n in ast.walk(tree) if not isinstance(n, _CONTEXTS)]
    loc = sum(1 for line in program.splitlines() if line.strip() and not line.strip().startswith("#"))
    return {
        "ast_depth": _depth(tree),
        "cyclomatic": 1 + sum(_decisions(n) for n in nodes),
        "loc": loc,
        "variables": len(_bound_names(tree)),
        "nodes": len(nodes),
    }


def _preorder_types(tree: ast.AST) -> list[str]:
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        out.append(type(node).__name__)
        stack.extend(reversed([c for c in ast.iter_child_nodes(node) if not isinstance(c, _CONTEXTS)]))
    return out


def structure_fingerprint(program: str, n: int = 3) -> frozenset[tuple[str, ...]]:
    """The set of n-grams of AST node types in pre-order (identifiers and constants ignored)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    types = _preorder_types(_parse(program))
    return frozenset(tuple(types[i : i + n]) for i in range(max(1, len(types) - n + 1)))


class _Abstract(ast.NodeTransformer):
    """Replace every identifier by ``_`` and every constant by its type name."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = "_"
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg, node.annotation, node.type_comment = "_", None, None
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.attr = "_"
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=type(node.value).__name__)

    def visit_alias(self, node: ast.alias) -> ast.AST:
        node.name, node.asname = "_", None
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("name", "module", "arg"):
            if isinstance(getattr(node, field, None), str):
                setattr(node, field, "_")
        return super().generic_visit(node)


def structure_hash(program: str) -> str:
    """A short hash of the program's structure: equal for programs that differ only in names and constants."""
    tree = _Abstract().visit(_parse(program))
    return hashlib.sha1(ast.dump(tree, annotate_fields=False).encode()).hexdigest()[:16]


class Coverage:
    """Problem-space coverage over time: distinct AST n-grams and distinct structures seen so far."""

    def __init__(self, n: int = 3):
        self.n = n
        self.ngrams: set[tuple[str, ...]] = set()
        self.structures: set[str] = set()
        self.programs = 0

    def update(self, programs: Iterable[str]) -> dict[str, int]:
        """Add programs (unparsable ones are skipped); returns how many new n-grams and structures they brought."""
        before = (len(self.ngrams), len(self.structures))
        for program in programs:
            try:
                self.ngrams |= structure_fingerprint(program, self.n)
                self.structures.add(structure_hash(program))
            except ValueError:
                continue
            self.programs += 1
        return {"new_ngrams": len(self.ngrams) - before[0], "new_structures": len(self.structures) - before[1]}

    def summary(self) -> dict[str, int]:
        return {"programs": self.programs, "distinct_ngrams": len(self.ngrams), "distinct_structures": len(self.structures)}

    def state_dict(self) -> dict:
        return {"n": self.n, "ngrams": sorted(list(g) for g in self.ngrams), "structures": sorted(self.structures), "programs": self.programs}

    def load_state_dict(self, state: dict) -> None:
        self.n = int(state["n"])
        self.ngrams = {tuple(g) for g in state["ngrams"]}
        self.structures = set(state["structures"])
        self.programs = int(state["programs"])
