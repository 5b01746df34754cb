"""How a step words its prompts and bounds its tasks (:class:`StepPrompts`): the prompt style
(``tasks.prompt_style``), the model's tokenizer, the task size limits and the context budget; built once before the
actors start (a ``chat`` style on a model without a chat template fails there)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.schema import Config
from verifier.prompt_styles import Prompter, PromptStyleError, TaskRules
from verifier.task_limits import TaskLimits


@dataclass
class StepPrompts:
    """How a step words its prompts and bounds its tasks.

    ``prompter`` renders the style; its tokenizer (when present) counts tokens for the budget and
    the token limits. ``budget`` = ``max_seq_len - max_tokens`` is the most tokens a prompt may
    have so that prompt + ``max_tokens`` fits the context.
    """

    prompter: Prompter
    limits: TaskLimits
    max_seq_len: int
    max_tokens: int

    @classmethod
    def from_config(cls, config: Config, model_path: str | Path | None = None, tokenizer: Any = None) -> "StepPrompts":
        """Build from ``config``, loading the tokenizer of ``model_path`` unless one is given.

        Raises :class:`PromptStyleError` for a ``chat`` style on a model without a chat template and
        ``ValueError`` when ``inference.max_tokens`` leaves no room for a prompt in ``model.max_seq_len``.
        """
        if config.inference.max_tokens >= config.model.max_seq_len:
            raise ValueError(
                f"inference.max_tokens={config.inference.max_tokens} leaves no room for a prompt in "
                f"model.max_seq_len={config.model.max_seq_len}; lower max_tokens or raise max_seq_len"
            )
        if tokenizer is None and model_path is not None:
            tokenizer = load_tokenizer(model_path)
        limits = TaskLimits.from_config(config.tasks, config.verifier.max_output_chars)
        rules = TaskRules(limits, config.verifier.timeout_s, config.verifier.memory_mb, config.tasks.code_f_inputs)
        prompter = Prompter(config.tasks.prompt_style, rules, tokenizer, source=str(model_path or "the model"))
        return cls(prompter, limits, config.model.max_seq_len, config.inference.max_tokens)

    @property
    def budget(self) -> int:
        return self.max_seq_len - self.max_tokens

    def count_tokens(self, text: str) -> int | None:
        """Tokens of ``text`` as the engine counts them, or None without a tokenizer."""
        return self.prompter.count_tokens(text) if self.prompter.tokenizer is not None else None

    @property
    def token_counter(self) -> Any:
        """``count_tokens`` when a tokenizer is present, else None (limits are then in characters only)."""
        return self.prompter.count_tokens if self.prompter.tokenizer is not None else None


def load_tokenizer(model_path: str | Path) -> Any:
    """The model's tokenizer (what the engine tokenizes prompts with), from its local directory."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_path))
    except (OSError, ValueError) as err:
        raise PromptStyleError(f"cannot load the tokenizer of {model_path}: {err}") from err
