"""Checks made in the calling process before a call reaches the sandbox (the check of what comes
back is ``verifier.outputs``).

Parsing, the static guard check and compiling happen once per distinct program here (not once
per run in a cold forked child, where every touched page is a copy-on-write fault), and the
argument list is parsed into literal values once. Both travel to the child as ``marshal`` bytes,
so the child only loads, runs and reprs. Nothing here executes the untrusted text: ``ast.parse``,
``compile`` and ``verifier.literals`` build objects, and every failure (including the parser's
``RecursionError``/``MemoryError`` on pathological nesting) becomes a verdict.
"""

from __future__ import annotations

import base64
import marshal
import warnings
from dataclasses import dataclass

from verifier.guard import ALLOWED_MODULES, static_violation
from verifier.literals import parse
from verifier.prompts import parse_arguments


@dataclass(frozen=True)
class Prepared:
    """A program or argument list ready to send (``payload``), or the reason it cannot run."""

    payload: str | None
    status: str = "ok"
    error: str = ""


def prepare_program(program: str, guards: bool = True, allowed: frozenset[str] = ALLOWED_MODULES) -> Prepared:
    """Compile ``program`` (and with ``guards`` run the static check of ``verifier.guard``).

    Returns the marshalled code object as base64, or status ``syntax_error`` / ``forbidden``.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = parse(program, "exec", "<program>")
            if guards:
                reason = static_violation(tree, allowed)
                if reason:
                    return Prepared(None, "forbidden", reason)
            del tree
            code = compile(program, "<program>", "exec", dont_inherit=True)  # from text: faster than from the tree
    except (SyntaxError, ValueError, TypeError) as exc:
        return Prepared(None, "syntax_error", f"{type(exc).__name__}: {exc}"[:300])
    except (RecursionError, MemoryError) as exc:
        return Prepared(None, "syntax_error", f"program too deeply nested to compile ({type(exc).__name__})")
    return Prepared(base64.b64encode(marshal.dumps(code)).decode("ascii"))


def prepare_args(args: str) -> Prepared:
    """Parse argument-list text into literal values (``verifier.literals``), marshalled as base64."""
    try:
        values = parse_arguments(args)
    except ValueError as exc:
        return Prepared(None, "bad_input", str(exc))
    try:
        return Prepared(base64.b64encode(marshal.dumps(values)).decode("ascii"))
    except ValueError as exc:  # literal_eval builds only marshallable types; this is a safety net
        return Prepared(None, "bad_input", f"arguments cannot be sent to the sandbox: {exc}")
