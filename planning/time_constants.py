"""The constants of the time plan, each with its source: a named bench of ours or a public figure.

One place for every rate the time plan (``planning.time_plan``) multiplies by. Each value is a
:class:`Sourced`: the number, where it comes from, and whether we measured it (``measured=True``: a bench of
ours, run separately from any run the plan is checked against) or cite it (a public figure). Every value can
be overridden from the config (``plan.constants``, keys ``<kind>.<name>`` or ``host.<name>``), for example
``plan.constants={"H100.train_mfu": 0.3}`` after measuring your own node with ``bench/learner.py``.

FLOP conventions (used by every MFU here): a token trained costs ``4 N`` (forward ``2 N`` and backward through
the frozen weights ``2 N``) plus ``6 N_lora``, ``+2 N`` when the layers are recomputed (activation
checkpointing) and ``+2 N`` per extra no-grad pass (KL reference, old policy); a token prefilled or decoded
costs ``2 N``. N is the base's parameter count. Attention's quadratic term is not counted (under 10% at 8k
tokens for a 7B model).

The CPU kind describes this project's test machine running the built-in tiny model: its "peak" is the
effective rate ``planning/measurements.py`` measured (so its MFUs are 1 or a measured fraction of it), which
holds for the tiny default's shapes, not for a 7B model on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Sourced:
    """A constant and its source."""

    value: float
    source: str
    measured: bool = False

    def __str__(self) -> str:
        return f"{self.value:g} ({'measured: ' if self.measured else 'cited: '}{self.source})"


@dataclass(frozen=True)
class DeviceKind:
    """The rates of one accelerator kind (None where nobody has measured or published one)."""

    name: str
    memory_gib: float
    peak_flops: Sourced | None = None  # dense bf16 FLOP/s
    memory_bandwidth: Sourced | None = None  # bytes/s of device memory: one decode step reads every weight once
    train_mfu: Sourced | None = None  # model FLOPs per second trained / peak (recompute counted, see module docstring)
    prefill_mfu: Sourced | None = None
    decode_mfu: Sourced | None = None  # aggregate decode at full batch, without adapters
    lora_decode_overhead: Sourced | None = None  # fraction of decode throughput lost to multi-LoRA
    sleep_wake_s: Sourced | None = None  # vLLM sleep(level 1) + wake_up of a 7B engine with LoRA (colocated layouts)

    def missing(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if getattr(self, n) is None]


@dataclass(frozen=True)
class HostConstants:
    """Rates off the accelerator: the verifier sandbox, the object store, disks, the league, evolution."""

    verifier_tasks_per_core_s: Sourced
    adapter_load_bandwidth: Sourced  # bytes/s from a learner to each engine replica (export, object store, load)
    adapter_swap_s: Sourced  # fixed cost of one in-place adapter swap in an engine replica
    checkpoint_bandwidth: Sourced  # bytes/s written to the run directory
    league_s: Sourced  # match + record of one step
    evolution_s_per_mparam: Sourced  # seconds per million adapter parameters of one child (thin SVD route)
    evolution_s_floor: Sourced  # fixed cost of one child whatever its size


H100 = DeviceKind(
    name="H100",
    memory_gib=80.0,
    peak_flops=Sourced(989e12, "NVIDIA H100 SXM datasheet, dense bf16 (prime-rl's perf.py uses the same)"),
    memory_bandwidth=Sourced(3.35e12, "NVIDIA H100 SXM datasheet, HBM3"),
    train_mfu=Sourced(0.395, "bench/learner.py on one H100, 2026-11-25: 8,550 tokens/s at Qwen2.5-7B's shape, "
                              "8 adapters rank 64, checkpointing on (6 N per token)", measured=True),
    prefill_mfu=Sourced(0.395, "assumed equal to the measured training MFU (the same forward kernels, no backward); "
                                "not measured"),
    decode_mfu=Sourced(0.097, "6,300 output tokens/s for a 7B model on one H100, bf16, offline batch (HF blog 'Keep the "
                               "Tokens Flowing', citing a DatabaseMart benchmark): 2 N x 6,300 / peak"),
    lora_decode_overhead=Sourced(0.34, "vLLM PR #11267: Llama-2-7B on an A100, 2,694 -> 1,788 output tokens/s with "
                                        "rank-8 adapters (V0 engine)"),
    sleep_wake_s=Sourced(12.8, "vLLM PR #48337 (comment of 2026-07-15): Qwen3-8B with LoRA on an A100, sleep level 1 "
                                "10.57 s (the weights copied to pinned host memory) + wake 2.19 s; the host copy, not "
                                "the GPU, sets it"),
)
H200 = DeviceKind(
    name="H200",
    memory_gib=139.8,  # torch.cuda.get_device_properties(0).total_memory of an H200 (tests/fixtures/memory_measured.json);
    # the datasheet's 141 GB HBM3e
    peak_flops=Sourced(989e12, "NVIDIA H200 SXM datasheet, dense bf16 (1,979 TFLOPS with sparsity): the H100 SXM's peak"),
    memory_bandwidth=Sourced(4.8e12, "NVIDIA H200 SXM datasheet, 141 GB HBM3e at 4.8 TB/s"),
    train_mfu=Sourced(0.369, "planning/calibrate.py on one H200, 2026-11-28, at the 7B preset's shapes (Qwen2.5-7B's "
                              "widths, 28 layers, 4 adapters of rank 64, 16 sequences of 512 + 1,024 tokens, "
                              "checkpointing): 9,076 tokens/s; bench/learner.py's 8 x 4,096 tokens ran at 9,610 tokens/s "
                              "there (the H100's 8,550)", measured=True),
    prefill_mfu=Sourced(H100.prefill_mfu.value, "assumed equal to the H100's (itself assumed equal to its training MFU); "
                                                "not measured on an H200"),
    decode_mfu=Sourced(H100.decode_mfu.value, "assumed equal to the H100's cited figure (6,300 output tokens/s, 7B); not "
                                              "measured on an H200, whose 1.43x memory bandwidth likely decodes faster"),
    lora_decode_overhead=Sourced(H100.lora_decode_overhead.value, "assumed equal to the H100's (cited: vLLM PR #11267, "
                                                                  "an A100); not measured on an H200"),
    sleep_wake_s=Sourced(H100.sleep_wake_s.value, "assumed equal to the H100's (cited: vLLM PR #48337, an A100; the copy "
                                                  "to pinned host memory, not the GPU, sets it)"),
)
A100 = DeviceKind(
    name="A100",
    memory_gib=80.0,
    peak_flops=Sourced(312e12, "NVIDIA A100 datasheet, dense bf16"),
    memory_bandwidth=Sourced(2.04e12, "NVIDIA A100 80GB SXM datasheet, HBM2e"),
    lora_decode_overhead=H100.lora_decode_overhead,
    sleep_wake_s=H100.sleep_wake_s,
)
CPU = DeviceKind(
    name="cpu",
    memory_gib=24.0,
    peak_flops=Sourced(1.871e10, "planning/measurements.py on this project's 2-core test machine, 2026-11-25: training "
                                "FLOP/s of one tiny-default learner on one thread (effective peak: train_mfu is 1)",
                       measured=True),
    memory_bandwidth=Sourced(9.94e8, "planning/measurements.py, same machine: tiny model weight bytes / one-row decode step "
                                    "of the transformers engine (effective: a step's fixed cost)", measured=True),
    train_mfu=Sourced(1.0, "by definition of the CPU kind's effective peak", measured=True),
    prefill_mfu=Sourced(1.41, "planning/measurements.py, same machine: prefill FLOP/s / the effective peak", measured=True),
    decode_mfu=Sourced(0.594, "planning/measurements.py, same machine: decode FLOP/s per added row / the effective peak",
                       measured=True),
    lora_decode_overhead=Sourced(0.0, "planning/measurements.py measures with the adapters on (already in decode_mfu)",
                                 measured=True),
)
DEVICE_KINDS: dict[str, DeviceKind] = {k.name: k for k in (H100, H200, A100, CPU)}

HOST = HostConstants(
    verifier_tasks_per_core_s=Sourced(205.0, "bench/sandbox.py on the 2-core test machine, 2026-11: ~410 tasks/s on two "
                                             "cores, each task run twice (docs/verifier.md)", measured=True),
    adapter_load_bandwidth=Sourced(4.0e8, "bench/adapter_transport.py on the 2-core test machine (docs/system.md): eight "
                                          "7B-shaped rank-64 versions of 2 layers (184.6 MB) to 2 replicas in 0.92 s; "
                                          "replicas load in parallel on a node with cores to spare", measured=True),
    adapter_swap_s=Sourced(0.006, "bench/adapter_transport.py (docs/system.md): the tiny default's four members "
                                  "published in 24 ms", measured=True),
    checkpoint_bandwidth=Sourced(3.62e8, "planning/measurements.py on the test machine: checkpoint bytes / seconds", measured=True),
    league_s=Sourced(0.0024, "planning/measurements.py: the pure league's match + record of a 2+2 step (Ray round trips "
                               "not counted)", measured=True),
    evolution_s_per_mparam=Sourced(0.75 / 161.5, "bench/operators.py on the H100 host, 2026-11-25: slowest operator "
                                                 "(dare) 0.75 s per 7B rank-64 child (161.5 M parameters)", measured=True),
    evolution_s_floor=Sourced(0.0147, "planning/measurements.py on the test machine: the median operator's child of the "
                                        "tiny default's size", measured=True),
)


class ConstantsError(ValueError):
    """An override names no constant, or gives a value that is not a number."""


def with_overrides(kinds: dict[str, DeviceKind], host: HostConstants, overrides: dict[str, Any],
                   source: str = "set in the config (plan.constants)") -> tuple[dict[str, DeviceKind], HostConstants]:
    """Apply ``plan.constants`` (``{"H100.train_mfu": 0.3, "host.league_s": 0.1}``): each a measured value of the user,
    ``source`` where it comes from (a constants file of ``planning/calibrate.py``: ``planning.constants_file``)."""
    kinds = dict(kinds)
    for key, value in overrides.items():
        scope, _, name = key.partition(".")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConstantsError(f"plan.constants.{key}: {value!r} is not a number") from None
        sourced = Sourced(number, source, measured=True)
        if scope == "host":
            if name not in {f.name for f in fields(HostConstants)}:
                raise ConstantsError(f"plan.constants.{key}: no host constant {name!r}; known: "
                                     f"{', '.join(f.name for f in fields(HostConstants))}")
            host = replace(host, **{name: sourced})
            continue
        kind = kinds.get(scope) or DeviceKind(name=scope, memory_gib=80.0)
        known = [f.name for f in fields(DeviceKind) if f.name not in ("name", "memory_gib")]
        if name not in known and name != "memory_gib":
            raise ConstantsError(f"plan.constants.{key}: no device constant {name!r}; known: {', '.join(known)}")
        kinds[scope] = replace(kind, **{name: number if name == "memory_gib" else sourced})
    return kinds, host
