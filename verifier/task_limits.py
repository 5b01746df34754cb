"""Size limits of a task: how long its program, inputs, outputs and message may be.

Teachers are rewarded for hard tasks, and nothing else stops a task from growing until its prompts
no longer fit the model's context. A proposal over any limit is invalid (the teacher gets the
invalid reward) with a reason that names the part, its size and the limit. Limits are in
characters and, when a token counter is given (the model's tokenizer), in tokens too.

The same :class:`TaskLimits` is what the r1/chat prompts state to the teachers
(``verifier.prompt_styles``), so the rule a teacher reads and the rule it is judged by are one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from verifier.prompts import Proposal
from verifier.tasks import Task

TokenCounter = Callable[[str], int]
PARTS: tuple[str, ...] = ("program", "input", "output", "message")


@dataclass(frozen=True)
class TaskLimits:
    """Largest program, input (each), output (each) and message a valid task may have."""

    program_chars: int = 4000
    program_tokens: int = 1024
    input_chars: int = 1000
    input_tokens: int = 256
    output_chars: int = 1000
    output_tokens: int = 256
    message_chars: int = 1000
    message_tokens: int = 256

    @classmethod
    def from_config(cls, tasks: Any, verifier_max_output_chars: int | None = None) -> "TaskLimits":
        """From a ``TasksConfig`` (``tasks.max_*``); the output limit is the smaller of the task limit and
        the sandbox's own ``verifier.max_output_chars`` when given (a longer output never validates)."""
        output_chars = tasks.max_output_chars
        if verifier_max_output_chars is not None:
            output_chars = min(output_chars, verifier_max_output_chars)
        return cls(
            program_chars=tasks.max_program_chars, program_tokens=tasks.max_program_tokens,
            input_chars=tasks.max_input_chars, input_tokens=tasks.max_input_tokens,
            output_chars=output_chars, output_tokens=tasks.max_output_tokens,
            message_chars=tasks.max_message_chars, message_tokens=tasks.max_message_tokens,
        )

    def chars(self, part: str) -> int:
        """The character limit of ``part`` (one of ``PARTS``)."""
        return getattr(self, f"{_part(part)}_chars")

    def tokens(self, part: str) -> int:
        """The token limit of ``part`` (one of ``PARTS``)."""
        return getattr(self, f"{_part(part)}_tokens")

    def problem(self, part: str, text: str, count_tokens: Optional[TokenCounter] = None, where: str = "") -> str | None:
        """None when ``text`` is within the limits of ``part``, else the reason (``where`` names which one)."""
        name = f"{part}{where}"
        if len(text) > self.chars(part):
            return f"{name} is {len(text)} characters, over the limit of {self.chars(part)} (tasks.max_{part}_chars)"
        if count_tokens is not None:
            # Byte-level tokenizers give at most one token per UTF-8 byte: count only when the limit could be exceeded.
            if len(text.encode("utf-8", "surrogatepass")) >= self.tokens(part):
                n = count_tokens(text)
                if n > self.tokens(part):
                    return f"{name} is {n} tokens, over the limit of {self.tokens(part)} (tasks.max_{part}_tokens)"
        return None

    def proposal_problem(self, family: str, proposal: Proposal, count_tokens: Optional[TokenCounter] = None) -> str | None:
        """The first limit a parsed proposal breaks (program, each input, the code_f message), or None.

        Checked before the sandbox runs anything; outputs are checked on the validated task
        (:meth:`task_problem`). The program of a code_f proposal is the buffer's, not the teacher's.
        """
        checks: list[tuple[str, str, str]] = []
        if family != "code_f":
            checks.append(("program", proposal.program, ""))
        checks += [("input", text, _nth(i, len(proposal.inputs))) for i, text in enumerate(proposal.inputs)]
        if family == "code_f":
            checks.append(("message", proposal.message, ""))
        return self._first(checks, count_tokens)

    def task_problem(self, task: Task, count_tokens: Optional[TokenCounter] = None) -> str | None:
        """The first limit a task breaks (program, inputs, outputs, message), or None."""
        checks = [("program", task.program, "")]
        checks += [("input", text, _nth(i, len(task.inputs))) for i, text in enumerate(task.inputs)]
        checks += [("output", text, _nth(i, len(task.outputs))) for i, text in enumerate(task.outputs)]
        if task.family == "code_f":
            checks.append(("message", task.message, ""))
        return self._first(checks, count_tokens)

    def _first(self, checks: list[tuple[str, str, str]], count_tokens: Optional[TokenCounter]) -> str | None:
        for part, text, where in checks:
            reason = self.problem(part, text, count_tokens, where)
            if reason:
                return reason
        return None


def _part(part: str) -> str:
    if part not in PARTS:
        raise ValueError(f"unknown task part {part!r}; valid parts: {', '.join(PARTS)}")
    return part


def _nth(index: int, total: int) -> str:
    return f" {index + 1}" if total > 1 else ""
