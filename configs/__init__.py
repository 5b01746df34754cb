"""Validated run configuration: the pydantic schema and the YAML presets beside it.

The lowest layer (README, Layout): it imports nothing else of this project. The names below load the schema
on first use, so the pydantic-free modules beside it (``configs.defences``, ``configs.operators``: the names
and ranges the schema checks) import without pydantic, for the verifier and the evolution operators.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "Config": "configs.schema",
    "ConfigError": "configs.loading",
    "DEFAULT_PRESET": "configs.loading",
    "PRESETS_DIR": "configs.loading",
    "dump_config": "configs.loading",
    "load_config": "configs.loading",
}

__all__ = ["Config", "ConfigError", "DEFAULT_PRESET", "PRESETS_DIR", "dump_config", "load_config"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'configs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
