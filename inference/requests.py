"""What a caller asks an inference engine for, and what it gets back.

Both backends (vLLM and transformers) take and return exactly these types, so the rollout code,
the Ray actor shell and the tests never see which backend ran.

Log-probability convention: ``Generation.logprobs[t]`` is log mu(token_t | prefix), the log-probability
of the token under the distribution it was sampled from: softmax(z / T) at the request's temperature T,
restricted to the top-p nucleus and renormalised over it (``inference.sampling``; vLLM's
``processed_logprobs``). Greedy requests (temperature 0) get 0 = log 1. This is the behaviour policy of an
importance-corrected update; the learner's own log pi_T = log_softmax(z / T) equals it when top_p = 1 and
the adapter versions agree, and is lower by the log of the nucleus mass when top_p < 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "rejected"]


class InvalidRequestError(ValueError):
    """A request that no backend can serve (empty prompt, bad sampling settings, over-long prompt)."""


class UnknownAdapterError(InvalidRequestError):
    """A request or removal names an adapter that is not loaded."""


class AdapterLoadError(ValueError):
    """An adapter directory that cannot be loaded (missing files, rank too large, too many adapters)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt for one adapter (``adapter=None`` is the frozen base) with its sampling settings.

    ``temperature=0`` is greedy decoding. ``n`` independent samples are drawn; with ``seed`` set the
    samples are reproducible (sample j uses a generator derived from ``(seed, j)``).
    The prompt's tokens plus ``max_tokens`` must fit the engine's context window (``max_model_len``);
    a request that does not is rejected on its own (see :class:`Generation`), the rest of its batch runs.
    """

    adapter: str | None
    prompt: str
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None

    def check(self) -> None:
        """Raise :class:`InvalidRequestError` naming the first bad field."""
        if not isinstance(self.prompt, str) or not self.prompt:
            raise InvalidRequestError("prompt must be a non-empty string")
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter):
            raise InvalidRequestError(f"adapter must be None (the base) or a non-empty name, got {self.adapter!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidRequestError(f"n must be a positive integer, got {self.n!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidRequestError(f"seed must be None or a non-negative integer, got {self.seed!r}")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop must be a list of non-empty strings, got {self.stop!r}")


@dataclass(frozen=True)
class Generation:
    """One sampled completion.

    ``token_ids`` are every sampled token, including an end-of-sequence token and the tokens that
    complete a stop string; ``logprobs`` has one entry per token id (see the module docstring).
    ``text`` is the decoded completion without special tokens, cut just before the first stop
    string. ``adapter_version`` is the version of the adapter weights that produced it (``None``
    for the base). ``finish_reason`` is ``"stop"`` (EOS or stop string), ``"length"`` (``max_tokens``
    reached) or ``"rejected"``: the request did not fit the context and nothing was generated;
    ``error`` says why (None otherwise). ``prompt_token_ids`` is how the engine tokenized the prompt,
    so the learner scores exactly ``prompt_token_ids + token_ids`` (empty for a rejected request).
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    adapter: str | None
    adapter_version: int | None
    finish_reason: FinishReason
    prompt_token_ids: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def rejected(self) -> bool:
        """True when the request could not run (see ``error``)."""
        return self.finish_reason == "rejected"
