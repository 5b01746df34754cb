"""The Python-level layer of the sandbox: what a program may import, name and do at run time.

It runs inside the confined child process (see ``verifier.forkserver``) and is one layer of
several; the operating-system layer (rlimits, chroot, dropped privileges, no network, a killed
process group) holds even when a program gets around this one. Three parts:

- a static check of the program's AST: imports only from ``ALLOWED_MODULES``, no names of escape
  hatches (``eval``, ``open``, ``__builtins__``...), no dunder or frame attributes outside
  ``SAFE_DUNDERS`` (``().__class__.__base__.__subclasses__()`` is rejected here);
- restricted builtins: dangerous ones removed, ``__import__`` limited to the allow-list,
  ``getattr``/``setattr``/``delattr`` refusing private names, ``print`` a no-op;
- a ``sys.addaudithook`` hook that allows only the audit events that ordinary programs raise and
  ends the run as FORBIDDEN on every other event (files, sockets, processes, signals, rlimits,
  ctypes, new imports, code-object construction, gc introspection);
- stubs in place of the few functions that act outside the process without an audit event
  (``UNAUDITED``: ``pidfd_send_signal``, ``_posixsubprocess.fork_exec``...).

This layer is a convenience, not a boundary: it turns ordinary violations into clear FORBIDDEN
verdicts before any system call. Its policy lives in closures as frozensets (rebinding this
module's names changes nothing), a violation ends the process at once (``fatal``) instead of being
recorded where the program could clear it, and the fork server removes its own modules and
privileged helpers from the child's interpreter before the program runs. But allowed modules lead
to ``sys``, ``os`` and the real ``builtins`` (``dataclasses.sys``), and through the real ``getattr``
to the closure cells of ``deny``, which the stubs and the hook share: a program can overwrite them
and disarm the layer. No guarantee rests on it; the operating-system layers hold each one
(``Verifier.defences()['guarantees']``, docs/verifier.md).

Standard library only: this module is imported by the fork server, which runs without site-packages.
"""

from __future__ import annotations

import ast
import builtins
import operator
import os
import sys
from typing import Any, Callable, NoReturn

from verifier.frames import encode as encode_frame

# The module allow-list: pure, deterministic modules with no file, network, process, thread or
# clock access. All of them are imported by the fork server before it forks, so a program's
# ``import`` only looks them up in ``sys.modules``.
ALLOWED_MODULES: frozenset[str] = frozenset(
    {
        "__future__", "abc", "array", "bisect", "cmath", "collections", "collections.abc", "contextlib",
        "copy", "dataclasses", "decimal", "difflib", "enum", "fractions", "functools", "graphlib", "heapq",
        "itertools", "json", "keyword", "math", "numbers", "operator", "re", "statistics", "string",
        "struct", "textwrap", "typing", "unicodedata",
    }
)

# Modules that benchmark code legitimately imports, allowed only by a verifier made with
# ``extra_modules`` (the benchmark profile of ``evaluation``): no file, network or process access of
# their own (what they could reach through ``os`` is blocked by the audit hook like everywhere), but
# not deterministic (``random``, ``time``), so self-play programs never get them.
BENCHMARK_MODULES: frozenset[str] = frozenset({"hashlib", "random", "time", "datetime", "calendar", "io"})

# Builtins a program never gets (removed from its builtins and rejected by name in the AST).
FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {
        "eval", "exec", "compile", "open", "globals", "locals", "vars", "breakpoint", "help", "exit",
        "quit", "memoryview", "__import__", "__builtins__", "__loader__", "__spec__", "__build_class__",
        "__file__", "__cached__",
    }
)
# Builtins that are removed but may be ordinary variable names in a program (``def f(input): ...``):
# they are not rejected by the static check, a use as builtin is a NameError.
REMOVED_BUILTINS: frozenset[str] = frozenset({"input", "id", "copyright", "credits", "license"})

# Dunder attributes ordinary programs use; every other ``__x__`` attribute is rejected.
SAFE_DUNDERS: frozenset[str] = frozenset(
    {
        "__init__", "__name__", "__qualname__", "__doc__", "__class__", "__len__", "__iter__", "__next__",
        "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__repr__", "__str__",
        "__contains__", "__getitem__", "__setitem__", "__delitem__", "__call__", "__add__", "__sub__",
        "__mul__", "__post_init__", "__slots__", "__annotations__", "__dataclass_fields__", "__members__",
        "__enter__", "__exit__", "__bool__", "__int__", "__float__", "__abs__", "__neg__", "__missing__",
    }
)
# Frame, code and generator internals: the way from any function to the interpreter's globals.
FRAME_ATTRIBUTES: frozenset[str] = frozenset(
    {
        "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
        "ag_await", "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "f_trace", "tb_frame",
        "tb_next", "co_code", "co_consts", "co_names",
    }
)

# Audit events that ordinary programs (and the allowed modules on their behalf) raise.
# ``exec``/``compile`` come from dataclasses and namedtuple building methods; running code is not
# a side effect, the side effects each have their own event and are blocked.
ALLOWED_EVENTS: frozenset[str] = frozenset(
    {"exec", "compile", "builtins.id", "object.__setattr__", "object.__delattr__", "sys._getframe", "array.__new__", "time.sleep"}
)


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def forbidden_attribute(name: str) -> bool:
    """True for attribute names that lead out of the program: non-safe dunders and frame internals."""
    return (_is_dunder(name) and name not in SAFE_DUNDERS) or name in FRAME_ATTRIBUTES


def static_violation(tree: ast.AST, allowed: frozenset[str] = ALLOWED_MODULES) -> str | None:
    """The first forbidden construct in a parsed program, or None.

    Rejects imports outside ``ALLOWED_MODULES`` (and relative, private or star imports), forbidden
    attributes, and loads of escape-hatch names (``FORBIDDEN_NAMES``) that the program does not
    bind itself. One pass over the tree.
    """
    bound: set[str] = set()
    loaded: list[str] = []
    for node in ast.walk(tree):
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is ast.Load:
                if node.id in FORBIDDEN_NAMES:
                    loaded.append(node.id)
            else:
                bound.add(node.id)
        elif kind is ast.Attribute:
            if forbidden_attribute(node.attr):
                return f"access to attribute {node.attr!r} is not allowed"
        elif kind is ast.arg:
            bound.add(node.arg)
        elif kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
            bound.add(node.name)
        elif kind is ast.Import:
            for alias in node.names:
                if alias.name not in allowed:
                    return f"import of module {alias.name!r} is not allowed"
                bound.add((alias.asname or alias.name).split(".")[0])
        elif kind is ast.ImportFrom:
            if node.level:
                return "relative imports are not allowed"
            if node.module not in allowed:
                return f"import from module {node.module!r} is not allowed"
            for alias in node.names:
                if alias.name.startswith("_") or alias.name == "*":
                    return f"'from {node.module} import {alias.name}' is not allowed"
                bound.add(alias.asname or alias.name)
        elif kind is ast.ExceptHandler and node.name:
            bound.add(node.name)
        elif kind in (ast.Global, ast.Nonlocal) and any(n in FORBIDDEN_NAMES for n in node.names):
            return f"declaring {[n for n in node.names if n in FORBIDDEN_NAMES][0]!r} is not allowed"
    for name in loaded:
        if name not in bound:
            return f"use of {name!r} is not allowed"
    return None


def _name_problem(name: Any) -> str | None:
    """Why a name given as a string to getattr and friends is refused, or None (non-str names are
    left to the real function, which raises its own TypeError)."""
    if isinstance(name, str) and (name.startswith("_") and name not in SAFE_DUNDERS or name in FRAME_ATTRIBUTES):
        return f"access to attribute {name!r} is not allowed"
    return None


def fatal(result_fd: int) -> Callable[[str], NoReturn]:
    """The one way a guard reports a violation: write a ``forbidden`` frame (``verifier.frames``)
    with the reason on the run's result pipe and end the process at once (``os._exit``), so a
    program cannot catch the verdict or go on after it. ``os.write`` and ``os._exit`` are bound
    here, in the closure, so rebinding them in the ``os`` module changes nothing; the closure
    itself is reachable from program code (see the module docstring: a convenience layer)."""
    write, exit_now, frame = os.write, os._exit, encode_frame

    def deny(reason: str) -> NoReturn:
        try:
            write(result_fd, frame("forbidden", str(reason)[:300]))
        finally:
            exit_now(0)

    return deny


def prepare(deny: Callable[[str], NoReturn], allowed: frozenset[str] = ALLOWED_MODULES) -> dict[str, Any]:
    """Build the guarded builtins and patch ``operator`` once, in the fork server; every child
    inherits them for free. ``deny`` (from ``fatal``) ends a run that breaks a rule."""
    table = safe_builtins(deny, allowed)
    guard_operator_module(deny)
    return table


def safe_builtins(deny: Callable[[str], NoReturn], allowed: frozenset[str] = ALLOWED_MODULES) -> dict[str, Any]:
    """The builtins a program runs with; a forbidden use ends the run through ``deny``."""
    real_import = builtins.__import__
    allowed = frozenset(allowed)

    def guarded_import(name: str, globals=None, locals=None, fromlist=(), level: int = 0):  # noqa: A002
        if level or name not in allowed or any(str(n).startswith("_") for n in fromlist or ()):
            deny(f"import of module {name!r} is not allowed")
        return real_import(name, globals, locals, fromlist, 0)

    def guarded(fn: Callable) -> Callable:
        def wrapper(obj, name, *rest):
            reason = _name_problem(name)
            if reason:
                deny(reason)
            return fn(obj, name, *rest)

        wrapper.__name__ = fn.__name__
        return wrapper

    table = {k: v for k, v in vars(builtins).items() if k not in FORBIDDEN_NAMES and k not in REMOVED_BUILTINS}
    table.update(
        __import__=guarded_import,
        __build_class__=builtins.__build_class__,
        getattr=guarded(getattr),
        setattr=guarded(setattr),
        delattr=guarded(delattr),
        hasattr=guarded(hasattr),
        print=lambda *args, **kwargs: None,
    )
    return table


def guard_operator_module(deny: Callable[[str], NoReturn]) -> None:
    """Make ``operator.attrgetter``/``methodcaller`` refuse private names (they take names as strings).

    Called in the fork server, which never runs programs itself; the standard library binds the
    real functions at import time (``from operator import attrgetter``), so it is unaffected.
    """
    real_attrgetter, real_methodcaller = operator.attrgetter, operator.methodcaller

    def check(name: Any) -> None:
        for part in str(name).split("."):
            reason = _name_problem(part)
            if reason:
                deny(reason)

    def attrgetter(*names):
        for n in names:
            check(n)
        return real_attrgetter(*names)

    def methodcaller(name, /, *args, **kwargs):
        check(name)
        return real_methodcaller(name, *args, **kwargs)

    operator.attrgetter, operator.methodcaller = attrgetter, methodcaller


# Functions of already-imported modules that act outside the process but raise no audit event in
# CPython 3.11 (checked by hand: fork_exec, pidfd_open, pidfd_send_signal, mkfifo, mknod, openpty...).
# A run with the Python layer replaces them, in every module that holds them, by ``deny``.
UNAUDITED: dict[str, tuple[str, ...]] = {
    "posix": ("pidfd_open", "mkfifo", "mknod", "openpty", "login_tty", "setns", "unshare", "memfd_create", "eventfd"),
    "os": ("pidfd_open", "mkfifo", "mknod", "openpty", "login_tty", "setns", "unshare", "memfd_create", "eventfd"),
    "signal": ("pidfd_send_signal",),
    "_signal": ("pidfd_send_signal",),
    "_posixsubprocess": ("fork_exec",),
}


def disarm(deny: Callable[[str], NoReturn]) -> None:
    """Replace the ``UNAUDITED`` functions by stubs that end the run (in the child, before the program)."""
    modules = sys.modules
    for module_name, names in UNAUDITED.items():
        module = modules.get(module_name)
        if module is None:
            continue
        namespace = module.__dict__
        for name in names:
            if name in namespace:
                namespace[name] = _stub(deny, f"{module_name}.{name}")


def _stub(deny: Callable[[str], NoReturn], what: str) -> Callable[..., NoReturn]:
    def stub(*args, **kwargs) -> NoReturn:
        deny(f"blocked operation {what!r}")

    return stub


def install_audit_hook(deny: Callable[[str], NoReturn]) -> None:
    """Block every audit event outside ``ALLOWED_EVENTS`` (PEP 578); hooks cannot be removed once added.

    ``object.__getattr__`` is allowed except for frame attributes (the route to interpreter globals).
    The policy is bound here, in the closure of the hook, as frozensets: rebinding the names of
    this module (``guard.ALLOWED_EVENTS = ...``, through ``sys.modules`` or a function's globals)
    does not change it and the sets cannot be mutated. A blocked event ends the run at once
    through ``deny``: there is no record to clear. ``deny`` itself is reachable from program code
    (the module docstring): this hook is a convenience, not a boundary.
    """
    allowed: frozenset[str] = frozenset(ALLOWED_EVENTS)
    frame_attributes: frozenset[str] = frozenset(FRAME_ATTRIBUTES)

    def hook(event: str, args: tuple) -> None:
        if event in allowed:
            return
        if event == "object.__getattr__":
            if not (len(args) > 1 and args[1] in frame_attributes):
                return
            deny(f"blocked operation {event!r} on {str(args[1])[:40]!r}")
        deny(f"blocked operation {event!r}")

    sys.addaudithook(hook)
