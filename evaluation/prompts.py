"""Benchmark prompts and what is taken from an answer.

A benchmark prompt is its own template (not a self-play task prompt); the two styles are those of
``verifier.prompt_styles``: ``r1`` for base models (the R1 conversation layout, reasoning in
``<think>``, the answer in ``<answer>``, ending in ``Assistant: <think>``) and ``chat`` for chat
models (the tokenizer's chat template, checked by ``prompt_styles.check_chat_template``). Math asks
for the final answer in ``\\boxed{}`` inside ``<answer>``. Code (``code_for``) is evalplus's
sanitised answer for HumanEval+ / MBPP+, else the last fenced block of the answer (inside the last
``<answer>`` when there is one).
"""

from __future__ import annotations

import re
from typing import Any

from evaluation.datasets import CodeProblem, MathProblem, Problem
from evaluation.sanitize import sanitize
from verifier.prompt_styles import THINK, check_chat_template

FRAMING = (
    "A conversation between a User and an Assistant. The User gives a problem. The Assistant first thinks "
    "it through step by step inside <think> </think>, and then writes the final answer inside "
    "<answer> </answer>."
)
FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)


def user_text(problem: Problem) -> str:
    """The user turn for one problem."""
    if isinstance(problem, MathProblem):
        return f"{problem.question.strip()}\n\nPut the final answer in \\boxed{{}} inside <answer> </answer>."
    p: CodeProblem = problem
    if p.layout == "livecodebench":
        if p.func_name:
            how = f"Complete this starter code and return the answer from the method:\n```python\n{p.starter_code.strip()}\n```"
        else:
            how = "Read the input from standard input and print the answer to standard output."
        return f"{p.prompt.strip()}\n\n{how}\nWrite your Python solution in one ```python fenced block."
    if p.prefix:  # HumanEval: a signature and docstring to complete
        return (f"Complete the following Python function.\n```python\n{p.prompt.rstrip()}\n```\n"
                "Write the whole function (with any imports it needs) in one ```python fenced block.")
    return f"{p.prompt.strip()}\n\nWrite the Python function in one ```python fenced block."


def render(style: str, user: str, tokenizer: Any = None) -> str:
    """The full prompt in ``style`` (``r1`` or ``chat``)."""
    if style == "r1":
        return f"{FRAMING}\n\nUser: {user}\nAssistant: {THINK}"
    if style == "chat":
        check_chat_template(tokenizer, "the evaluated model")
        messages = [{"role": "system", "content": FRAMING}, {"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    raise ValueError(f"unknown benchmark prompt style {style!r}; use 'r1' or 'chat'")


def answer_region(response: str) -> str:
    """The text inside the last ``<answer>`` (to its end when unclosed), else the whole response."""
    answers = ANSWER.findall(response)
    return answers[-1] if answers else response


def code_for(problem: CodeProblem, response: str) -> str | None:
    """The code judged for ``problem``: evalplus-layout tasks get evalplus's sanitiser on the answer
    (``evaluation.sanitize``: longest parseable window, then what the entry point reaches); the
    other layouts the last fenced block (LiveCodeBench's rule)."""
    if problem.layout == "evalplus":
        code = sanitize(answer_region(response), problem.entry_point)
        return code if code.strip() else None
    return extract_code(response)


def extract_code(response: str) -> str | None:
    """The last fenced block of the answer (inside the last ``<answer>`` if any), else None."""
    answers = ANSWER.findall(response)
    for text in ([answers[-1]] if answers else []) + [response]:
        blocks = FENCE.findall(text)
        if blocks:
            return blocks[-1]
    return None
