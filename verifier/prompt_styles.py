"""Prompt styles for real models: ``compact``, ``r1`` and ``chat`` (``tasks.prompt_style``).

- ``compact``: the one-sentence prompts of :mod:`verifier.prompts`, unchanged; the built-in tiny
  model is trained on exactly those.
- ``r1``: for base models (Qwen2.5-7B, -Coder-7B as in AZR). A framing paragraph (a dialogue in
  which the assistant reasons in ``<think>`` and answers in ``<answer>``), then the user turn with
  the family's task, every rule a valid task must meet, the K references as examples, what makes a
  task hard for the solver and the exact answer layout; the text ends with ``Assistant: <think>``,
  where the model's reasoning begins.
- ``chat``: the same framing (system message) and task (user message) rendered by the tokenizer's
  chat template, for instruct models, followed by ``<think>``. A tokenizer without a chat template
  is refused with :class:`PromptStyleError`.

The rules come from the code that enforces them: the module allow-list, the builtins a program
does not get and the attribute rules are read from :mod:`verifier.guard`; the size limits are
:class:`verifier.task_limits.TaskLimits`; time and memory are the sandbox's settings. Answers in
every style have the layout :mod:`verifier.prompts` parses (fenced blocks inside ``<answer>``).

Pure Python: the tokenizer is any object with ``__call__`` (Hugging Face style, returning
``input_ids``) and ``apply_chat_template``; nothing here imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

from verifier.guard import ALLOWED_MODULES, FORBIDDEN_NAMES, FRAME_ATTRIBUTES, REMOVED_BUILTINS, SAFE_DUNDERS
from verifier.prompts import block, student_prompt, teacher_prompt
from verifier.task_limits import TaskLimits
from verifier.tasks import Task, check_family

PromptStyle = Literal["compact", "r1", "chat"]
STYLES: tuple[str, ...] = ("compact", "r1", "chat")
THINK = "<think>"

FRAMING = (
    "A conversation between a User and an Assistant. The User gives a task. The Assistant first works "
    "the task out step by step, writing that reasoning inside <think> </think>, and then writes the final "
    "answer inside <answer> </answer>, in exactly the layout the User asks for. The answer is read by a "
    "program: only the fenced blocks inside <answer> count, so nothing else goes there."
)


class PromptStyleError(ValueError):
    """A prompt style that cannot be used with this model (e.g. ``chat`` without a chat template)."""


def check_style(style: str) -> str:
    """Return ``style`` unchanged, or raise :class:`PromptStyleError` naming the valid styles."""
    if style not in STYLES:
        raise PromptStyleError(f"unknown prompt style {style!r}; valid styles: {', '.join(STYLES)}")
    return style


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template of its own."""
    return bool(getattr(tokenizer, "chat_template", None))


def check_chat_template(tokenizer: Any, source: str = "the model") -> None:
    """Raise :class:`PromptStyleError` when ``tokenizer`` has no chat template (``prompt_style=chat`` needs one)."""
    if not has_chat_template(tokenizer):
        raise PromptStyleError(
            f"tasks.prompt_style=chat renders prompts with the tokenizer's chat template, but the tokenizer of "
            f"{source} has none (no chat_template in tokenizer_config.json and no chat_template.jinja). "
            "Use tasks.prompt_style=r1 for a base model, or point model.path at an instruct model."
        )


# -- the rules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskRules:
    """Everything a valid task must meet, as the verifier enforces it, and its statement in words.

    ``timeout_s`` and ``memory_mb`` are the sandbox's limits (``verifier.timeout_s``,
    ``verifier.memory_mb``); ``n_inputs`` is the number of inputs a code_f proposal gives.
    """

    limits: TaskLimits = TaskLimits()
    timeout_s: float = 5.0
    memory_mb: int = 512
    n_inputs: int = 10

    def program_rules(self) -> list[str]:
        """The rules of a program (a teacher's code_o/code_i program, a student's code_f answer)."""
        modules = ", ".join(sorted(m for m in ALLOWED_MODULES if m != "__future__"))
        missing = ", ".join(sorted(n for n in FORBIDDEN_NAMES | REMOVED_BUILTINS if not n.startswith("__")))
        dunders = ", ".join(sorted(SAFE_DUNDERS))
        frames = ", ".join(sorted(FRAME_ATTRIBUTES)[:6])
        lim = self.limits
        return [
            "It is Python 3 and defines a function named `f` at the top level: `f` is the entry point that is "
            "called. Helper functions and classes may be defined too (above `f`, or nested inside it).",
            "`f` takes at least one argument and returns a value; `print` does nothing, only the returned "
            "value counts. Called on its input, `f` must return normally: an uncaught exception makes the task "
            "invalid.",
            f"Imports: only these standard-library modules: {modules} "
            "(plus `from __future__ import ...`). Every other module is refused, and so are relative imports, "
            "`from m import *` and importing names that start with an underscore.",
            f"These builtins do not exist for the program: {missing}. `getattr`, `setattr`, `delattr` and "
            "`hasattr` refuse names that start with an underscore.",
            f"No double-underscore attributes except these: {dunders}; no frame, code or generator internals "
            f"({frames}, ...).",
            "Deterministic: called twice on the same input, in separate processes, it returns the same value. "
            "No randomness, no clock, dates or timers, no `id()`, no memory addresses in the result.",
            "No input or output and no side effects: no files, network, processes, threads, signals or "
            "environment variables (such operations are blocked and make the task invalid).",
            f"It finishes within {self.timeout_s:g} seconds and {self.memory_mb} MB of memory for the given input.",
            f"At most {lim.program_chars} characters and {lim.program_tokens} tokens long.",
        ]

    def input_rules(self) -> list[str]:
        """The rules of an input: the argument list of one call ``f(...)``."""
        lim = self.limits
        return [
            "An input is the argument list of one call of `f`, written exactly as it goes between the "
            "parentheses of `f(...)`: Python literals separated by commas, e.g. `'abc', [1, 2], k=3`.",
            "Only literals: numbers, strings (quoted), bytes, True, False, None, and lists, tuples, dicts and "
            "sets of literals. No variable names, operators, comprehensions or calls (`[0] * 3`, `range(5)`, "
            "`x` are refused); keyword arguments are allowed, `*args` and `**kwargs` are not.",
            f"Each input is at most {lim.input_chars} characters and {lim.input_tokens} tokens long.",
        ]

    def output_rules(self) -> list[str]:
        """The rules of the value ``f`` returns (its ``repr`` is the output)."""
        lim = self.limits
        return [
            "The output is `repr` of the returned value, and it must be a Python literal: numbers, strings, "
            "bytes, booleans, None, and lists, tuples, dicts and sets of those. Objects of your own classes, "
            "functions, generators, `inf` and `nan` are refused.",
            f"The output is at most {lim.output_chars} characters and {lim.output_tokens} tokens long.",
        ]

    def message_rules(self) -> list[str]:
        lim = self.limits
        return [
            "The message describes what `f` does in words, as a hint; it must not contain the code.",
            f"The message is at most {lim.message_chars} characters and {lim.message_tokens} tokens long.",
        ]


def _numbered(rules: Sequence[str]) -> str:
    return "\n".join(f"{i}. {rule}" for i, rule in enumerate(rules, start=1))


def _layout(blocks: Sequence[tuple[str, str]], note: str = "") -> str:
    body = "\n".join(block(kind, text) for kind, text in blocks)
    lines = [
        "Answer layout. After your reasoning, close it with </think> and write exactly:",
        f"<answer>\n{body}\n</answer>",
        "with your own content in place of the placeholders. Write nothing after </answer>.",
    ]
    return "\n".join(lines + ([note] if note else []))


def _example(index: int, task: Task) -> str:
    parts = [f"Example {index}:", block("python", task.program), block("input", task.input), block("output", task.output)]
    return "\n".join(parts)


# -- the task text of each family and role ---------------------------------------------------

_HARD = {
    "code_o": (
        "What makes a task hard. The solver sees your program and your input and must predict the exact "
        "output by reasoning alone, without running anything. Reward comes from tasks the solver sometimes "
        "fails but that can be solved: make the output follow from several steps of state the solver has to "
        "track (loops that update several variables, nested data structures, recursion, string and index "
        "manipulation, sorting with custom keys, small dynamic programmes). A task whose output can be read "
        "off the input is too easy; one that needs thousands of steps by hand is not fair. Do not copy the "
        "examples: write a program that is different from each of them."
    ),
    "code_i": (
        "What makes a task hard. The solver sees your program and its output (not your input) and must find "
        "an input for which `f` returns exactly that output; any such input counts. Reward comes from tasks "
        "the solver sometimes fails but that can be solved: make the output depend on the input in a way that "
        "takes reasoning to invert (several transformations, conditions, accumulations), while your own input "
        "shows that a solution exists. A program that returns its input unchanged is too easy. Do not copy the "
        "examples: write a program that is different from each of them."
    ),
    "code_f": (
        "What makes a task hard. The solver sees your message and the first half of the input/output pairs, "
        "and must write a program that also gives the outputs of the second half, which it does not see. "
        "Choose inputs that together pin the behaviour down (different sizes, edge cases, different branches "
        "of the code), spread over both halves, so that a correct understanding of `f` is needed and enough; "
        "the message should help without giving the answer away."
    ),
}


def teacher_user_text(family: str, references: Sequence[Task], rules: TaskRules) -> str:
    """The user turn of a teacher (proposer) prompt in the r1/chat styles.

    code_o / code_i: the ``references`` are shown as examples of valid tasks. code_f: the first
    reference's program is the one the teacher writes ``rules.n_inputs`` inputs for.
    """
    check_family(family)
    if family == "code_f":
        if not references:
            raise ValueError("a code_f teacher prompt needs one reference task whose program the teacher probes")
        n = rules.n_inputs
        if n < 2:
            raise ValueError(f"n_inputs must be at least 2 (half are shown, half hidden), got {n}")
        sections = [
            f"Task: write {n} different inputs for the program below, and a message that hints at what `f` does. "
            f"The solver will get the message and the first {n // 2} inputs with their outputs, and must write a "
            f"program that also reproduces the outputs of the other {n - n // 2}.",
            block("python", references[0].program),
            "Rules for each input (an input that breaks one makes the whole task invalid):\n"
            + _numbered(rules.input_rules() + rules.output_rules()
                        + ["Running the program on the input must finish without an error, within the time and "
                           f"memory limits ({rules.timeout_s:g} seconds, {rules.memory_mb} MB).",
                           f"Exactly {n} inputs, each in its own ```input block, all different."]),
            "Rules for the message:\n" + _numbered(rules.message_rules()),
            _HARD["code_f"],
            _layout([("input", f"<input {i}>") for i in range(1, n + 1)] + [("message", "<message>")],
                    f"That is {n} ```input blocks, then one ```message block."),
        ]
        return "\n\n".join(sections)
    goal = {"code_o": "the output is hard to predict", "code_i": "the input is hard to recover from the output"}[family]
    sections = [
        f"Task: write a new Python program and one input for it, as a test for a solver, so that {goal}. "
        "The system runs your program on your input to get the output.",
        "Rules for the program (a task that breaks any rule is invalid):\n" + _numbered(rules.program_rules()),
        "Rules for the input:\n" + _numbered(rules.input_rules()),
        "Rules for the output:\n" + _numbered(rules.output_rules()),
    ]
    if references:
        sections.append("Examples of valid tasks (each with the output the system computed):\n\n"
                        + "\n\n".join(_example(i, t) for i, t in enumerate(references, start=1)))
    sections += [
        _HARD[family],
        _layout([("python", "<your program, defining f>"), ("input", "<one input: the arguments of f>")],
                "One ```python block with the whole program, then one ```input block."),
    ]
    return "\n\n".join(sections)


def student_user_text(task: Task, rules: TaskRules) -> str:
    """The user turn of a student (solver) prompt in the r1/chat styles."""
    if task.family == "code_o":
        sections = [
            "Task: predict what the program returns for the given input. Work it out by reasoning; you cannot "
            "run code.",
            block("python", task.program),
            block("input", task.input),
            "Give the output as `repr` of the returned value: a Python literal, e.g. strings in quotes, "
            "tuples in parentheses, exactly as Python would print it. Any value equal to the right one counts.",
            _layout([("output", "<the returned value as a Python literal>")]),
        ]
    elif task.family == "code_i":
        sections = [
            "Task: find an input for which the program returns exactly the given output. Any input that "
            "produces it counts.",
            block("python", task.program),
            block("output", task.output),
            "Rules for the input:\n" + _numbered(rules.input_rules()),
            _layout([("input", "<the arguments of f>")]),
        ]
    else:
        shown = task.shown_pairs()
        pairs = "\n".join(f"{block('input', i)}\n{block('output', o)}" for i, o in shown)
        sections = [
            f"Task: write a Python function `f` from a description and {len(shown)} examples. Your program is "
            "judged on further inputs you do not see: it must return their outputs exactly.",
            block("message", task.message),
            f"Examples (input, then the output `f` returns):\n{pairs}",
            "Rules for the program:\n" + _numbered(rules.program_rules()),
            _layout([("python", "<your program, defining f>")]),
        ]
    return "\n\n".join(sections)


# -- rendering --------------------------------------------------------------------------------


class Prompter:
    """Renders teacher and student prompts in one style and counts their tokens.

    ``tokenizer`` is needed for ``chat`` (its chat template) and for :meth:`count_tokens`; the
    engine tokenizes prompts the same way (``add_special_tokens=False``).
    """

    def __init__(self, style: str, rules: TaskRules | None = None, tokenizer: Any = None, source: str = "the model") -> None:
        self.style = check_style(style)
        self.rules = rules or TaskRules()
        self.tokenizer = tokenizer
        if style == "chat":
            if tokenizer is None:
                raise PromptStyleError("tasks.prompt_style=chat needs the model's tokenizer (for its chat template)")
            check_chat_template(tokenizer, source)

    def render(self, user: str) -> str:
        """The full prompt around a user turn (``r1``/``chat``): framing, the task, then ``<think>``."""
        if self.style == "r1":
            return f"{FRAMING}\n\nUser: {user}\nAssistant: {THINK}"
        if self.style == "chat":
            messages = [{"role": "system", "content": FRAMING}, {"role": "user", "content": user}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return text if text.rstrip().endswith(THINK) else text + THINK
        raise PromptStyleError("the compact style has no framing; use teacher() / student()")

    def teacher(self, family: str, references: Sequence[Task]) -> str:
        """The proposer prompt of ``family`` with these ``references`` (code_f: the program to probe first)."""
        if self.style == "compact":
            return teacher_prompt(family, references, n_inputs=self.rules.n_inputs)
        return self.render(teacher_user_text(family, references, self.rules))

    def student(self, task: Task) -> str:
        """The solver prompt of ``task``."""
        if self.style == "compact":
            return student_prompt(task)
        return self.render(student_user_text(task, self.rules))

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as the engine counts a prompt (no special tokens added)."""
        if self.tokenizer is None:
            raise PromptStyleError("counting tokens needs the model's tokenizer")
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def fitted_teacher(self, family: str, references: Sequence[Task], budget: int | None) -> tuple[str, int, int]:
        """The proposer prompt with as many references as fit ``budget`` tokens: (prompt, tokens, references kept).

        The longest references are dropped first (code_o/code_i; code_f keeps its one program). Without
        a budget (or a tokenizer) every reference is kept and tokens is -1. When even the shortest
        prompt is over the budget it is returned as it is, and the engine refuses that one request.
        """
        refs = list(references)
        prompt = self.teacher(family, refs)
        if budget is None or self.tokenizer is None:
            return prompt, -1, len(refs)
        tokens = self.count_tokens(prompt)
        if family == "code_f":
            return prompt, tokens, len(refs)
        while tokens > budget and refs:
            longest = max(range(len(refs)), key=lambda i: len(refs[i].program) + len(refs[i].input) + len(refs[i].output))
            refs.pop(longest)
            prompt = self.teacher(family, refs)
            tokens = self.count_tokens(prompt)
        return prompt, tokens, len(refs)
