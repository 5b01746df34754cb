"""The part every backend shares: the ``Engine`` protocol, request checks and the adapter registry.

A backend subclasses :class:`EngineBase` and implements three hooks: ``_generate`` (run checked,
tokenized prompts), ``_install`` (make an adapter version live) and ``_uninstall``. Everything a
caller can get wrong is checked here, before any backend work starts, so one bad request fails
the whole call with a message that names it and nothing is half-generated.

One failure is the request's alone, not the call's: a prompt that does not leave room for its
``max_tokens`` in the context (``len(prompt) + max_tokens > max_model_len``). Such a request gets
``n`` rejected generations (``finish_reason == "rejected"``, the reason in ``error``, no tokens);
the backend never sees it and the rest of the batch runs. The check is made here, before any
backend call, so it holds the same for every backend.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

from inference.adapter_store import AdapterSpec, AdapterStore, read_adapter_spec
from inference.requests import (
    AdapterLoadError,
    Generation,
    GenerationRequest,
    InvalidRequestError,
    UnknownAdapterError,
)

log = logging.getLogger(__name__)


@runtime_checkable
class Engine(Protocol):
    """One inference engine serving the base model and every loaded adapter."""

    backend: str
    max_model_len: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        """For each request, its ``n`` generations, in request order; one batch across adapters."""
        ...

    def load_adapter(self, name: str, path: str | Path, version: int, move: bool = False) -> None:
        """Make version ``version`` of adapter ``name`` (a PEFT directory) live; replaces an older one
        (``move``: the directory is handed over, not copied)."""
        ...

    def remove_adapter(self, name: str) -> None: ...

    def adapters(self) -> dict[str, int]:
        """Loaded adapter names and their live versions."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LoadedAdapter:
    """One live adapter version: its stable integer id (vLLM's ``lora_int_id``) and its own directory."""

    name: str
    version: int
    lora_id: int
    path: Path
    spec: AdapterSpec


@dataclass(frozen=True)
class PreparedRequest:
    """A checked request with its prompt token ids, generation budget and live adapter.

    ``rejected`` is the reason the request cannot run (it does not fit the context), else None.
    """

    request: GenerationRequest
    prompt_ids: list[int]
    max_tokens: int
    adapter: LoadedAdapter | None
    rejected: str | None = None


def sample_seed(seed: int, sample: int) -> int:
    """Seed of sample ``sample`` of a request seeded with ``seed``: ``seed + sample``, vLLM's convention.

    Seeds of different requests should therefore be at least ``n`` apart to keep their samples independent.
    """
    return seed + sample


def rejected_generations(prepared: PreparedRequest) -> list[Generation]:
    """The ``n`` results of a request that could not run: no tokens, ``finish_reason='rejected'``, the reason in ``error``."""
    adapter = prepared.adapter
    return [
        Generation(text="", token_ids=[], logprobs=[], adapter=adapter.name if adapter else None,
                   adapter_version=adapter.version if adapter else None, finish_reason="rejected",
                   error=prepared.rejected)
        for _ in range(prepared.request.n)
    ]


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to (not including) the earliest stop string, and whether one occurred."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class EngineBase:
    """Request checks, tokenization, the adapter registry and call serialization."""

    backend = "base"
    sleep_mode = "off: only vLLM on CUDA has a sleep mode; this engine keeps its memory between phases"
    """How :meth:`sleep` frees memory, or why it does not (the driver says it when the layout is colocated)."""

    def __init__(self, tokenizer: Any, max_model_len: int, max_adapters: int, max_lora_rank: int) -> None:
        if max_adapters < 1:
            raise ValueError(f"max_adapters must be >= 1, got {max_adapters}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_adapters = max_adapters
        self.max_lora_rank = max_lora_rank
        self.store = AdapterStore()
        self._loaded: dict[str, LoadedAdapter] = {}
        self._next_lora_id = 1
        self._lock = threading.RLock()
        self.asleep = False

    # -- public API ---------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        with self._lock:
            self._check_awake("generate")
            prepared = [self._prepare(i, r) for i, r in enumerate(requests)]
            runnable = [p for p in prepared if p.rejected is None]
            outputs = iter(self._generate(runnable) if runnable else [])
            return [rejected_generations(p) if p.rejected is not None else next(outputs) for p in prepared]

    def load_adapter(self, name: str, path: str | Path, version: int, move: bool = False) -> None:
        """Make ``version`` of adapter ``name`` live from the PEFT directory ``path`` (copied into the engine's
        store; ``move``: the caller hands the directory over and it is renamed there instead)."""
        if not isinstance(name, str) or not name or "/" in name:
            raise AdapterLoadError(f"adapter name must be a non-empty string without '/', got {name!r}")
        if not isinstance(version, int) or version < 0:
            raise AdapterLoadError(f"adapter version must be a non-negative integer, got {version!r}")
        source = Path(path)
        spec = read_adapter_spec(source, self.max_lora_rank)
        with self._lock:
            self._check_awake(f"load adapter {name!r}")
            previous = self._loaded.get(name)
            if previous is None and len(self._loaded) >= self.max_adapters:
                raise AdapterLoadError(
                    f"cannot load adapter {name!r}: the engine already serves max_adapters={self.max_adapters} "
                    f"adapters {sorted(self._loaded)}; remove one first"
                )
            lora_id = previous.lora_id if previous else self._next_lora_id
            entry = LoadedAdapter(name, version, lora_id, self.store.publish(name, source, version, move), spec)
            try:
                self._install(entry, previous)
            except Exception:
                self.store.discard(entry.path)
                raise
            if previous is None:
                self._next_lora_id += 1
            else:
                self.store.discard(previous.path)
            self._loaded[name] = entry
            log.debug("%s engine: adapter %s version %d live (id %d)", self.backend, name, version, lora_id)

    def remove_adapter(self, name: str) -> None:
        with self._lock:
            self._check_awake(f"remove adapter {name!r}")
            entry = self._loaded.get(name)
            if entry is None:
                raise UnknownAdapterError(f"cannot remove adapter {name!r}: not loaded (loaded: {sorted(self._loaded)})")
            self._uninstall(entry)
            del self._loaded[name]
            self.store.discard(entry.path)

    def adapters(self) -> dict[str, int]:
        with self._lock:
            return {name: entry.version for name, entry in self._loaded.items()}

    def close(self) -> None:
        self.store.close()

    def sleep(self) -> bool:
        """Free this engine's device memory while the learners of its GPU train (the colocated layout); the
        adapters stay registered. False where the engine has no sleep mode and keeps its memory."""
        with self._lock:
            if self.asleep or not self._sleep():
                return False
            self.asleep = True
            return True

    def wake_up(self) -> bool:
        """Take the memory back (before generating or loading adapters again); False where nothing slept."""
        with self._lock:
            if not self.asleep:
                return False
            self._wake_up()
            self.asleep = False
            return True

    def _check_awake(self, what: str) -> None:
        if self.asleep:
            raise RuntimeError(f"cannot {what}: the {self.backend} engine is asleep (wake_up first)")

    def __enter__(self) -> "EngineBase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- backend hooks ------------------------------------------------------------------------

    def _generate(self, prepared: list[PreparedRequest]) -> list[list[Generation]]:
        raise NotImplementedError

    def _install(self, entry: LoadedAdapter, previous: LoadedAdapter | None) -> None:
        raise NotImplementedError

    def _uninstall(self, entry: LoadedAdapter) -> None:
        raise NotImplementedError

    def _sleep(self) -> bool:
        """Release device memory; False when this engine has no sleep mode (the default)."""
        return False

    def _wake_up(self) -> None:
        raise NotImplementedError

    # -- shared helpers -----------------------------------------------------------------------

    def _prepare(self, index: int, request: GenerationRequest) -> PreparedRequest:
        if not isinstance(request, GenerationRequest):
            raise InvalidRequestError(f"request {index}: expected a GenerationRequest, got {type(request).__name__}")
        try:
            request.check()
        except InvalidRequestError as err:
            raise InvalidRequestError(f"request {index}: {err}") from None
        adapter = None
        if request.adapter is not None:
            adapter = self._loaded.get(request.adapter)
            if adapter is None:
                raise UnknownAdapterError(
                    f"request {index}: unknown adapter {request.adapter!r} (loaded: {sorted(self._loaded)}; "
                    "use adapter=None for the base model)"
                )
        prompt_ids = self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
        if not prompt_ids:
            raise InvalidRequestError(f"request {index}: the prompt tokenizes to no tokens")
        needed = len(prompt_ids) + request.max_tokens
        if needed > self.max_model_len:
            reason = (
                f"request {index} does not fit the context: its prompt is {len(prompt_ids)} tokens and max_tokens="
                f"{request.max_tokens}, {needed} tokens in all, over max_model_len={self.max_model_len}"
            )
            log.warning("%s engine: %s; that request is rejected, the rest of the batch runs", self.backend, reason)
            return PreparedRequest(request, [], 0, adapter, rejected=reason)
        return PreparedRequest(request, list(prompt_ids), request.max_tokens, adapter)
