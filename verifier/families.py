"""Validation of teacher proposals and judgement of student answers for code_o, code_i, code_f.

Both work on whole batches and send every execution of a batch to ``Verifier.execute_many`` in
one call, so a step's work runs in parallel. Student answers are read with ``verifier.literals``
(never evaluated on the host); code_i answers and code_f programs run in the sandbox.

- code_o (deduction): correct when ``literal(answer) == literal(gold output)`` (value equality,
  as AZR: ``(1,2)`` and ``(1, 2)`` agree).
- code_i (abduction): correct when ``f(answer args) == gold output``, executed: any input that
  reproduces the output counts.
- code_f (induction): correct when the answered program reproduces *every* hidden pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from verifier.literals import equal as values_equal
from verifier.prompts import Answer, Proposal, parse_answer
from verifier.sandbox import ExecResult, Status, Verifier
from verifier.tasks import Task, check_family

# Judging re-runs code that was already validated (code_i) or only needs its value (code_f):
# one run per call; validation of proposals runs everything twice (the determinism check).
JUDGE_REPEATS = 1


@dataclass
class Validation:
    """Outcome of one proposal: ``task`` (with sandbox-computed outputs) when ``valid``."""

    valid: bool
    task: Task | None
    status: Status | None
    reason: str = ""


@dataclass
class Judgement:
    """Outcome of one student answer."""

    well_formed: bool
    correct: bool
    reason: str = ""


def validate_proposals(
    verifier: Verifier,
    family: str,
    proposals: Sequence[Proposal],
    *,
    programs: Sequence[str] | None = None,
    n_inputs: int | None = None,
) -> list[Validation]:
    """Run every parsed proposal in the sandbox (twice per input) and build the valid tasks.

    code_o / code_i: the program on its one input must give an OK verdict.
    code_f: every input must give an OK verdict on the program, which is ``programs[i]`` (the
    buffer program the prompt showed) or else ``proposals[i].program``; with ``n_inputs`` a
    proposal must bring exactly that many inputs.
    """
    check_family(family)
    if programs is not None and len(programs) != len(proposals):
        raise ValueError(f"got {len(programs)} programs for {len(proposals)} proposals")
    results: list[Validation | None] = [None] * len(proposals)
    calls: list[tuple[str, str]] = []
    owners: list[tuple[int, str, list[str]]] = []  # (proposal index, program, inputs)
    for i, proposal in enumerate(proposals):
        if not isinstance(proposal, Proposal):
            results[i] = Validation(False, None, None, f"not a Proposal: {type(proposal).__name__}")
            continue
        if proposal.error:
            results[i] = Validation(False, None, None, f"invalid proposal: {proposal.error}")
            continue
        program = programs[i] if programs is not None else proposal.program
        inputs = list(proposal.inputs)
        if not program or not program.strip():
            results[i] = Validation(False, None, None, "no program")
            continue
        if family == "code_f":
            if n_inputs is not None and len(inputs) != n_inputs:
                results[i] = Validation(False, None, None, f"{len(inputs)} inputs, need {n_inputs}")
                continue
            if len(inputs) < 2:
                results[i] = Validation(False, None, None, "a code_f proposal needs at least 2 inputs")
                continue
        elif len(inputs) != 1:
            results[i] = Validation(False, None, None, f"a {family} proposal needs exactly 1 input, got {len(inputs)}")
            continue
        owners.append((i, program, inputs))
        calls.extend((program, given) for given in inputs)
    verdicts = verifier.execute_many(calls) if calls else []
    cursor = 0
    for i, program, inputs in owners:
        runs = verdicts[cursor : cursor + len(inputs)]
        cursor += len(inputs)
        failed = next((k for k, r in enumerate(runs) if not r.ok), None)
        if failed is not None:
            r = runs[failed]
            where = f" on input {failed + 1}" if family == "code_f" else ""
            results[i] = Validation(False, None, r.status, f"{r.status.value}{where}: {r.error}")
            continue
        task = Task(family, program, inputs, [r.output for r in runs], proposals[i].message if family == "code_f" else "")
        results[i] = Validation(True, task, Status.OK, "")
    return results  # type: ignore[return-value]


def judge_answers(verifier: Verifier, items: Sequence[tuple[Task, str] | tuple[Task, str, bool]]) -> list[Judgement]:
    """Judge student responses (raw model text) against their tasks, running what needs running in
    one ``execute_many`` batch. Malformed responses are not executed.

    An item is ``(task, text)`` or ``(task, text, truncated)``, where ``truncated`` says that the
    generation stopped at ``max_tokens`` (a malformed answer's reason then starts with ``truncated``).
    """
    results: list[Judgement | None] = [None] * len(items)
    calls: list[tuple[str, str]] = []
    owners: list[tuple[int, list[str]]] = []  # (item index, gold outputs to compare in order)
    for i, item in enumerate(items):
        try:
            task, text, cut = item if len(item) == 3 else (*item, False)
        except (TypeError, ValueError):
            results[i] = Judgement(False, False, "expected a (Task, answer text) pair or a (Task, text, truncated) triple")
            continue
        if not isinstance(task, Task):
            results[i] = Judgement(False, False, f"not a Task: {type(task).__name__}")
            continue
        answer: Answer = parse_answer(task.family, text, truncated_at_limit=bool(cut))
        if not answer.well_formed:
            results[i] = Judgement(False, False, answer.error or "the response is not <think>...</think><answer>...</answer>")
            continue
        if task.family == "code_o":
            correct = values_equal(answer.value, task.output)
            results[i] = Judgement(True, correct, "" if correct else "wrong output")
        elif task.family == "code_i":
            owners.append((i, [task.output]))
            calls.append((task.program, answer.value))
        else:
            hidden = task.hidden_pairs()
            owners.append((i, [o for _, o in hidden]))
            calls.extend((answer.value, given) for given, _ in hidden)
    verdicts: list[ExecResult] = verifier.execute_many(calls, repeats=JUDGE_REPEATS) if calls else []
    cursor = 0
    for i, golds in owners:
        runs = verdicts[cursor : cursor + len(golds)]
        cursor += len(golds)
        reason = ""
        for k, (run, gold) in enumerate(zip(runs, golds)):
            if not run.ok:
                reason = f"{run.status.value} on hidden pair {k + 1}: {run.error}" if len(golds) > 1 else f"{run.status.value}: {run.error}"
                break
            if not values_equal(run.output, gold):
                reason = f"wrong value on hidden pair {k + 1}" if len(golds) > 1 else "f(answer) differs from the output"
                break
        results[i] = Judgement(True, not reason, reason)
    return results  # type: ignore[return-value]
