"""Tasks of the three AZR families and the seed tasks the buffers start from.

A task is a triplet (program p defining ``f``, inputs, outputs). Inputs are Python argument lists as
text (``'abc', [1, 2]``), outputs are ``repr(f(*args))`` as computed by the sandbox.

- ``code_o`` (deduction) and ``code_i`` (abduction) hold one input and its output.
- ``code_f`` (induction) holds N input/output pairs and a hint ``message``; the student sees the
  message and the first ``N // 2`` pairs (AZR's split) and must match the rest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FAMILIES: tuple[str, ...] = ("code_o", "code_i", "code_f")

IDENTITY_PROGRAM = "def f(a):\n    return a"
IDENTITY_MESSAGE = "Write a function that returns whatever you input"
# AZR's code_f seed pairs: a string, an int, a dict, a tuple, a nested-list string and a long int.
IDENTITY_CODE_F_INPUTS = (
    "'Hello world'",
    "1",
    "{'name': 'Alice', 'age': 30}",
    "(1, 2, 3)",
    "'[[1, 2], [3, 4]]'",
    "12345678901234567890",
)


def check_family(family: str) -> str:
    """Return ``family`` unchanged, or raise ``ValueError`` naming the valid families."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; valid families: {', '.join(FAMILIES)}")
    return family


@dataclass
class Task:
    """One verified task. ``inputs[i]`` is argument-list text, ``outputs[i]`` the repr of ``f(*inputs[i])``."""

    family: str
    program: str
    inputs: list[str]
    outputs: list[str]
    message: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_family(self.family)
        if not isinstance(self.program, str):
            raise TypeError(f"Task.program must be str, got {type(self.program).__name__}")
        for name in ("inputs", "outputs"):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise TypeError(f"Task.{name} must be a list of strings, got {type(getattr(self, name)).__name__}")
        self.inputs = [str(i) for i in self.inputs]
        self.outputs = [str(o) for o in self.outputs]
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"Task has {len(self.inputs)} inputs but {len(self.outputs)} outputs")
        if self.family == "code_f":
            if len(self.inputs) < 2:
                raise ValueError(f"a code_f task needs at least 2 input/output pairs, got {len(self.inputs)}")
        elif len(self.inputs) != 1:
            raise ValueError(f"a {self.family} task holds exactly 1 input/output pair, got {len(self.inputs)}")

    @property
    def input(self) -> str:
        """The single input of a code_o / code_i task (the first one otherwise)."""
        return self.inputs[0]

    @property
    def output(self) -> str:
        """The single output of a code_o / code_i task (the first one otherwise)."""
        return self.outputs[0]

    @property
    def n_shown(self) -> int:
        """How many pairs the student sees: AZR shows the first ``N // 2`` of a code_f task."""
        return len(self.inputs) // 2 if self.family == "code_f" else len(self.inputs)

    def shown_pairs(self) -> list[tuple[str, str]]:
        """The (input, output) pairs shown to the student."""
        return list(zip(self.inputs, self.outputs))[: self.n_shown]

    def hidden_pairs(self) -> list[tuple[str, str]]:
        """The held-out (input, output) pairs a code_f answer must match (empty for other families)."""
        return list(zip(self.inputs, self.outputs))[self.n_shown :] if self.family == "code_f" else []

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; ``Task.from_dict`` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Task":
        """Build a task from ``to_dict`` output; unknown keys are an error."""
        if not isinstance(data, dict):
            raise TypeError(f"Task.from_dict needs a dict, got {type(data).__name__}")
        known = {"family", "program", "inputs", "outputs", "message", "meta"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown Task keys {unknown}; valid keys: {sorted(known)}")
        missing = sorted({"family", "program", "inputs", "outputs"} - set(data))
        if missing:
            raise ValueError(f"Task dict lacks {missing}")
        return cls(
            family=data["family"],
            program=data["program"],
            inputs=list(data["inputs"]),
            outputs=list(data["outputs"]),
            message=data.get("message", ""),
            meta=dict(data.get("meta") or {}),
        )


def identity_task(family: str) -> Task:
    """AZR's seed: ``def f(a): return a`` on ``'Hello world'`` (six varied pairs for code_f)."""
    check_family(family)
    if family == "code_f":
        inputs = list(IDENTITY_CODE_F_INPUTS)
        return Task("code_f", IDENTITY_PROGRAM, inputs, list(inputs), IDENTITY_MESSAGE)
    return Task(family, IDENTITY_PROGRAM, ["'Hello world'"], ["'Hello world'"])
