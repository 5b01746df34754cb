"""The inference engines a config may name, one traits record each: what the planners need to know of an engine.
Pure data (no pydantic, no torch): the schema validates ``inference.backend`` against it, the planners read the
traits instead of naming a backend, and ``inference.factory`` builds the engine of each name.

Adding a backend is one entry here plus its class in ``inference/`` (and its branch in ``inference.factory``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineTraits:
    """What an inference engine does, as the memory, time and placement plans see it."""

    name: str
    label: str  # how plans and notes name it
    budgeted_memory: bool  # takes a fixed fraction of its GPU (vLLM's gpu_memory_utilization) and fits its KV cache
    # in the rest; otherwise everything it holds is counted as resident (its own weights, its batch's KV cache)
    sleep_mode: bool  # can free its GPU memory while the learners on its GPU train (the colocated layout)
    prefix_cache: bool  # computes a prompt's prefill once for its n samples (the time plan's prefill work)
    tensor_parallel: bool  # one replica can span several GPUs (resources.tensor_parallel_size > 1)
    own_time_constants: bool  # the time plan has measured rates for it; otherwise it borrows vLLM's (a lower bound)
    paged_kv_cache: bool = False  # allocates KV cache in blocks as tokens are generated (vLLM's PagedAttention): its
    # concurrency is what the expected lengths fill, not max_model_len per sequence; otherwise its batch decodes at once


ENGINES: dict[str, EngineTraits] = {
    "vllm": EngineTraits("vllm", "vLLM engine", budgeted_memory=True, sleep_mode=True, prefix_cache=True,
                         tensor_parallel=True, own_time_constants=True, paged_kv_cache=True),
    "hf": EngineTraits("hf", "transformers engine", budgeted_memory=False, sleep_mode=False, prefix_cache=False,
                       tensor_parallel=False, own_time_constants=False),
}
"""Every engine by the name ``inference.backend`` takes (besides ``auto``)."""
AUTO_ON_GPUS, AUTO_ON_CPU = "vllm", "hf"
"""What ``inference.backend: auto`` plans: vLLM on GPUs, the transformers engine on CPU (faster there)."""


def engine_traits(name: str) -> EngineTraits:
    """The traits of a registered engine; a ``ValueError`` listing the registered names otherwise."""
    if name not in ENGINES:
        raise ValueError(f"unknown inference backend {name!r}; registered: auto, {', '.join(sorted(ENGINES))}")
    return ENGINES[name]


def planned_engine(backend: str, on_gpus: bool) -> EngineTraits:
    """The engine a plan assumes for ``inference.backend``: the one named, or with ``auto`` vLLM on GPUs and the
    transformers engine on CPU."""
    return engine_traits((AUTO_ON_GPUS if on_gpus else AUTO_ON_CPU) if backend == "auto" else backend)
