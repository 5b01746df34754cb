"""Prompt builders and tolerant parsers for the three task families, in AZR's R1 layout.

A prompt is ``"User: <instruction>\\n<blocks>\\nAssistant: "``; the model answers
``"<think>...</think>\\n<answer>...</answer>"`` with fenced blocks inside the answer:
````` ```python `````, ````` ```input `````, ````` ```output `````, ````` ```message `````.
Instructions are one or two sentences on purpose: the default model is a tiny code model with a
~1k-token context that is trained on exactly these formats.

Parsing follows AZR (reference note A3): the answer is the text after the last ``<answer>`` (up to
``</answer>``); a proposal's program is its first python block and its input the first input block;
a student's answer is the last block of the expected kind. The parsers never raise: every problem
comes back as an ``error`` string.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Sequence

from verifier.literals import LiteralError, build_checked as build_literal, parse as parse_text, read as read_literal
from verifier.tasks import FAMILIES, Task, check_family

TEACHER_INSTRUCTIONS = {
    "code_o": "Write a new function f and one input for it, so that the output is hard to deduce.",
    "code_i": "Write a new function f and one input for it, so that the input is hard to infer from the output.",
}
TEACHER_FORMAT = "Think in <think></think>, then answer in <answer></answer> with a ```python block and an ```input block."
TEACHER_CODE_F = (
    "Give {n} different inputs for f and a message that hints at what f does without showing code. "
    "Think in <think></think>, then answer in <answer></answer> with {n} ```input blocks and a ```message block."
)
STUDENT_INSTRUCTIONS = {
    "code_o": "Deduce the output of f for the input. Think in <think></think>, then answer in <answer></answer> with an ```output block.",
    "code_i": "Find an input for which f returns the output. Think in <think></think>, then answer in <answer></answer> with an ```input block.",
    "code_f": "Write a function f that maps each input to its output. Think in <think></think>, then answer in <answer></answer> with a ```python block.",
}
ASSISTANT = "Assistant: "

_FENCE = re.compile(r"```[ \t]*([A-Za-z_][\w-]*)?[ \t]*\r?\n(.*?)```", re.DOTALL)
_LAYOUT = re.compile(r"\s*(?:<think>)?.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER_ONLY = re.compile(r"\s*<answer>.*?</answer>", re.DOTALL)
_MESSAGE_TAG = re.compile(r"<message>(.*?)</message>", re.DOTALL)
# The inner text of a complete answer: from its <answer> (the last one before the close) to </answer>.
_COMPLETE_ANSWER = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)


def block(kind: str, text: str) -> str:
    """A fenced block: ``"```kind\\ntext\\n```"``."""
    return f"```{kind}\n{text.strip(chr(10))}\n```"


def _prompt(instruction: str, body: str) -> str:
    return "\n".join(part for part in (f"User: {instruction}", body, ASSISTANT) if part)


def teacher_prompt(family: str, references: Sequence[Task], n_inputs: int = 10) -> str:
    """The proposer prompt of ``family``.

    code_o / code_i: the K ``references`` are shown as ``<ref>`` python/input/output triplets.
    code_f: the first reference supplies the program the teacher writes ``n_inputs`` inputs for.
    """
    check_family(family)
    if family == "code_f":
        if not references:
            raise ValueError("a code_f teacher prompt needs one reference task whose program the teacher probes")
        if n_inputs < 2:
            raise ValueError(f"n_inputs must be at least 2 (half are shown, half hidden), got {n_inputs}")
        return _prompt(TEACHER_CODE_F.format(n=n_inputs), block("python", references[0].program))
    refs = "\n".join(
        "<ref>\n" + "\n".join([block("python", t.program), block("input", t.input), block("output", t.output)]) + "\n</ref>"
        for t in references
    )
    return _prompt(f"{TEACHER_INSTRUCTIONS[family]} {TEACHER_FORMAT}", refs)


def student_prompt(task: Task) -> str:
    """The solver prompt of ``task``: code_o shows p and i, code_i shows p and o, code_f shows the
    message and the first half of the pairs (the rest stay hidden for judging)."""
    if task.family == "code_o":
        body = "\n".join([block("python", task.program), block("input", task.input)])
    elif task.family == "code_i":
        body = "\n".join([block("python", task.program), block("output", task.output)])
    else:
        parts = [block("message", task.message)]
        for i, o in task.shown_pairs():
            parts += [block("input", i), block("output", o)]
        body = "\n".join(parts)
    return _prompt(STUDENT_INSTRUCTIONS[task.family], body)


def teacher_response(family: str, *, program: str = "", inputs: Sequence[str] = (), message: str = "", think: str = "") -> str:
    """The well-formed teacher response that ``parse_proposal`` reads back (for training data and tests)."""
    check_family(family)
    if family == "code_f":
        parts = [block("input", i) for i in inputs] + [block("message", message)]
    else:
        parts = [block("python", program), block("input", inputs[0] if inputs else "")]
    return f"<think>{think}</think>\n<answer>\n" + "\n".join(parts) + "\n</answer>"


def student_response(family: str, value: str, think: str = "") -> str:
    """The well-formed student response that ``parse_answer`` reads back."""
    kind = {"code_o": "output", "code_i": "input", "code_f": "python"}[check_family(family)]
    return f"<think>{think}</think>\n<answer>\n{block(kind, value)}\n</answer>"


@dataclass
class Proposal:
    """A parsed teacher response. ``error`` is None when every required block was found."""

    program: str = ""
    inputs: list[str] = field(default_factory=list)
    message: str = ""
    error: str | None = None


@dataclass
class Answer:
    """A parsed student response: ``value`` is the answer text (None when unusable) and ``error`` says why.

    ``well_formed`` holds when the layout matches ``<think>...</think><answer>...</answer>`` (the
    ``<think>`` block may be empty or absent) and the value parses: a literal for code_o, a literal
    argument list for code_i, a program defining ``f`` for code_f.
    """

    value: str | None
    error: str | None = None
    layout_ok: bool = False

    @property
    def well_formed(self) -> bool:
        return self.layout_ok and self.value is not None and self.error is None


def answer_region(text: str) -> str | None:
    """The text of the answer; None without ``<answer>``.

    The last complete ``<answer>...</answer>`` when there is one (a model may mention the tags while
    reasoning, or start a stray ``<answer>`` after its real one), else the text after the last
    ``<answer>`` up to the end.
    """
    complete = _COMPLETE_ANSWER.findall(text)
    if complete:
        return complete[-1]
    start = text.rfind("<answer>")
    if start < 0:
        return None
    return text[start + len("<answer>") :]


def truncated(reason: str) -> str:
    """The reason of a response that is malformed and was cut at ``max_tokens``: says so first."""
    return f"truncated: the response reached max_tokens before its answer was complete ({reason})"


def layout_ok(text: str) -> bool:
    """True when the response is ``[<think>]...</think> <answer>...</answer>`` or just ``<answer>...</answer>``."""
    return bool(_LAYOUT.match(text) or _ANSWER_ONLY.match(text))


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """All fenced blocks as (language tag lower-cased or '', body without surrounding newlines)."""
    return [((tag or "").lower(), body.strip("\r\n")) for tag, body in _FENCE.findall(text)]


def _first(blocks: list[tuple[str, str]], kinds: tuple[str, ...]) -> str | None:
    return next((body for tag, body in blocks if tag in kinds), None)


def _last(blocks: list[tuple[str, str]], kinds: tuple[str, ...]) -> str | None:
    return next((body for tag, body in reversed(blocks) if tag in kinds), None)


def parse_proposal(
    family: str, text: str, *, program: str | None = None, n_inputs: int | None = None, truncated_at_limit: bool = False
) -> Proposal:
    """Parse a teacher response; never raises. With ``truncated_at_limit`` (the generation stopped at
    ``max_tokens``) a malformed response's error starts with ``truncated``.

    code_o / code_i: the first python block (an untagged block also counts) and the first input block.
    code_f: every input block (with ``n_inputs``, at least that many are required and the last
    ``n_inputs`` kept, as in AZR) and a ``message`` block or ``<message>`` tags; the program is the one
    the prompt showed, passed as ``program``.
    """
    proposal = _proposal(family, text, program, n_inputs)
    if truncated_at_limit and proposal.error:
        proposal.error = truncated(proposal.error)
    return proposal


def _proposal(family: str, text: str, program: str | None, n_inputs: int | None) -> Proposal:
    try:
        if family not in FAMILIES:
            return Proposal(error=f"unknown task family {family!r}")
        if not isinstance(text, str):
            return Proposal(error=f"response is {type(text).__name__}, not text")
        region = answer_region(text)
        if region is None:
            return Proposal(error="no <answer> in the response")
        blocks = fenced_blocks(region)
        if family == "code_f":
            inputs = [body.strip() for tag, body in blocks if tag == "input"]
            message = _first(blocks, ("message",))
            if message is None:
                tagged = _MESSAGE_TAG.search(region)
                message = tagged.group(1) if tagged else None
            prog = program or ""
            if n_inputs is not None and len(inputs) < n_inputs:
                return Proposal(prog, inputs, (message or "").strip(), f"{len(inputs)} input blocks, need {n_inputs}")
            if n_inputs is not None:
                inputs = inputs[-n_inputs:]
            if len(inputs) < 2:
                return Proposal(prog, inputs, (message or "").strip(), f"{len(inputs)} input blocks, need at least 2")
            if message is None or not message.strip():
                return Proposal(prog, inputs, "", "no ```message block")
            return Proposal(prog, inputs, message.strip())
        code = _first(blocks, ("python", "python3", "py", ""))
        given = _first(blocks, ("input",))
        if code is None or not code.strip():
            return Proposal(inputs=[given.strip()] if given else [], error="no ```python block")
        if given is None or not given.strip():
            return Proposal(program=code, error="no ```input block")
        return Proposal(program=code, inputs=[given.strip()])
    except Exception as exc:  # the contract is a verdict, never an exception
        return Proposal(error=f"parser failure: {type(exc).__name__}: {exc}")


def check_literal(text: str) -> str | None:
    """None when ``text`` is one Python literal, else the reason (``verifier.literals.read``; nothing is evaluated)."""
    try:
        read_literal(text.strip())
        return None
    except LiteralError as exc:
        return str(exc)[:120]


def parse_arguments(text: str) -> tuple[list, dict]:
    """Parse argument-list text (``'abc', [1, 2], k=3``) into literal positional and keyword values.

    Only literals are accepted (``verifier.literals`` on each argument: ``ast.literal_eval``'s
    grammar, in time bounded by the text's length), so nothing is evaluated. Raises ``ValueError``
    naming the problem.
    """
    if not isinstance(text, str):
        raise ValueError(f"arguments must be text, got {type(text).__name__}")
    try:
        call = parse_text(f"f({text.strip()}\n)").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ValueError(f"arguments do not parse as an argument list: {type(exc).__name__}: {str(exc)[:80]}") from None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.func.id != "f":
        raise ValueError("arguments do not parse as an argument list")
    args, kwargs = [], {}
    for position, node in enumerate(call.args + [kw.value for kw in call.keywords], start=1):
        if position > len(call.args) and call.keywords[position - len(call.args) - 1].arg is None:
            raise ValueError("** arguments are not allowed")
        try:
            value = build_literal(node)
        except LiteralError as exc:
            raise ValueError(f"argument {position} is not a Python literal: {_shown(node)} ({str(exc)[:80]})") from None
        if position <= len(call.args):
            args.append(value)
        else:
            kwargs[call.keywords[position - len(call.args) - 1].arg] = value
    return args, kwargs


def _shown(node: ast.AST) -> str:
    try:
        return ast.unparse(node)[:60]
    except (RecursionError, ValueError, MemoryError):
        return type(node).__name__


def check_arguments(text: str) -> str | None:
    """None when ``text`` is a literal argument list, else the reason."""
    try:
        parse_arguments(text)
        return None
    except ValueError as exc:
        return str(exc)


def check_program(text: str) -> str | None:
    """None when ``text`` parses and defines a top-level ``f``, else the reason."""
    try:
        tree = parse_text(text, "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        return f"program does not parse: {type(exc).__name__}: {str(exc)[:80]}"
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "f" for n in tree.body):
        return "program defines no top-level function f"
    return None


def parse_answer(family: str, text: str, truncated_at_limit: bool = False) -> Answer:
    """Parse a student response; never raises.

    The value is the last block of the expected kind inside the answer (``output`` for code_o,
    ``input`` for code_i, ``python`` for code_f); without any fenced block the whole answer text is
    used (AZR's fallback). The value is checked syntactically only, never evaluated. With
    ``truncated_at_limit`` (the generation stopped at ``max_tokens``) a malformed answer's error
    starts with ``truncated``.
    """
    answer = _answer(family, text)
    if truncated_at_limit and not answer.well_formed:
        answer.error = truncated(answer.error or "the response is not <think>...</think><answer>...</answer>")
    return answer


def _answer(family: str, text: str) -> Answer:
    try:
        if family not in FAMILIES:
            return Answer(None, f"unknown task family {family!r}")
        if not isinstance(text, str):
            return Answer(None, f"response is {type(text).__name__}, not text")
        region = answer_region(text)
        layout = layout_ok(text)
        if region is None:
            return Answer(None, "no <answer> in the response", layout)
        blocks = fenced_blocks(region)
        kinds = {"code_o": ("output",), "code_i": ("input",), "code_f": ("python", "python3", "py", "")}[family]
        value = _last(blocks, kinds)
        if value is None:
            if blocks:
                return Answer(None, f"no ```{kinds[0]} block in the answer", layout)
            value = region
        value = value.strip("\n") if family == "code_f" else value.strip()
        if not value.strip():
            return Answer(None, "empty answer", layout)
        check = {"code_o": check_literal, "code_i": check_arguments, "code_f": check_program}[family]
        problem = check(value)
        return Answer(value, problem, layout)
    except Exception as exc:  # the contract is a verdict, never an exception
        return Answer(None, f"parser failure: {type(exc).__name__}: {exc}")
