"""Validated run configuration: the pydantic schema and the YAML presets beside it."""

from configs.loading import ConfigError, DEFAULT_PRESET, PRESETS_DIR, dump_config, load_config
from configs.schema import Config

__all__ = ["Config", "ConfigError", "DEFAULT_PRESET", "PRESETS_DIR", "dump_config", "load_config"]
