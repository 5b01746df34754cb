"""The training corpus: generated programs with inputs, their outputs computed by the verifier.

Programs come from :mod:`tinycoder.programs`; every (program, input) pair runs in the project's
sandbox (``Verifier.execute_many``, each program run twice and compared, so only deterministic
programs survive). A pair is kept when it runs, its output is a literal no longer than
``max_output_chars`` and its input no longer than ``max_input_chars``; a program is kept when at
least ``min_inputs`` of its inputs survive. Programs that give one output for every input are
mostly dropped (``constant_keep_rate`` of them stay): they make poor tasks. Nothing is evaluated
on the host.
"""

from __future__ import annotations

import ast
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol, Sequence

from tinycoder.programs import Program, ShapeRange, generate_program, random_args, simple_args
from verifier.sandbox import ExecResult, Status


@dataclass(frozen=True)
class CorpusSettings:
    """How many programs to draw, how many inputs each (the first ``simple_inputs`` draws are of the
    simplest values, see ``programs.simple_args``), and the size limits of a kept pair."""

    programs: int = 4000
    inputs_per_program: int = 6
    min_inputs: int = 4
    max_output_chars: int = 60
    max_input_chars: int = 60
    simple_inputs: int = 2
    constant_keep_rate: float = 0.25
    shapes: ShapeRange = field(default_factory=ShapeRange)

    def __post_init__(self) -> None:
        if self.programs < 1:
            raise ValueError(f"CorpusSettings.programs must be >= 1, got {self.programs}")
        if not 1 <= self.min_inputs <= self.inputs_per_program:
            raise ValueError(
                f"CorpusSettings needs 1 <= min_inputs <= inputs_per_program, got {self.min_inputs} and {self.inputs_per_program}"
            )


@dataclass(frozen=True)
class VerifiedProgram:
    """A program with the inputs that ran and the sandbox's outputs for them (same order), and the
    values of its phase results on the first input (``name = repr`` lines; empty when unknown)."""

    program: Program
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    trace: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (a build's saved corpus, ``tinycoder.progress``); :meth:`from_dict` reads it back equal."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VerifiedProgram":
        """The inverse of :meth:`to_dict` (JSON lists back to the tuples the dataclasses hold)."""
        p = data["program"]
        program = Program(source=p["source"], arg_types=tuple(p["arg_types"]), phases=tuple(p["phases"]),
                          message=p["message"], results=tuple(p["results"]))
        return cls(program, tuple(data["inputs"]), tuple(data["outputs"]), tuple(data["trace"]))


class Executor(Protocol):
    """What the corpus needs from the verifier: ordered, parallel execution of (program, args) pairs."""

    def execute_many(self, items: Sequence[tuple[str, str]], *, repeats: int = 2) -> list: ...


def draw_programs(settings: CorpusSettings, rng: random.Random) -> list[tuple[Program, list[str]]]:
    """``settings.programs`` distinct programs, each with distinct random inputs."""
    drafts: list[tuple[Program, list[str]]] = []
    seen: set[str] = set()
    attempts = 0
    while len(drafts) < settings.programs:
        attempts += 1
        if attempts > 20 * settings.programs:
            raise RuntimeError(f"the program generator produced only {len(drafts)} distinct programs in {attempts} draws")
        program = generate_program(rng, settings.shapes.draw(rng))
        if program.source in seen:
            continue
        seen.add(program.source)
        inputs: list[str] = []
        for attempt in range(3 * settings.inputs_per_program):
            simple = attempt < settings.simple_inputs
            args = simple_args(rng, program.arg_types) if simple else random_args(rng, program.arg_types)
            if args not in inputs and len(args) <= settings.max_input_chars:
                inputs.append(args)
            if len(inputs) == settings.inputs_per_program:
                break
        rng.shuffle(inputs)
        drafts.append((program, inputs))
    return drafts


def corpus_settings_from_dict(data: dict[str, Any]) -> CorpusSettings:
    """The :class:`CorpusSettings` a build manifest records (``dataclasses.asdict`` of it) back."""
    shapes = dict(data.get("shapes", {}))
    if "phase_weights" in shapes:
        shapes["phase_weights"] = tuple(shapes["phase_weights"])
    return CorpusSettings(**{**data, "shapes": ShapeRange(**shapes)})


def verify_programs(
    executor: Executor, drafts: list[tuple[Program, list[str]]], settings: CorpusSettings, rng: random.Random
) -> list[VerifiedProgram]:
    """Run every (program, input) in the sandbox; keep the pairs that pass (see module docstring)."""
    pairs = [(program.source, args) for program, inputs in drafts for args in inputs]
    sources = [program.traced() if inputs else None for program, inputs in drafts]
    traced = [(source, inputs[0]) for source, (_, inputs) in zip(sources, drafts) if source]
    # One run per pair: the generator's programs are deterministic by construction (no clock,
    # randomness or object ids; set order depends only on the hash seed the sandbox fixes).
    results = executor.execute_many(pairs + traced, repeats=1)
    if len(results) != len(pairs) + len(traced):
        raise RuntimeError(f"the verifier returned {len(results)} results for {len(pairs) + len(traced)} executions")
    traces = iter(results[len(pairs):])
    kept: list[VerifiedProgram] = []
    at = 0
    for (program, inputs), source in zip(drafts, sources):
        good_in, good_out = [], []
        for args in inputs:
            result = results[at]
            at += 1
            if result.status is Status.OK and len(result.output) <= settings.max_output_chars:
                good_in.append(args)
                good_out.append(result.output)
        trace = _trace_lines(program, next(traces)) if source else ()
        if not good_in or good_in[0] != inputs[0]:
            trace = ()  # the trace belongs to inputs[0]
        constant = len(set(good_out)) == 1
        if len(good_in) >= settings.min_inputs and (not constant or rng.random() < settings.constant_keep_rate):
            kept.append(VerifiedProgram(program, tuple(good_in), tuple(good_out), trace))
    return kept


def _trace_lines(program: Program, result: ExecResult) -> tuple[str, ...]:
    """``name = value`` per phase result, from the traced run's tuple (read with ``ast.literal_eval``);
    empty when the run failed, returned early (a guard) or the values are long."""
    if result.status is not Status.OK:
        return ()
    try:
        values = ast.literal_eval(result.output)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return ()
    if not isinstance(values, tuple) or len(values) != len(program.results):
        return ()
    lines = tuple(f"{name} = {value!r}" for name, value in zip(program.results, values))
    return lines if sum(len(line) for line in lines) <= 80 else ()


@dataclass(frozen=True)
class PartialCorpus:
    """A corpus verified up to draft ``drafts_done`` (of ``build_corpus``'s drafts, in order): the programs kept so
    far and the state of the random generator that decides which constant programs stay (a build saves it and
    resumes the corpus there)."""

    drafts_done: int
    kept: tuple[VerifiedProgram, ...]
    rng_state: tuple[Any, ...]


def build_corpus(
    executor: Executor,
    settings: CorpusSettings,
    seed: int,
    *,
    chunk: int | None = None,
    resume: PartialCorpus | None = None,
    on_chunk: Callable[[PartialCorpus], None] | None = None,
) -> list[VerifiedProgram]:
    """Draw programs with ``random.Random(seed)`` and keep those the verifier runs (deterministic).

    ``chunk``: verify that many drafts at a time (all at once when None) and hand each chunk's :class:`PartialCorpus`
    to ``on_chunk`` (not after the last); ``resume``: continue from one. The drafts are drawn again (a few seconds)
    and the generator deciding on constant programs is consumed in draft order, so any chunking, resumed or not,
    keeps the programs one call over all drafts keeps.
    """
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1 or None, got {chunk}")
    rng = random.Random(seed)
    drafts = draw_programs(settings, rng)
    kept: list[VerifiedProgram] = []
    at = 0
    if resume is not None:
        if not 0 <= resume.drafts_done <= len(drafts):
            raise ValueError(f"cannot resume a corpus of {len(drafts)} drafts at draft {resume.drafts_done}")
        at, kept = resume.drafts_done, list(resume.kept)
        rng.setstate(resume.rng_state)
    size = chunk or max(1, len(drafts))
    while at < len(drafts):
        kept += verify_programs(executor, drafts[at:at + size], settings, rng)
        at = min(at + size, len(drafts))
        if on_chunk is not None and at < len(drafts):
            on_chunk(PartialCorpus(at, tuple(kept), rng.getstate()))
    return kept
