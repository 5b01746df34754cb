"""Load a YAML preset, apply ``dotted.key=value`` overrides, expand ``${VAR}``, validate.

Every failure is a :class:`ConfigError` whose message names the offending key and, for an unknown
key, lists the valid keys of that section, so a typo is caught before any actor starts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from configs.schema import Config

PRESETS_DIR = Path(__file__).resolve().parent
DEFAULT_PRESET = PRESETS_DIR / "tiny.yaml"
_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which key and why."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and a YAML-typed value (``3`` -> int, ``[x, y]`` -> list)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    path = key.strip().split(".")
    if any(not part for part in path):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 as a string
            try:
                value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
            except ValueError:
                pass
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: value {raw!r} is not valid YAML ({exc})") from exc
    return path, value


def override_value(value: Any) -> str:
    """``value`` as the text after ``=`` of an override that ``parse_override`` reads back as ``value``."""
    if isinstance(value, str):
        try:
            if parse_override(f"k={value}")[1] == value:
                return value
        except ConfigError:
            pass
    return json.dumps(value)  # JSON is YAML: lists, maps, numbers, booleans, null and quoted strings read back


def dotted_settings(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Every setting of a configuration tree as ``{dotted.key: value}``, each pair an override launch.py accepts
    (``key=value``: ``override_value``); a section with no keys is one entry (``{}``)."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(dotted_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = override_value(value)
    return out


def apply_override(tree: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``tree[path[0]]...[path[-1]] = value``, creating missing dicts (validation judges them)."""
    node = tree
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {'.'.join(path[: i + 1])} is a value, not a section")
        node = child
    node[path[-1]] = value


def expand_env(value: Any) -> Any:
    """Replace ``${VAR}`` in strings with the environment's value; unset variables stay as written."""
    if isinstance(value, str):
        return _ENV_VAR.sub(lambda m: os.environ.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    return value


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the field at ``loc`` (for listing its valid keys)."""
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return None
    return model


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem, each naming its dotted key; unknown keys list the valid ones."""
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not str(p).startswith("function-after"))
        key = ".".join(str(p) for p in loc) or "(config)"
        if err["type"] == "extra_forbidden":
            section = _section_at(loc)
            valid = ", ".join(section.model_fields) if section else "?"
            lines.append(f"unknown key '{key}'; valid keys here: {valid}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {msg} (got {err.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path`` (default ``configs/tiny.yaml``), apply overrides, validate into a :class:`Config`."""
    path = Path(path) if path is not None else DEFAULT_PRESET
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, not {type(tree).__name__}")
    for text in overrides:
        apply_override(tree, *parse_override(text))
    try:
        return Config.model_validate(expand_env(tree))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def dump_config(config: Config) -> str:
    """The resolved configuration as YAML (what a run directory stores as config.yaml)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
