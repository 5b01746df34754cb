"""Inference engine backends (no Ray here): one engine serves the base and every adapter.

``make_engine`` builds a vLLM or a transformers engine behind the same :class:`Engine` protocol.
"""

from actors.engines.base import Engine
from actors.engines.factory import make_engine, vllm_available
from actors.engines.requests import (
    AdapterLoadError,
    Generation,
    GenerationRequest,
    InvalidRequestError,
    UnknownAdapterError,
)

__all__ = [
    "AdapterLoadError",
    "Engine",
    "Generation",
    "GenerationRequest",
    "InvalidRequestError",
    "UnknownAdapterError",
    "make_engine",
    "vllm_available",
]
