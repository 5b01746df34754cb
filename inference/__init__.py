"""Inference engine backends (no Ray here): one engine serves the base and every adapter.

``make_engine`` builds a vLLM or a transformers engine behind the same :class:`Engine` protocol.
"""

from inference.base import Engine
from inference.factory import make_engine, vllm_available
from inference.requests import (
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
