"""A typed expression grammar for the program generator: every expression has one of six value types.

:class:`Expressions` draws an expression of a wanted type from the productions that yield it with
the variables in a :class:`Scope`. Sub-expressions get parentheses exactly where Python's operator
precedence needs them (each production reports the precedence of the text it returns). Compound
expressions must read a variable (``7 < 7`` or ``'x' + 'y'`` teaches a model nothing), and loop
variables are drawn more often than other names, so loop bodies work on the loop's data.

Nothing here executes code: the verifier runs the programs.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable

INT, STR, BOOL, LIST_INT, LIST_STR, DICT = "int", "str", "bool", "list[int]", "list[str]", "dict[str, int]"
VALUE_TYPES = (INT, STR, BOOL, LIST_INT, LIST_STR, DICT)

STR_LITERALS = ["'a'", "'e'", "'o'", "'x'", "'b'", "'-'", "'ab'", "''", "' '", "'*'", "':'", "'no'"]
# Precedence of emitted text (higher binds tighter).
ATOM, MUL, ADD, CMP, NOT, AND, OR, COND = 100, 80, 70, 50, 40, 30, 20, 10

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
Production = tuple[float, Callable[[], "tuple[str, int] | None"]]


def wrap(text: str, prec: int, need: int) -> str:
    """``text`` in parentheses when its precedence is lower than the context needs."""
    return f"({text})" if prec < need else text


@dataclass
class Scope:
    """Names visible at a point of the program: their types, which may be assigned, loop variables."""

    types: dict[str, str] = field(default_factory=dict)
    assignable: set[str] = field(default_factory=set)
    loop_vars: set[str] = field(default_factory=set)
    index_of: dict[str, str] = field(default_factory=dict)  # i of `for i in range(len(xs))` -> xs

    def names(self, kind: str) -> list[str]:
        return [name for name, t in self.types.items() if t == kind]

    def child(self) -> "Scope":
        return Scope(dict(self.types), set(self.assignable), set(self.loop_vars), dict(self.index_of))

    def bind_loop(self, name: str, kind: str) -> None:
        self.types[name] = kind
        self.loop_vars.add(name)

    def mentions(self, text: str, names: set[str] | None = None) -> bool:
        """Whether ``text`` reads a variable of this scope (or one of ``names``)."""
        wanted = names if names is not None else self.types.keys()
        return any(word in wanted for word in _IDENT.findall(text))


class Expressions:
    """Draws typed expressions from a seeded ``random.Random``; knows the helper functions defined so far."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.helpers: dict[str, tuple[str, str]] = {}  # name -> (parameter type, return type)
        self.features: set[str] = set()
        self.helper_weight = 2.0
        self._combining = False

    # ---------------------------------------------------------------- entry points
    def expr(self, scope: Scope, kind: str, depth: int) -> str:
        return self.expr_p(scope, kind, depth)[0]

    def expr_p(self, scope: Scope, kind: str, depth: int) -> tuple[str, int]:
        """An expression of type ``kind`` at most ``depth`` productions deep, and its precedence."""
        producer = {
            INT: self._int, STR: self._str, BOOL: self._bool,
            LIST_INT: self._list_int, LIST_STR: self._list_str, DICT: self._dict,
        }[kind]
        text, prec = producer(scope, max(depth, 0))
        for _ in range(5):
            if depth <= 0 or scope.mentions(text):
                break
            text, prec = producer(scope, depth)
        return text, prec

    def expr_using(self, scope: Scope, kind: str, depth: int, var: str) -> str:
        """An expression of type ``kind`` that reads ``var`` (a loop body that ignores its item is noise)."""
        for _ in range(8):
            text = self.expr(scope, kind, depth)
            if scope.mentions(text, {var}):
                return text
        return self.expr(scope, kind, 0) if scope.types.get(var) == kind else text

    def cond(self, scope: Scope, depth: int, need: int = 0, using: str | None = None) -> str:
        """A condition that reads a variable (``using`` when given); never a constant."""
        for _ in range(8):
            text, prec = self.expr_p(scope, BOOL, max(depth, 1))
            if scope.mentions(text, {using} if using else None):
                break
        return wrap(text, prec, need)

    # ---------------------------------------------------------------- plumbing
    def _sub(self, scope: Scope, kind: str, depth: int, need: int) -> str:
        text, prec = self.expr_p(scope, kind, depth - 1)
        return wrap(text, prec, need)

    def var(self, scope: Scope, kind: str) -> str | None:
        """A variable of type ``kind``; loop variables (the innermost data) are drawn most often."""
        names = scope.names(kind)
        if not names:
            return None
        weights = [4.0 if n in scope.loop_vars else 1.0 for n in names]
        return self.rng.choices(names, weights=weights)[0]

    def _helper_call(self, scope: Scope, ret: str, depth: int) -> tuple[str, int] | None:
        fits = [(n, p) for n, (p, r) in self.helpers.items() if r == ret]
        if not fits:
            return None
        name, param = self.rng.choice(fits)
        self.features.add("call")
        return f"{name}({self._sub(scope, param, max(depth, 1), 0)})", ATOM

    def _pick(self, options: list[Production]) -> tuple[str, int]:
        """The first production that applies, in an order drawn by weight."""
        pool = [(w, thunk) for w, thunk in options if w > 0]
        while pool:
            i = self.rng.choices(range(len(pool)), weights=[w for w, _ in pool])[0]
            got = pool.pop(i)[1]()
            if got is not None and got[0] is not None:
                return got
        raise AssertionError("no production applies")  # every type has a literal

    # ---------------------------------------------------------------- productions
    def _int(self, scope: Scope, depth: int) -> tuple[str, int]:
        rng = self.rng
        var = self.var(scope, INT)
        lists = scope.names(LIST_INT)
        sized = lists + scope.names(LIST_STR) + scope.names(STR) + scope.names(DICT)
        options: list[Production] = [
            (2, lambda: (str(rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 7, 10])), ATOM)),
            (6 if var else 0, lambda: (var, ATOM)),
            (1.5 if sized else 0, lambda: (f"len({self.var(scope, rng.choice([t for t in (LIST_INT, LIST_STR, STR, DICT) if scope.names(t)]))})", ATOM)),
        ]
        indexed = [(i, seq) for i, seq in scope.index_of.items() if scope.types.get(seq) == LIST_INT]
        if indexed:
            i, seq = rng.choice(indexed)
            options.append((4, lambda: (f"{seq}[{i}]", ATOM)))
        if depth > 0:
            i = lambda need: self._sub(scope, INT, depth, need)  # noqa: E731
            options += [
                (4, lambda: self._binary(scope, depth)),
                (2, lambda: (f"{i(MUL)} * {rng.randint(2, 4)}", MUL)),
                (2, lambda: (f"{i(MUL)} {rng.choice(['//', '%'])} {rng.randint(2, 5)}", MUL)),
                (0.5, lambda: (f"{i(ATOM)} ** 2", MUL)),
                (1, lambda: (f"abs({i(0)})", ATOM)),
                (1, lambda: self._two_args(scope, depth, rng.choice(["max", "min"]))),
                (2 if lists else 0, lambda: (f"sum({self._sub(scope, LIST_INT, depth, 0)})", ATOM)),
                (1 if lists else 0, lambda: (f"{rng.choice(['max', 'min'])}({self._sub(scope, LIST_INT, depth, 0)}, default=0)", ATOM)),
                (1 if lists else 0, lambda: (f"{self.var(scope, LIST_INT)}.count({i(0)})", ATOM)),
                (1 if scope.names(STR) else 0, lambda: (f"{self.var(scope, STR)}.count({rng.choice(STR_LITERALS[:5])})", ATOM)),
                (0.5 if scope.names(STR) else 0, lambda: (f"{self.var(scope, STR)}.find({rng.choice(STR_LITERALS[:5])})", ATOM)),
                (0.5 if scope.names(STR) else 0, lambda: (f"ord({self.var(scope, STR)}[0]) % 10 if {self.var(scope, STR)} else 0", COND)),
                (1 if scope.names(DICT) else 0, lambda: (f"{self.var(scope, DICT)}.get({self._sub(scope, STR, depth, 0)}, 0)", ATOM)),
                (1, lambda: self._if_else(scope, INT, depth)),
                (self.helper_weight if self.helpers else 0, lambda: self._helper_call(scope, INT, depth)),
            ]
        return self._pick(options)

    def _str(self, scope: Scope, depth: int) -> tuple[str, int]:
        rng = self.rng
        var = self.var(scope, STR)
        options: list[Production] = [
            (2, lambda: (rng.choice(STR_LITERALS), ATOM)),
            (6 if var else 0, lambda: (var, ATOM)),
        ]
        if depth > 0:
            s = lambda need=ATOM: self._sub(scope, STR, depth, need)  # noqa: E731
            options += [
                (2, lambda: (f"{s()}.{rng.choice(['upper', 'lower', 'strip', 'title', 'capitalize', 'swapcase'])}()", ATOM)),
                (2, lambda: (f"{s()}[::-1]", ATOM)),
                (2, lambda: (f"{s()}[{rng.choice(['', '1', '2'])}:{rng.choice(['', '2', '3', '-1'])}]", ATOM)),
                (3, lambda: (f"{s(ADD)} + {s(MUL)}", ADD)),
                (1, lambda: (f"{s()}.replace({rng.choice(STR_LITERALS[:5])}, {rng.choice(STR_LITERALS)})", ATOM)),
                (2, lambda: (f"str({self._sub(scope, INT, depth, 0)})", ATOM)),
                (1, lambda: (f"{s(MUL)} * {rng.randint(2, 3)}", MUL)),
                (2 if scope.names(LIST_STR) else 0, lambda: (f"{rng.choice(STR_LITERALS[5:])}.join({self._sub(scope, LIST_STR, depth, 0)})", ATOM)),
                (1, lambda: (f"''.join(sorted({s(0)}))", ATOM)),
                (1 if var else 0, lambda: (f"{var}[{rng.choice(['0', '-1'])}] if {var} else {rng.choice(STR_LITERALS)}", COND)),
                (1, lambda: self._if_else(scope, STR, depth)),
                (self.helper_weight if self.helpers else 0, lambda: self._helper_call(scope, STR, depth)),
            ]
        return self._pick(options)

    def _bool(self, scope: Scope, depth: int) -> tuple[str, int]:
        rng = self.rng
        var = self.var(scope, BOOL)
        options: list[Production] = [
            (1, lambda: (rng.choice(["True", "False"]), ATOM)),
            (4 if var else 0, lambda: (var, ATOM)),
        ]
        if depth > 0:
            strs = scope.names(STR)
            options += [
                (6, lambda: self._compare(scope, depth)),
                (3, lambda: (f"{self._sub(scope, INT, depth, MUL)} % {rng.choice([2, 2, 3])} == {rng.choice([0, 1])}", CMP)),
                (1.5 if scope.names(LIST_INT) else 0, lambda: (f"{self._sub(scope, INT, depth, CMP + 1)} {rng.choice(['in', 'not in'])} {self.var(scope, LIST_INT)}", CMP)),
                (2 if strs else 0, lambda: (f"{self.var(scope, STR)} in {rng.choice(['aeiou', 'abc', 'rst', 'aeiou', 'lmn'])!r}", CMP)),
                (1.5 if strs else 0, lambda: (f"{rng.choice(STR_LITERALS[:5])} in {self.var(scope, STR)}", CMP)),
                (1.5 if strs else 0, lambda: (f"{self.var(scope, STR)}.{rng.choice(['startswith', 'endswith'])}({rng.choice(STR_LITERALS[:5])})", ATOM)),
                (1 if strs else 0, lambda: (f"{self.var(scope, STR)}.{rng.choice(['isalpha', 'isupper', 'islower', 'isdigit'])}()", ATOM)),
                (1 if strs else 0, lambda: self._compare_str(scope, depth)),
                (1 if scope.names(DICT) else 0, lambda: (f"{self._sub(scope, STR, depth, CMP + 1)} in {self.var(scope, DICT)}", CMP)),
                (0 if self._combining else 1, lambda: self._combine(lambda: (f"not {self.cond(scope, depth - 1, NOT)}", NOT))),
                (0 if self._combining else 1, lambda: self._combine(
                    lambda: (f"{self.cond(scope, depth - 1, AND)} {rng.choice(['and', 'or'])} {self.cond(scope, depth - 1, AND + 1)}", OR))),
                (self.helper_weight if self.helpers else 0, lambda: self._helper_call(scope, BOOL, depth)),
            ]
        return self._pick(options)

    def _combine(self, make: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        """``not c`` / ``c and d`` whose operands are plain conditions (no ``not not not x``)."""
        self._combining = True
        try:
            return make()
        finally:
            self._combining = False

    def _compare(self, scope: Scope, depth: int) -> tuple[str, int]:
        left = self._sub(scope, INT, depth, CMP + 1)
        right = self._sub(scope, INT, depth, CMP + 1)
        if right == left or not scope.mentions(left + right) or self.rng.random() < 0.3:
            right = str(self.rng.randint(0, 8))
        return f"{left} {self.rng.choice(['<', '>', '<=', '>=', '==', '!='])} {right}", CMP

    def _binary(self, scope: Scope, depth: int) -> tuple[str, int] | None:
        left, right = self._sub(scope, INT, depth, ADD), self._sub(scope, INT, depth, MUL)
        if left == right:
            return None
        return f"{left} {self.rng.choice(['+', '-'])} {right}", ADD

    def _two_args(self, scope: Scope, depth: int, name: str) -> tuple[str, int] | None:
        first, second = self._sub(scope, INT, depth, 0), self._sub(scope, INT, depth, 0)
        return None if first == second else (f"{name}({first}, {second})", ATOM)

    def _compare_str(self, scope: Scope, depth: int) -> tuple[str, int]:
        left = self.var(scope, STR)
        right = self._sub(scope, STR, depth, CMP + 1)
        if right == left:
            right = self.rng.choice(STR_LITERALS[:5])
        return f"{left} {self.rng.choice(['<', '>', '==', '!='])} {right}", CMP

    def _if_else(self, scope: Scope, kind: str, depth: int) -> tuple[str, int] | None:
        """``a if cond else b`` with different branches."""
        first = self._sub(scope, kind, depth, COND + 1)
        second = self._sub(scope, kind, depth, COND)
        if first == second:
            return None
        return f"{first} if {self.cond(scope, depth - 1, COND + 1)} else {second}", COND

    def _list_int(self, scope: Scope, depth: int) -> tuple[str, int]:
        rng = self.rng
        var = self.var(scope, LIST_INT)
        options: list[Production] = [
            (1, lambda: (f"[{', '.join(str(rng.randint(0, 9)) for _ in range(rng.randint(1, 3)))}]", ATOM)),
            (6 if var else 0, lambda: (var, ATOM)),
        ]
        if depth > 0:
            lst = lambda need=ATOM: self._sub(scope, LIST_INT, depth, need)  # noqa: E731
            options += [
                (2, lambda: (f"sorted({lst(0)}{rng.choice(['', ', reverse=True'])})", ATOM)),
                (2, lambda: (f"{lst()}[{rng.choice(['::-1', '1:', ':2', ':3', '::2', '-2:'])}]", ATOM)),
                (1, lambda: (f"{lst(ADD)} + {lst(MUL)}", ADD)),
                (3, lambda: self._comprehension(scope, depth, INT)),
                (1, lambda: (f"list(range({rng.randint(1, 6)}))", ATOM)),
                (1, lambda: (f"sorted(set({lst(0)}))", ATOM)),
                (1 if scope.names(DICT) else 0, lambda: (f"list({self.var(scope, DICT)}.values())", ATOM)),
            ]
        return self._pick(options)

    def _list_str(self, scope: Scope, depth: int) -> tuple[str, int]:
        rng = self.rng
        var = self.var(scope, LIST_STR)
        options: list[Production] = [
            (1, lambda: (f"[{', '.join(rng.choice(STR_LITERALS[:7]) for _ in range(rng.randint(1, 2)))}]", ATOM)),
            (6 if var else 0, lambda: (var, ATOM)),
        ]
        if depth > 0:
            options += [
                (2, lambda: (f"{self._sub(scope, STR, depth, ATOM)}.split({rng.choice(['', '', repr('a'), repr('e')])})", ATOM)),
                (2, lambda: (f"list({self._sub(scope, STR, depth, 0)})", ATOM)),
                (2, lambda: (f"sorted({self._sub(scope, LIST_STR, depth, 0)})", ATOM)),
                (1, lambda: (f"{self._sub(scope, LIST_STR, depth, ATOM)}[{rng.choice(['::-1', '1:', ':2'])}]", ATOM)),
                (3, lambda: self._comprehension(scope, depth, STR)),
                (1 if scope.names(DICT) else 0, lambda: (f"sorted({self.var(scope, DICT)})", ATOM)),
            ]
        return self._pick(options)

    def _dict(self, scope: Scope, depth: int) -> tuple[str, int]:
        var = self.var(scope, DICT)
        options: list[Production] = [(1, lambda: ("{}", ATOM)), (6 if var else 0, lambda: (var, ATOM))]
        if depth > 0:
            options += [
                (2 if scope.names(LIST_STR) else 0, lambda: self._dict_comprehension(scope, depth, LIST_STR)),
                (2 if scope.names(STR) else 0, lambda: self._dict_comprehension(scope, depth, STR)),
                (1 if scope.names(LIST_STR) and scope.names(LIST_INT) else 0,
                 lambda: (f"dict(zip({self.var(scope, LIST_STR)}, {self.var(scope, LIST_INT)}))", ATOM)),
            ]
        return self._pick(options)

    def loop_var(self, scope: Scope, kind: str) -> str | None:
        """The first free loop-variable name for items of ``kind`` ('char' for a string's
        characters, 'range' for indices); fixed names make loops easy to learn."""
        pools = {INT: ["x", "y", "v"], STR: ["w", "u", "item"], "char": ["ch", "c"], "range": ["i", "j", "idx"]}
        return next((n for n in pools[kind] if n not in scope.types), None)

    def _comprehension(self, scope: Scope, depth: int, elem: str) -> tuple[str, int] | None:
        """``[expr(x) for x in seq if cond(x)]`` over a list of ints, a list of strings or a string."""
        rng = self.rng
        sources = [(INT, n) for n in scope.names(LIST_INT)] + [(STR, n) for n in scope.names(LIST_STR) + scope.names(STR)]
        if not sources:
            return None
        src_type, seq = rng.choice(sources)
        var = self.loop_var(scope, "char" if scope.types[seq] == STR else src_type)
        if var is None:
            return None
        inner = scope.child()
        inner.bind_loop(var, src_type)
        body = self.expr_using(inner, elem, max(depth - 1, 1), var) if rng.random() < 0.7 or src_type != elem else var
        cond = f" if {self.cond(inner, depth - 1, using=var)}" if rng.random() < 0.5 else ""
        self.features.add("comprehension")
        return f"[{body} for {var} in {seq}{cond}]", ATOM

    def _dict_comprehension(self, scope: Scope, depth: int, src: str) -> tuple[str, int] | None:
        seq = self.var(scope, src)
        var = self.loop_var(scope, "char" if src == STR else STR)
        if seq is None or var is None:
            return None
        inner = scope.child()
        inner.bind_loop(var, STR)
        self.features.add("comprehension")
        return f"{{{var}: {self.expr_using(inner, INT, max(depth - 1, 1), var)} for {var} in {seq}}}", ATOM
