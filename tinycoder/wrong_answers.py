"""Plausible wrong answers, so the tiny model's students start right only part of the time.

Each function returns an answer of the right *form* (a literal of the same type, an argument list
of the same types, a program that still defines ``f``) that differs from the right one, so RL has
something to improve from the first step. Literals are read with ``ast.literal_eval`` (nothing is
evaluated); whether a wrong answer really is wrong is decided by the verifier, not here.
"""

from __future__ import annotations

import ast
import random
import re

from tinycoder.programs import LETTERS, random_args

_NUMBER = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
_SWAPS = [(" < ", " > "), (" > ", " < "), (" <= ", " >= "), (" == ", " != "), (" + ", " - "), (" - ", " + "), ("//", "%")]


def perturb_value(value: object, rng: random.Random) -> object:
    """A value of the same type that differs from ``value`` in one small way."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-2, -1, 1, 1, 2, 3]) if rng.random() < 0.8 else -value if value else 1
    if isinstance(value, str):
        return _perturb_str(value, rng)
    if isinstance(value, list):
        return _perturb_list(value, rng)
    if isinstance(value, tuple):
        if not value:
            return (0,)
        i = rng.randrange(len(value))
        return value[:i] + (perturb_value(value[i], rng),) + value[i + 1 :]
    if isinstance(value, dict):
        return _perturb_dict(value, rng)
    if value is None:
        return rng.choice([0, "", []])
    return repr(value)


def _perturb_str(value: str, rng: random.Random) -> str:
    if not value:
        return rng.choice(LETTERS)
    i = rng.randrange(len(value))
    edits = [
        lambda: value[:i] + value[i + 1 :],
        lambda: value[:i] + value[i] + value[i:],
        lambda: value[:i] + rng.choice(LETTERS) + value[i + 1 :],
        lambda: value[::-1],
        lambda: value + rng.choice(LETTERS),
        lambda: value.upper() if value != value.upper() else value.lower(),
    ]
    return rng.choice(edits)()


def _perturb_list(value: list, rng: random.Random) -> list:
    if not value:
        return [rng.randint(0, 5)]
    i = rng.randrange(len(value))
    edits = [
        lambda: value[:i] + value[i + 1 :],
        lambda: value + [value[i]],
        lambda: value[::-1],
        lambda: value[:i] + [perturb_value(value[i], rng)] + value[i + 1 :],
        lambda: sorted(value) if all(isinstance(v, type(value[0])) for v in value) and not isinstance(value[0], (list, dict)) else value[1:],
    ]
    return rng.choice(edits)()


def _perturb_dict(value: dict, rng: random.Random) -> dict:
    if not value:
        return {rng.choice(LETTERS): 1}
    key = rng.choice(list(value))
    changed = dict(value)
    if rng.random() < 0.3:
        del changed[key]
    else:
        changed[key] = perturb_value(value[key], rng)
    return changed


def wrong_output(output: str, rng: random.Random) -> str:
    """The repr of a value of the same type as the literal ``output`` that differs from it."""
    try:
        value = ast.literal_eval(output)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return output + "0"
    for _ in range(6):
        changed = perturb_value(value, rng)
        if changed != value or type(changed) is not type(value):
            return repr(changed)
    return repr(rng.choice([0, "", []]))


def wrong_input(arg_types: tuple[str, ...], given: str, rng: random.Random) -> str:
    """Other arguments of the same types (usually giving another output; the verifier decides)."""
    for _ in range(4):
        other = random_args(rng, arg_types)
        if other != given:
            return other
    return other


def wrong_program(program: str, rng: random.Random, others: list[str]) -> str:
    """``program`` with one constant or operator changed, else another program of the corpus."""
    edits: list[str] = []
    numbers = list(_NUMBER.finditer(program))
    if numbers:
        m = rng.choice(numbers)
        new = str(int(m.group(1)) + rng.choice([1, 2, -1]) if int(m.group(1)) > 1 else int(m.group(1)) + 1)
        edits.append(program[: m.start()] + new + program[m.end() :])
    swaps = [(a, b) for a, b in _SWAPS if a in program]
    if swaps:
        a, b = rng.choice(swaps)
        at = [m.start() for m in re.finditer(re.escape(a), program)]
        pos = rng.choice(at)
        edits.append(program[:pos] + b + program[pos + len(a) :])
    if edits and rng.random() < 0.8:
        return rng.choice(edits)
    alternatives = [p for p in others if p != program]
    return rng.choice(alternatives) if alternatives else (edits[0] if edits else program)
