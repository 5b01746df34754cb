"""``python -m verifier prompts``: print example prompts of a style and family, with their token counts.

    python -m verifier prompts --style r1 --family code_i
    python -m verifier prompts --style chat --family code_f --model /models/Qwen2.5-7B-Instruct
    python -m verifier prompts --config configs/qwen2.5-7b-4t4s.yaml --family code_o --role teacher

The rules in the prompts (size limits, time and memory, code_f inputs, references K) are those of
``--config`` (a preset or run config; the built-in defaults without one) and its ``--set`` overrides.
With ``--model`` the prompts are rendered with that model's tokenizer (and chat template for
``chat``) and each is followed by its token count and the budget ``max_seq_len - max_tokens``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from configs.model_dir import model_dir_argument
from verifier.prompt_styles import STYLES, Prompter, PromptStyleError, TaskRules
from verifier.task_limits import TaskLimits
from verifier.tasks import FAMILIES, Task, identity_task

EXAMPLE_PROGRAMS = (
    "def f(xs, k):\n    return sorted(xs)[:k]",
    "def f(s):\n    counts = {}\n    for c in s:\n        counts[c] = counts.get(c, 0) + 1\n"
    "    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))",
    "from functools import lru_cache\n\ndef f(n):\n    @lru_cache(maxsize=None)\n    def ways(m):\n"
    "        return 1 if m <= 1 else ways(m - 1) + ways(m - 2)\n    return ways(n)",
)
EXAMPLE_CALLS = (("[3, 1, 2], 2", "[1, 2]"), ("'banana'", "[('a', 3), ('n', 2), ('b', 1)]"), ("10", "89"))


def example_references(k: int) -> list[Task]:
    """The identity seed and up to ``k - 1`` small example tasks, as a step's references would be."""
    tasks = [identity_task("code_o")]
    tasks += [Task("code_o", p, [i], [o]) for p, (i, o) in zip(EXAMPLE_PROGRAMS, EXAMPLE_CALLS)]
    return (tasks * (k // len(tasks) + 1))[:k]


def example_task(family: str, n_inputs: int) -> Task:
    """A valid task of ``family`` for the student prompt (code_f: ``n_inputs`` pairs of sorted-prefix)."""
    if family != "code_f":
        return Task(family, EXAMPLE_PROGRAMS[1], [EXAMPLE_CALLS[1][0]], [EXAMPLE_CALLS[1][1]])
    inputs = [f"{list(range(i + 3, 0, -1))}, {1 + i % 3}" for i in range(n_inputs)]
    outputs = [repr(sorted(range(1, i + 4))[: 1 + i % 3]) for i in range(n_inputs)]
    return Task("code_f", EXAMPLE_PROGRAMS[0], inputs, outputs, "returns the k smallest numbers, smallest first")


def add_command(sub: Any) -> None:
    """Add the ``prompts`` subcommand to the ``python -m verifier`` parser's subparsers."""
    cmd = sub.add_parser("prompts", help="print example prompts of a style and family, with token counts",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.add_argument("--style", choices=STYLES, help="prompt style (default: the config's tasks.prompt_style)")
    cmd.add_argument("--family", choices=FAMILIES, action="append", help="task family (repeatable; default: all)")
    cmd.add_argument("--role", choices=("teacher", "student", "both"), default="both")
    cmd.add_argument("--model", type=model_dir_argument, help="local model directory: render with its tokenizer and count tokens")
    cmd.add_argument("--config", type=Path, help="a preset or config YAML whose tasks/verifier settings the rules use")
    cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="config override, e.g. tasks.references_k=6 (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Print the prompts ``args`` asks for; returns the exit code."""
    from configs.loading import load_config  # the run's settings; imported here to keep the verifier light

    from configs.loading import ConfigError

    try:
        config = load_config(args.config, list(args.overrides))
    except ConfigError as err:
        print(f"error: {err}")
        return 2
    style = args.style or config.tasks.prompt_style
    tokenizer = None
    if args.model is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    elif style == "chat":
        print("error: --style chat renders with the model's chat template; pass --model DIR")
        return 2
    limits = TaskLimits.from_config(config.tasks, config.verifier.max_output_chars)
    rules = TaskRules(limits, config.verifier.timeout_s, config.verifier.memory_mb, config.tasks.code_f_inputs)
    try:
        prompter = Prompter(style, rules, tokenizer, source=str(args.model))
    except PromptStyleError as err:
        print(f"error: {err}")
        return 2
    budget = config.model.max_seq_len - config.inference.max_tokens
    refs = example_references(max(1, config.tasks.references_k))
    shown = []
    for family in args.family or FAMILIES:
        if args.role in ("teacher", "both"):
            shown.append((f"{style} teacher prompt, {family} ({len(refs) if family != 'code_f' else 1} reference(s))",
                          prompter.teacher(family, refs)))
        if args.role in ("student", "both"):
            shown.append((f"{style} student prompt, {family}", prompter.student(example_task(family, rules.n_inputs))))
    for title, prompt in shown:
        print(f"===== {title} =====")
        print(prompt)
        if tokenizer is not None:
            tokens = prompter.count_tokens(prompt)
            verdict = "fits" if tokens <= budget else "OVER the budget: references would be trimmed / the task refused"
            print(f"----- {tokens} tokens; budget {budget} (model.max_seq_len {config.model.max_seq_len} - "
                  f"inference.max_tokens {config.inference.max_tokens}): {verdict}")
        else:
            print(f"----- {len(prompt)} characters (pass --model DIR for token counts)")
        print()
    return 0
