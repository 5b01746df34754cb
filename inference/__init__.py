"""Inference engine backends (no Ray here): one engine serves the base and every adapter.

``make_engine`` builds a vLLM or a transformers engine behind the same :class:`Engine` protocol.

The names are handed on lazily (PEP 562): the driver needs only the request types of ``inference.requests``,
while the engines' modules import torch, transformers and peft (~6 s of import time on a 2-core machine, at every start).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {  # name -> the module that holds it
    "AdapterLoadError": "inference.requests",
    "Engine": "inference.base",
    "Generation": "inference.requests",
    "GenerationRequest": "inference.requests",
    "InvalidRequestError": "inference.requests",
    "UnknownAdapterError": "inference.requests",
    "make_engine": "inference.factory",
    "vllm_available": "inference.factory",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'inference' has no attribute {name!r}")
