"""Random, valid, deterministic Python programs defining ``f``, with random inputs for them.

A program is a chain of *phases*, each an idiom a person would write (map, filter, sum, count,
find the largest, tally into a dict, scan a dict, split a number into digits, loop over a range,
compare neighbours, running totals, branch, nested loops, a stack, search with ``break``, zip, a
``while`` that reduces a number, an early return for the empty case), applied to the arguments or
to an earlier phase's result, so data flows from the arguments to the returned value. The
expressions inside the phases come from the typed grammar in :mod:`tinycoder.expressions`, so
almost every program runs; the few that raise, run too long or give a huge output are dropped by
the verifier, which also computes the outputs (nothing here executes generated code).

Names carry their type (``nums`` is a list of ints, ``s`` a string, ``n`` an int, ``words`` a
list of strings, ``d`` a dict, ``total`` an int, ...): a tiny model writes type-consistent code
far more easily when the name says the type.

Difficulty knobs (:class:`ProgramShape`): the number of phases, how deep blocks nest, how deep
expressions nest, and whether a helper function (sometimes recursive) is defined inside ``f``.
:class:`ShapeRange` draws a shape per program so a corpus spans one-liners to nested loops.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tinycoder.expressions import BOOL, DICT, INT, LIST_INT, LIST_STR, STR, STR_LITERALS, VALUE_TYPES, Expressions, Scope

ARG_TYPES = (INT, STR, LIST_INT, LIST_STR, DICT)
ARG_NAMES = {
    INT: ["n", "k", "m"],
    STR: ["s", "t", "text"],
    LIST_INT: ["nums", "xs", "vals"],
    LIST_STR: ["words", "names", "items"],
    DICT: ["d", "scores", "table"],
}
LOCAL_NAMES = {
    INT: ["total", "count", "best", "acc", "steps", "score", "found", "hits"],
    STR: ["out", "buf", "tag", "rev", "joined"],
    BOOL: ["flag", "ok"],
    LIST_INT: ["result", "picked", "stack", "sizes", "evens", "digits", "prefix", "diffs"],
    LIST_STR: ["parts", "tokens", "chosen", "letters", "keys"],
    DICT: ["counts", "freq", "index", "lookup"],
}
ELEMENT = {LIST_INT: INT, LIST_STR: STR, STR: STR}
DESCRIBE = {
    INT: "an int", STR: "a string", BOOL: "a bool", LIST_INT: "a list of ints",
    LIST_STR: "a list of strings", DICT: "a dict of counts",
}
LETTERS = "abcdeilmnorstu"


@dataclass(frozen=True)
class ProgramShape:
    """How big a program may be: phases, block nesting (1-3), expression nesting (1-3), a helper."""

    phases: int = 2
    depth: int = 2
    expr_depth: int = 2
    helper: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.phases <= 8:
            raise ValueError(f"ProgramShape.phases must be in [0, 8], got {self.phases}")
        if not 1 <= self.depth <= 3:
            raise ValueError(f"ProgramShape.depth must be in [1, 3], got {self.depth}")
        if not 1 <= self.expr_depth <= 3:
            raise ValueError(f"ProgramShape.expr_depth must be in [1, 3], got {self.expr_depth}")


@dataclass(frozen=True)
class Program:
    """A generated program: source (defines ``f``), argument types, the idioms it chains, a hint."""

    source: str
    arg_types: tuple[str, ...]
    phases: tuple[str, ...]
    message: str
    results: tuple[str, ...] = ()  # the names the phases bind, in order

    def traced(self) -> str | None:
        """The program returning the tuple of its phase results instead of its value (None without
        phases): run on an input, it gives the intermediate values a step-by-step solver writes down."""
        if not self.results:
            return None
        head, _, _ = self.source.rstrip("\n").rpartition("\n    return ")
        return f"{head}\n    return ({', '.join(self.results)},)\n"


class ProgramBuilder:
    """Assembles one program of a :class:`ProgramShape` from a seeded ``random.Random``."""

    PHASE_WEIGHTS = {
        "map": 3, "filter": 3, "sum": 3, "count": 3, "extreme": 2, "tally": 2, "dict_scan": 2,
        "digits": 1, "range_loop": 2, "pairs": 1.5, "running": 1, "branch": 2, "nested": 1.5,
        "transform": 3, "stack": 1, "search": 1.5, "guard": 1, "zip": 1, "reduce": 1,
    }

    def __init__(self, rng: random.Random, shape: ProgramShape):
        self.rng = rng
        self.shape = shape
        self.x = Expressions(rng)
        self.scope = Scope()
        self.lines: list[str] = []
        self.results: list[str] = []
        self.phrases: list[str] = []
        self.done: list[str] = []

    # ---------------------------------------------------------------- program
    def build(self) -> Program:
        rng = self.rng
        arg_types = tuple(rng.choice(ARG_TYPES) for _ in range(rng.choices([1, 2, 3], weights=[5, 4, 1])[0]))
        args = []
        for kind in arg_types:
            name = next(n for n in ARG_NAMES[kind] if n not in self.scope.types)
            self.scope.types[name] = kind
            args.append(name)
        self.lines.append(f"def f({', '.join(args)}):")
        if self.shape.helper:
            self._helper()
        for index in range(self.shape.phases):
            self._phase(first=index == 0)
        returned = self._return()
        self.lines.append(f"    return {returned}")
        message = self._message(arg_types, returned)
        return Program("\n".join(self.lines) + "\n", arg_types, tuple(self.done), message, tuple(self.results))

    def _phase(self, first: bool) -> None:
        weights = dict(self.PHASE_WEIGHTS)
        if not first:
            weights["guard"] = 0
        if self.shape.depth < 2:
            weights["nested"] = 0
        names = list(weights)
        for _ in range(10):
            name = self.rng.choices(names, weights=[weights[n] for n in names])[0]
            if getattr(self, f"_ph_{name}")():
                self.done.append(name)
                if "call" in self.x.features:
                    self.x.helper_weight = 2.0
                return

    def _message(self, arg_types: tuple[str, ...], returned: str) -> str:
        """The hint (and the teacher's plan): the arguments, each phase's result with its key
        expressions in words, and what is returned."""
        takes = ", ".join(DESCRIBE[t] for t in arg_types)
        steps = "".join(f"{phrase}; " for phrase in self.phrases)
        return f"Given {takes}: {steps}return {returned}."

    # ---------------------------------------------------------------- naming and sources
    def _local(self, kind: str, prefer: tuple[str, ...] = ()) -> str | None:
        """The first free name: the phase's own names first, then the type's pool, in a fixed order."""
        return next((n for n in prefer + tuple(LOCAL_NAMES[kind]) if n not in self.scope.types), None)

    def _bind(self, name: str, kind: str) -> None:
        self.scope.types[name] = kind
        self.scope.assignable.add(name)
        self.results.append(name)

    def _source(self, kinds: tuple[str, ...], exclude: tuple[str, ...] = ()) -> str | None:
        """A value to work on: the latest result most often, else an argument or an older result."""
        names = [n for n, t in self.scope.types.items() if t in kinds and n not in exclude and n not in self.scope.loop_vars]
        if not names:
            return None
        latest = self.results[-1] if self.results else None
        return self.rng.choices(names, weights=[5.0 if n == latest else 2.0 for n in names])[0]

    def _inner(self, var: str, kind: str) -> Scope:
        inner = self.scope.child()
        inner.bind_loop(var, kind)
        return inner

    @property
    def _e(self) -> int:
        return self.shape.expr_depth

    def _emit(self, *lines: str) -> None:
        self.lines.extend("    " + line for line in lines)

    # ---------------------------------------------------------------- helper
    def _helper(self) -> None:
        rng = self.rng
        name = "g"
        if rng.random() < 0.3:
            base, limit = rng.choice([("0", 0), ("v", 1), ("1", 1), ("v", 0)])
            rec = rng.choice([f"v + {name}(v - 1)", f"{name}(v // 2) + 1", f"{name}(v - 2) + v % 3", f"{name}(v // 2) * 2 + v % 2"])
            self._emit(f"def {name}(v):", f"    if v <= {limit}:", f"        return {base}", f"    return {rec}")
            self.x.helpers[name] = (INT, INT)
            self.x.features.add("recursion")
        else:
            param_type, ret = rng.choice([(INT, INT), (INT, BOOL), (STR, STR), (STR, INT), (STR, BOOL)])
            param = {INT: "v", STR: "t"}[param_type]
            inner = self.scope.child()
            inner.bind_loop(param, param_type)
            body = self.x.expr_using(inner, ret, 2, param)
            self._emit(f"def {name}({param}):", f"    return {body}")
            self.x.helpers[name] = (param_type, ret)
        self.x.helper_weight = 12.0
        self.phrases.append(f"define {name}({'v' if self.x.helpers[name][0] == INT else 't'})")

    # ---------------------------------------------------------------- phases
    def _loop_over(self, kinds: tuple[str, ...] = (LIST_INT, LIST_STR, STR)) -> tuple[str, str, str, Scope] | None:
        seq = self._source(kinds)
        if seq is None:
            return None
        elem = ELEMENT[self.scope.types[seq]]
        var = self.x.loop_var(self.scope, "char" if self.scope.types[seq] == STR else elem)
        if var is None:
            return None
        return seq, elem, var, self._inner(var, elem)

    def _maybe_cond(self, inner: Scope, var: str, rate: float) -> str | None:
        if self.shape.depth >= 2 and self.rng.random() < rate:
            return self.x.cond(inner, self._e, using=var)
        return None

    def _ph_map(self) -> bool:
        rng = self.rng
        got = self._loop_over()
        if got is None:
            return False
        seq, elem, var, inner = got
        out_elem = elem if rng.random() < 0.6 else (INT if elem == STR else STR)
        body = self.x.expr_using(inner, out_elem, self._e, var)
        cond = self._maybe_cond(inner, var, 0.3)
        if out_elem == STR and self.scope.types[seq] == STR and rng.random() < 0.6:
            name = self._local(STR, ("out", "buf"))
            if name is None:
                return False
            if rng.random() < 0.4:
                self._emit(f"{name} = ''.join([{body} for {var} in {seq}{f' if {cond}' if cond else ''}])")
            else:
                lines = [f"{name} = ''", f"for {var} in {seq}:"]
                lines += [f"    if {cond}:", f"        {name} += {body}"] if cond else [f"    {name} += {body}"]
                self._emit(*lines)
            self._bind(name, STR)
            self.phrases.append(f"{name}: join {body} for each {var} in {seq}" + (f" if {cond}" if cond else ""))
            return True
        kind = LIST_INT if out_elem == INT else LIST_STR
        name = self._local(kind, ("result",) if kind == LIST_INT else ("parts",))
        if name is None:
            return False
        if rng.random() < 0.5:
            self._emit(f"{name} = [{body} for {var} in {seq}{f' if {cond}' if cond else ''}]")
        else:
            lines = [f"{name} = []", f"for {var} in {seq}:"]
            lines += [f"    if {cond}:", f"        {name}.append({body})"] if cond else [f"    {name}.append({body})"]
            self._emit(*lines)
        self._bind(name, kind)
        self.phrases.append(f"{name}: {body} for each {var} in {seq}" + (f" if {cond}" if cond else ""))
        return True

    def _ph_filter(self) -> bool:
        rng = self.rng
        got = self._loop_over()
        if got is None:
            return False
        seq, elem, var, inner = got
        cond = self.x.cond(inner, self._e, using=var)
        kind = self.scope.types[seq]
        name = self._local(kind, {LIST_INT: ("picked", "evens"), LIST_STR: ("chosen",), STR: ("out",)}[kind])
        if name is None:
            return False
        if kind == STR:
            self._emit(f"{name} = ''", f"for {var} in {seq}:", f"    if {cond}:", f"        {name} += {var}")
        elif rng.random() < 0.6:
            self._emit(f"{name} = [{var} for {var} in {seq} if {cond}]")
        else:
            self._emit(f"{name} = []", f"for {var} in {seq}:", f"    if {cond}:", f"        {name}.append({var})")
        self._bind(name, kind)
        self.phrases.append(f"{name}: keep each {var} in {seq} if {cond}")
        return True

    def _ph_sum(self) -> bool:
        rng = self.rng
        got = self._loop_over()
        if got is None:
            return False
        seq, elem, var, inner = got
        name = self._local(INT, ("total", "acc"))
        if name is None:
            return False
        body = var if elem == INT and rng.random() < 0.4 else self.x.expr_using(inner, INT, self._e, var)
        cond = self._maybe_cond(inner, var, 0.45)
        style = rng.random()
        verb = "add up"
        if style < 0.3:
            self._emit(f"{name} = sum({body} for {var} in {seq}{f' if {cond}' if cond else ''})")
        elif style < 0.45 and self.shape.depth >= 2:
            i = self.x.loop_var(self.scope, "range")
            if i is None:
                return False
            inner.bind_loop(i, INT)
            test = self.x.cond(inner, 1, using=i)
            self._emit(f"{name} = 0", f"for {i}, {var} in enumerate({seq}):", f"    if {test}:", f"        {name} += {body}")
            self.x.features.add("enumerate")
            cond = test
        else:
            op = rng.choice(["+=", "+=", "+=", "-="])
            start = rng.choice(["0", "0", "1"])
            verb = ("subtract" if op == "-=" else "add up") + (" from 1" if start == "1" else "")
            lines = [f"{name} = {start}", f"for {var} in {seq}:"]
            lines += [f"    if {cond}:", f"        {name} {op} {body}"] if cond else [f"    {name} {op} {body}"]
            self._emit(*lines)
        self._bind(name, INT)
        self.phrases.append(f"{name}: {verb} {body} for each {var} in {seq}" + (f" if {cond}" if cond else ""))
        return True

    def _ph_count(self) -> bool:
        rng = self.rng
        got = self._loop_over()
        if got is None:
            return False
        seq, elem, var, inner = got
        name = self._local(INT, ("count", "hits"))
        if name is None:
            return False
        cond = self.x.cond(inner, self._e, using=var)
        style = rng.random()
        if style < 0.25:
            self._emit(f"{name} = len([{var} for {var} in {seq} if {cond}])")
        elif style < 0.4:
            self._emit(f"{name} = sum(1 for {var} in {seq} if {cond})")
        else:
            self._emit(f"{name} = 0", f"for {var} in {seq}:", f"    if {cond}:", f"        {name} += 1")
        self._bind(name, INT)
        self.phrases.append(f"{name}: count each {var} in {seq} if {cond}")
        return True

    def _ph_extreme(self) -> bool:
        rng = self.rng
        got = self._loop_over((LIST_INT, LIST_STR))
        if got is None:
            return False
        seq, elem, var, inner = got
        op = rng.choice([">", "<"])
        if elem == INT:
            name = self._local(INT, ("best",))
            if name is None:
                return False
            key = var if rng.random() < 0.6 else self.x.expr_using(inner, INT, 1, var)
            start = rng.choice([f"{seq}[0] if {seq} else 0", "0"])
            self._emit(f"{name} = {start}", f"for {var} in {seq}:", f"    if {key} {op} {name}:", f"        {name} = {key}")
            self._bind(name, INT)
        else:
            name = self._local(STR, ("tag", "buf"))
            if name is None:
                return False
            test = rng.choice([f"len({var}) {op} len({name})", f"{var} {op} {name}"])
            start = f"{seq}[0] if {seq} else ''" if op == "<" else "''"
            self._emit(f"{name} = {start}", f"for {var} in {seq}:", f"    if {test}:", f"        {name} = {var}")
            self._bind(name, STR)
        self.phrases.append(f"{name}: the {'largest' if op == '>' else 'smallest'} item of {seq}")
        return True

    def _ph_tally(self) -> bool:
        rng = self.rng
        got = self._loop_over()
        if got is None:
            return False
        seq, elem, var, inner = got
        name = self._local(DICT, ("counts", "freq"))
        if name is None:
            return False
        if elem == INT:
            key = rng.choice([f"str({var})", f"str({var} % {rng.randint(2, 4)})", f"'even' if {var} % 2 == 0 else 'odd'"])
        else:
            key = rng.choice([var, var, f"{var}[0]" if self.scope.types[seq] == STR else f"{var}[:1]", f"{var}.lower()"])
        key_text = f"({key})" if " if " in key else key
        value = "1" if rng.random() < 0.6 else self.x.expr_using(inner, INT, 1, var)
        lines = [f"{name} = {{}}", f"for {var} in {seq}:"]
        if rng.random() < 0.5:
            lines.append(f"    {name}[{key_text}] = {name}.get({key_text}, 0) + {value}")
        else:
            lines += [f"    if {key_text} in {name}:", f"        {name}[{key_text}] += {value}", "    else:", f"        {name}[{key_text}] = {value}"]
        self._emit(*lines)
        self._bind(name, DICT)
        self.phrases.append(f"{name}: count {key} for each {var} in {seq}")
        return True

    def _ph_dict_scan(self) -> bool:
        rng = self.rng
        seq = self._source((DICT,))
        free = [(k, v) for k, v in (("key", "val"), ("name", "score")) if k not in self.scope.types and v not in self.scope.types]
        if seq is None or not free:
            return False
        key, val = free[0]
        inner = self._inner(key, STR)
        inner.bind_loop(val, INT)
        cond = self.x.cond(inner, self._e, using=rng.choice([key, val]))
        what = rng.choice([INT, LIST_STR, STR])
        name = self._local(what, {INT: ("total",), LIST_STR: ("keys",), STR: ("out",)}[what])
        if name is None:
            return False
        start, update = {
            INT: ("0", f"{name} += {self.x.expr_using(inner, INT, 1, val)}"),
            LIST_STR: ("[]", f"{name}.append({key})"),
            STR: ("''", f"{name} += {self.x.expr_using(inner, STR, 1, key)}"),
        }[what]
        self._emit(f"{name} = {start}", f"for {key}, {val} in {seq}.items():", f"    if {cond}:", f"        {update}")
        self._bind(name, what)
        self.phrases.append(f"{name}: scan {seq} for {key}, {val} if {cond}")
        return True

    def _ph_digits(self) -> bool:
        rng = self.rng
        src = self._source((INT,))
        name = self._local(LIST_INT, ("digits",))
        if src is None or name is None or "cur" in self.scope.types:
            return False
        base = rng.choice([2, 10, 10, 3])
        self._emit(f"cur = abs({src})", f"{name} = []", "while cur > 0:", f"    {name}.append(cur % {base})", f"    cur //= {base}")
        self.scope.types["cur"] = INT
        self._bind(name, LIST_INT)
        self.x.features.add("while")
        self.phrases.append(f"{name}: the base-{base} digits of {src}")
        return True

    def _ph_range_loop(self) -> bool:
        rng = self.rng
        src = self._source((INT,))
        var = self.x.loop_var(self.scope, "range")
        if src is None or var is None:
            return False
        bound = src if src in ARG_NAMES[INT] else f"min({src}, 10)"
        start = rng.choice(["", "", "1, "])
        inner = self._inner(var, INT)
        body = self.x.expr_using(inner, INT, self._e, var)
        if rng.random() < 0.5:
            name = self._local(LIST_INT, ("result", "sizes"))
            if name is None:
                return False
            self._emit(f"{name} = []", f"for {var} in range({start}{bound}):", f"    {name}.append({body})")
            self._bind(name, LIST_INT)
            self.phrases.append(f"{name}: {body} for each {var} in range({start}{bound})")
        else:
            name = self._local(INT, ("total", "acc"))
            if name is None:
                return False
            self._emit(f"{name} = {rng.choice(['0', '1'])}", f"for {var} in range({start}{bound}):", f"    {name} += {body}")
            self._bind(name, INT)
            self.phrases.append(f"{name}: add up {body} for each {var} in range({start}{bound})")
        return True

    def _ph_pairs(self) -> bool:
        rng = self.rng
        seq = self._source((LIST_INT,))
        i = self.x.loop_var(self.scope, "range")
        if seq is None or i is None:
            return False
        op = rng.choice(["<", ">", "==", "!="])
        if rng.random() < 0.5:
            name = self._local(INT, ("count", "hits"))
            if name is None:
                return False
            self._emit(f"{name} = 0", f"for {i} in range(1, len({seq})):", f"    if {seq}[{i}] {op} {seq}[{i} - 1]:", f"        {name} += 1")
            self._bind(name, INT)
            self.phrases.append(f"{name}: count neighbours in {seq} with item {op} previous")
        else:
            name = self._local(LIST_INT, ("diffs",))
            if name is None:
                return False
            op = rng.choice(["-", "+", "*"])
            self._emit(f"{name} = []", f"for {i} in range(1, len({seq})):", f"    {name}.append({seq}[{i}] {op} {seq}[{i} - 1])")
            self._bind(name, LIST_INT)
            self.phrases.append(f"{name}: item {op} previous for neighbours in {seq}")
        return True

    def _ph_running(self) -> bool:
        rng = self.rng
        got = self._loop_over((LIST_INT,))
        if got is None:
            return False
        seq, elem, var, inner = got
        acc = self._local(INT, ("acc",))
        name = self._local(LIST_INT, ("prefix",))
        if acc is None or name is None:
            return False
        body = var if rng.random() < 0.6 else self.x.expr_using(inner, INT, 1, var)
        self._emit(f"{acc} = 0", f"{name} = []", f"for {var} in {seq}:", f"    {acc} += {body}", f"    {name}.append({acc})")
        self._bind(acc, INT)
        self._bind(name, LIST_INT)
        self.phrases.append(f"{name}: running totals of {body} over {seq}")
        return True

    def _ph_branch(self) -> bool:
        rng = self.rng
        kind = rng.choice([INT, INT, STR, LIST_INT, LIST_STR])
        name = self._local(kind)
        if name is None or not self.scope.types:
            return False
        cond = self.x.cond(self.scope, self._e)
        first = self.x.expr(self.scope, kind, self._e)
        second = self.x.expr(self.scope, kind, self._e)
        if first == second:
            return False
        self._emit(f"if {cond}:", f"    {name} = {first}", "else:", f"    {name} = {second}")
        self._bind(name, kind)
        self.x.features.add("if")
        self.phrases.append(f"{name}: {first} or {second} by {cond}")
        return True

    def _ph_nested(self) -> bool:
        rng = self.rng
        got = self._loop_over((LIST_INT, LIST_STR, STR))
        if got is None:
            return False
        seq, elem, var, inner = got
        seq2 = self._source((LIST_INT, LIST_STR, STR))
        if seq2 is None:
            return False
        elem2 = ELEMENT[self.scope.types[seq2]]
        var2 = self.x.loop_var(inner, "char" if self.scope.types[seq2] == STR else elem2)
        if var2 is None:
            return False
        inner.bind_loop(var2, elem2)
        if elem == elem2 == INT:
            cond = rng.choice([f"{var} + {var2} == {rng.randint(0, 12)}", f"{var} < {var2}", f"{var} == {var2}", f"({var} * {var2}) % {rng.randint(2, 4)} == 0"])
        elif elem == elem2:
            cond = rng.choice([f"{var} == {var2}", f"{var} < {var2}", f"{var2} in {var}"])
        else:
            cond = self.x.cond(inner, 1, using=var2)
        name = self._local(INT, ("count", "hits"))
        if name is None:
            return False
        self._emit(f"{name} = 0", f"for {var} in {seq}:", f"    for {var2} in {seq2}:", f"        if {cond}:", f"            {name} += 1")
        self._bind(name, INT)
        self.phrases.append(f"{name}: count pairs of {seq} and {seq2} with {cond}")
        return True

    def _ph_transform(self) -> bool:
        kind = self.rng.choice([INT, STR, LIST_INT, LIST_INT, LIST_STR, DICT, BOOL])
        name = self._local(kind)
        if name is None:
            return False
        text = self.x.expr(self.scope, kind, self._e)
        if text in self.scope.types or not self.scope.mentions(text):
            return False
        self._emit(f"{name} = {text}")
        self._bind(name, kind)
        self.phrases.append(f"{name}: {DESCRIBE[kind]}")
        return True

    def _ph_stack(self) -> bool:
        got = self._loop_over((STR, LIST_INT, LIST_STR))
        if got is None:
            return False
        seq, elem, var, inner = got
        kind = LIST_INT if elem == INT else LIST_STR
        name = self._local(kind, ("stack",) if kind == LIST_INT else ("letters",))
        if name is None:
            return False
        cond = self.x.cond(inner, self._e, using=var)
        self._emit(f"{name} = []", f"for {var} in {seq}:", f"    if {cond}:", f"        {name}.append({var})", f"    elif {name}:", f"        {name}.pop()")
        self._bind(name, kind)
        self.phrases.append(f"{name}: push each {var} in {seq} if {cond}, else pop")
        return True

    def _ph_search(self) -> bool:
        got = self._loop_over((LIST_INT, LIST_STR, STR))
        if got is None:
            return False
        seq, elem, var, inner = got
        i = self.x.loop_var(inner, "range")
        name = self._local(INT, ("found",))
        if i is None or name is None:
            return False
        cond = self.x.cond(inner, self._e, using=var)
        self._emit(f"{name} = -1", f"for {i}, {var} in enumerate({seq}):", f"    if {cond}:", f"        {name} = {i}", "        break")
        self._bind(name, INT)
        self.phrases.append(f"{name}: the first index in {seq} with {cond}")
        return True

    def _ph_guard(self) -> bool:
        rng = self.rng
        seq = self._source((LIST_INT, LIST_STR, STR, DICT, INT))
        if seq is None:
            return False
        value = rng.choice(["0", "-1", "[]", "''", "None", "False"])
        test = f"{seq} <= 0" if self.scope.types[seq] == INT else f"not {seq}"
        self._emit(f"if {test}:", f"    return {value}")
        self.phrases.append(f"{value} when {seq} is empty")
        return True

    def _ph_zip(self) -> bool:
        rng = self.rng
        first = self._source((LIST_INT, LIST_STR))
        second = self._source((LIST_INT, LIST_STR), exclude=(first,) if first else ())
        if first is None or second is None:
            return False
        t1, t2 = ELEMENT[self.scope.types[first]], ELEMENT[self.scope.types[second]]
        a = self.x.loop_var(self.scope, t1)
        inner = self._inner(a, t1) if a else None
        b = self.x.loop_var(inner, t2) if inner else None
        if a is None or b is None:
            return False
        inner.bind_loop(b, t2)
        out = rng.choice([INT, STR]) if t1 != t2 else t1
        body = self.x.expr_using(inner, out, 1, rng.choice([a, b]))
        if not inner.mentions(body, {a}) or not inner.mentions(body, {b}):
            body = {(INT, INT): f"{a} + {b}", (STR, STR): f"{a} + {b}"}.get((t1, t2), f"{b if t2 == STR else a} * {a if t1 == INT else b}")
            out = INT if t1 == t2 == INT else STR
        kind = LIST_INT if out == INT else LIST_STR
        name = self._local(kind, ("result",) if kind == LIST_INT else ("parts",))
        if name is None:
            return False
        self._emit(f"{name} = [{body} for {a}, {b} in zip({first}, {second})]")
        self._bind(name, kind)
        self.phrases.append(f"{name}: {body} over {first} and {second} together")
        return True

    def _ph_reduce(self) -> bool:
        rng = self.rng
        src = self._source((INT, LIST_INT, LIST_STR, STR))
        name = self._local(INT, ("steps",))
        if src is None or name is None or "cur" in self.scope.types:
            return False
        start = f"abs({src})" if self.scope.types[src] == INT else f"len({src})"
        step = rng.choice(["cur // 2 if cur % 2 == 0 else cur - 1", "cur - 3", "cur // 3", "cur - 2 if cur % 3 else cur // 3"])
        self._emit(f"cur = {start}", f"{name} = 0", f"while cur > {rng.choice([0, 1])}:", f"    cur = {step}", f"    {name} += 1")
        self.scope.types["cur"] = INT
        self._bind(name, INT)
        self.x.features.add("while")
        self.phrases.append(f"{name}: steps to bring {start} down")
        return True

    # ---------------------------------------------------------------- return
    def _return(self) -> str:
        rng = self.rng
        if self.results:
            latest = self.results[-1]
            roll = rng.random()
            if roll < 0.6:
                return latest
            if roll < 0.85:
                kind = rng.choice([INT, INT, STR, LIST_INT, BOOL])
                for _ in range(6):
                    text = self.x.expr(self.scope, kind, 1 + (self._e > 1))
                    if self.scope.mentions(text, set(self.results)):
                        return text
                return latest
            other = self.x.expr(self.scope, rng.choice([INT, STR, LIST_INT]), 1)
            return f"({latest}, {other})" if other != latest else latest
        for _ in range(10):
            text = self.x.expr(self.scope, rng.choice([INT, INT, STR, LIST_INT, LIST_STR, BOOL, DICT]), self._e)
            if self.scope.mentions(text):
                break
        return text


# ---------------------------------------------------------------------- inputs
def random_value(rng: random.Random, kind: str) -> object:
    """A random argument value of ``kind`` (small, so outputs stay short and loops stay quick)."""
    if kind == INT:
        return rng.randint(-3, 12)
    if kind == STR:
        return " ".join(_word(rng) for _ in range(rng.choices([1, 2, 3], weights=[6, 3, 1])[0]))
    if kind == LIST_INT:
        return [rng.randint(-4, 15) for _ in range(rng.choices(range(7), weights=[1, 2, 3, 4, 4, 3, 2])[0])]
    if kind == LIST_STR:
        return [_word(rng) for _ in range(rng.choices(range(5), weights=[1, 2, 4, 3, 2])[0])]
    if kind == DICT:
        return {_word(rng): rng.randint(0, 9) for _ in range(rng.choices(range(4), weights=[1, 3, 4, 2])[0])}
    if kind == BOOL:
        return rng.random() < 0.5
    raise ValueError(f"unknown value type {kind!r}; expected one of {VALUE_TYPES}")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 6)))


def random_args(rng: random.Random, arg_types: tuple[str, ...]) -> str:
    """An AZR argument list (``'abc', [1, 2]``): the reprs of random values, comma-separated."""
    return ", ".join(repr(random_value(rng, t)) for t in arg_types)


SIMPLE_VALUES = {
    INT: [0, 1, 2, 3],
    STR: ["", "a", "ab"],
    LIST_INT: [[], [1], [1, 2]],
    LIST_STR: [[], ["a"]],
    DICT: [{}, {"a": 1}],
    BOOL: [False, True],
}


def simple_args(rng: random.Random, arg_types: tuple[str, ...]) -> str:
    """An argument list of the simplest values (``[]``, ``0``, ``''``, ``[1]``, ...): the inputs a solver
    tries first when it must find *some* input that gives an output."""
    return ", ".join(repr(rng.choice(SIMPLE_VALUES[t])) for t in arg_types)


# ---------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class ShapeRange:
    """The range program shapes are drawn from, easy to hard: ``phase_weights[p]`` is the relative
    chance of ``p`` phases (0 = a one-line ``return``), block depth is uniform in ``[1, max_depth]``
    and expression depth in ``[1, max_expr_depth]``."""

    phase_weights: tuple[float, ...] = (1.5, 3.0, 2.0)
    max_depth: int = 3
    max_expr_depth: int = 1
    helper_rate: float = 0.1

    def __post_init__(self) -> None:
        if not self.phase_weights or any(w < 0 for w in self.phase_weights) or sum(self.phase_weights) <= 0:
            raise ValueError(f"ShapeRange.phase_weights must be non-negative with a positive sum, got {self.phase_weights}")

    def draw(self, rng: random.Random) -> ProgramShape:
        return ProgramShape(
            phases=rng.choices(range(len(self.phase_weights)), weights=self.phase_weights)[0],
            depth=rng.randint(1, self.max_depth),
            expr_depth=rng.randint(1, self.max_expr_depth),
            helper=rng.random() < self.helper_rate,
        )


def generate_program(rng: random.Random, shape: ProgramShape) -> Program:
    """One random program of ``shape`` drawn from ``rng``."""
    return ProgramBuilder(rng, shape).build()


__all__ = [
    "ARG_TYPES", "INT", "STR", "BOOL", "LIST_INT", "LIST_STR", "DICT", "STR_LITERALS",
    "Program", "ProgramShape", "ShapeRange", "generate_program", "random_args", "random_value",
]
