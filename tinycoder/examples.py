"""Training examples in exactly the project's prompt formats, for every (role, family) pair.

Prompts come from ``verifier.prompts.teacher_prompt`` / ``student_prompt`` and completions from
``teacher_response`` / ``student_response``, the same builders and layout the run uses, so the
model learns the formats the parsers read back.

- Teacher ``code_o`` / ``code_i``: K reference tasks in the prompt (other corpus tasks, sometimes
  the identity seed the buffers start with); the completion plans in ``<think>`` (the program's
  idioms in words) and gives the program and one input.
- Teacher ``code_f``: the prompt shows a program; the completion gives ``n`` inputs and a hint
  message (the same words as the plan).
- Students: the answer is right with probability ``p_correct`` and otherwise a plausible wrong
  answer of the same form (:mod:`tinycoder.wrong_answers`), so RL has room to improve. The
  ``<think>`` line names the type of the answer; for ``code_o`` it first lists the value of each
  phase result on the input (computed by the sandbox), a step-by-step trace a small model can
  follow, or, with ``ExampleMix.student_trace = "lines"``, the state after every executed line
  (:mod:`tinycoder.line_trace`). A right ``code_i`` answer is the shortest known input that gives the output (any such
  input is right).
"""

from __future__ import annotations

import ast
import random
from collections.abc import Mapping
from dataclasses import dataclass

from tinycoder.corpus import VerifiedProgram
from tinycoder.programs import DESCRIBE
from tinycoder.wrong_answers import wrong_input, wrong_output, wrong_program
from verifier.prompts import student_prompt, student_response, teacher_prompt, teacher_response
from verifier.tasks import Task, identity_task

ROLES_FAMILIES = (
    ("teacher", "code_o"), ("teacher", "code_i"), ("teacher", "code_f"),
    ("student", "code_o"), ("student", "code_i"), ("student", "code_f"),
)


@dataclass(frozen=True)
class Example:
    """One supervised example: the loss is on ``completion`` only."""

    role: str
    family: str
    prompt: str
    completion: str
    correct: bool = True


STUDENT_TRACES = ("phases", "lines")


@dataclass(frozen=True)
class ExampleMix:
    """Examples drawn per corpus program, the references shown, and how often students are right."""

    teacher_io: float = 1.0  # one code_o or code_i proposal
    teacher_f: float = 0.4
    student_o: float = 0.6
    student_i: float = 0.6
    student_f: float = 0.4
    p_correct: float = 0.85
    references: tuple[int, ...] = (0, 0, 1, 2)  # K drawn per teacher prompt
    identity_reference_rate: float = 0.15
    code_f_inputs: tuple[int, ...] = (4,)  # n inputs per code_f task: configs/tiny.yaml asks for 4
    # What a code_o student writes in <think> before its answer: "phases", each phase result's value (the
    # generator's phases), or "lines", a per-line execution trace (tinycoder.line_trace) of at most trace_chars
    # characters, the rest elided.
    student_trace: str = "phases"
    trace_chars: int = 200
    # Only programs without dead code (tinycoder.liveness) make examples, teachers' and students', so that a longer
    # program the model learns to write or solve asks for more work.
    live_only: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_correct <= 1.0:
            raise ValueError(f"ExampleMix.p_correct must be in [0, 1], got {self.p_correct}")
        if self.student_trace not in STUDENT_TRACES:
            raise ValueError(f"ExampleMix.student_trace must be one of {', '.join(STUDENT_TRACES)}, got {self.student_trace!r}")
        if self.trace_chars < 1:
            raise ValueError(f"ExampleMix.trace_chars must be >= 1, got {self.trace_chars}")


def value_type(literal: str) -> str:
    """A short English name of the literal's type ('a list of ints'); ``ast.literal_eval`` only."""
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return "a value"
    if isinstance(value, bool):
        return DESCRIBE["bool"]
    if isinstance(value, int):
        return DESCRIBE["int"]
    if isinstance(value, str):
        return DESCRIBE["str"]
    if isinstance(value, dict):
        return "a dict"
    if isinstance(value, tuple):
        return "a tuple"
    if value is None:
        return "None"
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            return DESCRIBE["list[str]"]
        return DESCRIBE["list[int]"] if all(isinstance(v, int) for v in value) else "a list"
    return "a value"


def io_task(family: str, item: VerifiedProgram, index: int = 0) -> Task:
    return Task(family, item.program.source, [item.inputs[index]], [item.outputs[index]])


def f_task(item: VerifiedProgram, n: int) -> Task:
    n = min(n, len(item.inputs))
    return Task("code_f", item.program.source, list(item.inputs[:n]), list(item.outputs[:n]), item.program.message)


class ExampleWriter:
    """Turns corpus programs into examples of every (role, family) pair (deterministic for an rng)."""

    def __init__(self, corpus: list[VerifiedProgram], mix: ExampleMix, rng: random.Random,
                 lines: Mapping[str, tuple[str, ...]] | None = None):
        """``lines``: with ``mix.student_trace == "lines"``, each program's per-line trace on its first input
        (``tinycoder.line_trace.line_traces``), by source."""
        if not corpus:
            raise ValueError("ExampleWriter needs a non-empty corpus")
        if mix.student_trace == "lines" and lines is None:
            raise ValueError("an ExampleMix with student_trace='lines' needs the programs' line traces")
        self.corpus = corpus
        self.mix = mix
        self.rng = rng
        self.lines = lines or {}

    def all_examples(self) -> list[Example]:
        out: list[Example] = []
        for item in self.corpus:
            out += self.examples_for(item)
        return out

    def examples_for(self, item: VerifiedProgram) -> list[Example]:
        rng, mix = self.rng, self.mix
        out = []
        if rng.random() < mix.teacher_io:
            out.append(self.teacher_io(item, rng.choice(["code_o", "code_i"])))
        if rng.random() < mix.teacher_f:
            out.append(self.teacher_f(item))
        if rng.random() < mix.student_o:
            out.append(self.student("code_o", item))
        if rng.random() < mix.student_i:
            out.append(self.student("code_i", item))
        if rng.random() < mix.student_f:
            out.append(self.student("code_f", item))
        return out

    def _references(self, family: str, exclude: VerifiedProgram) -> list[Task]:
        k = self.rng.choice(self.mix.references)
        refs = []
        for _ in range(k):
            if self.rng.random() < self.mix.identity_reference_rate:
                refs.append(identity_task(family))
                continue
            other = self.rng.choice(self.corpus)
            if other is not exclude:
                refs.append(io_task(family, other, self.rng.randrange(len(other.inputs))))
        return refs

    def teacher_io(self, item: VerifiedProgram, family: str) -> Example:
        index = self.rng.randrange(len(item.inputs))
        prompt = teacher_prompt(family, self._references(family, item))
        completion = teacher_response(family, program=item.program.source, inputs=[item.inputs[index]], think=item.program.message)
        return Example("teacher", family, prompt, completion)

    def teacher_f(self, item: VerifiedProgram) -> Example:
        n = min(self.rng.choice(self.mix.code_f_inputs), len(item.inputs))
        prompt = teacher_prompt("code_f", [f_task(item, n)], n_inputs=n)
        inputs = list(item.inputs)
        self.rng.shuffle(inputs)
        completion = teacher_response("code_f", inputs=inputs[:n], message=item.program.message)
        return Example("teacher", "code_f", prompt, completion)

    def student(self, family: str, item: VerifiedProgram) -> Example:
        rng = self.rng
        correct = rng.random() < self.mix.p_correct
        if family == "code_f":
            n = min(rng.choice(self.mix.code_f_inputs), len(item.inputs))
            task = f_task(item, n)
            others = [rng.choice(self.corpus).program.source for _ in range(3)]
            value = item.program.source if correct else wrong_program(item.program.source, rng, others)
            think = ""
        else:
            steps = item.trace if self.mix.student_trace == "phases" else self.lines.get(item.program.source, ())
            index = 0 if family == "code_o" and (steps or self.mix.student_trace == "lines") else rng.randrange(len(item.inputs))
            task = io_task(family, item, index)
            if family == "code_o":
                value = task.output if correct else wrong_output(task.output, rng)
                # The phase results (or every line's state) on the input, step by step, then the answer's type.
                think = "".join(f"{line}\n" for line in steps) + f"The output is {value_type(task.output)}."
            else:
                # Any input that gives the output is right: teach the shortest known one, which
                # is often a simple value a solver can guess (``[]``, ``0``, ``''``).
                same = [given for given, out in zip(item.inputs, item.outputs) if out == task.output]
                value = min(same, key=len) if correct else wrong_input(item.program.arg_types, task.input, rng)
                think = f"f takes {', '.join(DESCRIBE[t] for t in item.program.arg_types)}."
        return Example("student", family, student_prompt(task), student_response(family, value, think=think), correct)
