"""The memory plan: predicted peak bytes of every actor on every device, from the config and ``config.json`` alone.

Pure arithmetic (no Ray, no torch, no weights): ``launch.py --dry-run`` prints it and a real launch refuses
a plan that does not fit before any actor starts. It lives beside ``planning/placement.py`` because it is the
same kind of decision one level down: placement says which actor sits on which GPU, this says whether
the bytes of those actors fit there. ``bench/memory_plan.py`` checks the learner's predictions against
measured peaks at Qwen2.5-7B's widths; ``docs/memory.md`` has the arithmetic for the 7B preset.

Notation: h hidden size, f intermediate size, H attention heads, d head dim, kv = kv_heads x d, V vocabulary,
L decoder layers, r LoRA rank, b bytes per element of the base dtype, N tokens of a micro-batch, c logit
chunk tokens (N when unchunked), T the longest row (``model.max_seq_len``).

**Learner, per GPU** (the base is held once per learner GPU and mapped by both learners; per learner):

- adapter training state ``16 P`` bytes per owned adapter: float32 master weights, gradients and AdamW's two
  moments (4 x 4 B), P = L x r x sum over target modules of (d_in + d_out);
- activations saved for backward, per token and decoder layer (:func:`layer_saved_bytes`), read off the
  learner's autograd graph (``tests/test_memory_plan.py`` counts them with saved-tensor hooks)::

      2 (4h + 4)                       RMSNorm x2: float32 copy of the input + its rsqrt
      b h [q|k|v] + b h [gate|up]      the LoRA branch's inputs (the norm outputs, one per group)
      b f [down]                       the LoRA input of down_proj (act(gate) * up)
      b r x (target modules)           the LoRA A-projection of each module
      b (h + 2 kv') + b h + 4 H        attention: q, k, v (kv' = h: repeated to every head when a padding
                                       mask is passed), the output (also o_proj's input), log-sum-exp
      3 b f                            MLP: gate output, act(gate), up output
      b T                              the padding mask in the attention's dtype, its row of T keys
                                       (SDPA converts the boolean mask per layer and keeps it)

  plus, once per layer and micro-batch, the base-dtype casts of the present adapters' factors
  (``b P / L`` per adapter; none for a float32 base) and, once per micro-batch, the boolean padding mask
  (``N T`` bytes: rows of T tokens, each T x T) and the final norm (4h + 4 per token);
- with activation checkpointing only each layer's input (``b h`` per token and layer) is kept, and one
  layer's activations are alive again while it is recomputed in backward;
- the backward workspace of one layer, ``8 h N`` (float32 norm gradients). The f-wide gradients of the MLP
  are not added: autograd frees each saved tensor once its node has run (and non-reentrant checkpointing
  frees each recomputed tensor once it is used), so they take the place of what they free;
- the logits: per loss token ``V (2 b + 12)`` bytes (the head's output and its gradient in the base dtype, the
  float32 copy kept for backward, the float32 exp temporary and gradient of log-softmax; +4 V with the
  entropy term) for c tokens when chunked, for every loss token (N) when not;
- the no-grad old-policy / reference passes: one layer's forward intermediates ``N (3 b f + 4 b h)`` and one
  chunk of logits (they run before the policy pass, so they count only when larger).

**The peak is the larger of two moments of backward**, with G = 4 P x slots the float32 LoRA gradients:

- the logits' backward: every layer's kept bytes (all activations, or only the layer inputs when
  checkpointed), the mask and final norm, plus one chunk of logits;
- a decoder layer's backward: the inputs of the layers below it and the gradients of the layers above it,
  plus that layer's backward (its recompute too when checkpointed). Both are linear in the layer's depth,
  so the larger end is taken: ``max(unit + G, L unit + G / L)``, ``unit`` one layer's kept bytes.

During a training step gradients accumulate over micro-batches, so from the second micro-batch on G is
alive at both moments (``LearnerShape.accumulating``, the plan's default: a step has many micro-batches).
A one-micro-batch step (``accumulating=False``, what ``bench/memory_plan.py`` measures) has no gradient at
the logits' backward and a growing share of G at the layers'.

Per device kind (``LearnerShape.device``) two factors come from measurement, not derivation
(:data:`LAYER_BACKWARD_FACTOR`, :data:`ALLOCATOR_MARGIN`; ``tests/fixtures/memory_measured.json`` holds the
measurements, checked in CI): on CUDA one checkpointed layer's backward took 9-21% more than derived (an H100,
28 layers; the cause is not identified), and both devices keep a 2% margin so that a plan that says "fits"
is never under a measured peak.

**Inference replica (vLLM), per GPU**: of its budget B = ``gpu_memory_utilization`` x capacity, a fixed part F (the
weights, the LoRA slot buffers ``max_loras x max_lora_rank x sum (d_in + d_out) x L x b``, the forward workspace at
``max_num_batched_tokens``, CUDA graphs) and the sampler's logits, ``8 V`` bytes (two float32 rows) per sequence of
``max_num_seqs`` m. The rest is the KV cache, ``kv = 2 x kv_heads x d x b x L / tp`` bytes per token and GPU; it is paged
(PagedAttention: blocks are allocated as a sequence grows), so it holds P = (B - F - 8 V m) / kv tokens of whichever
sequences run, not ``max_model_len`` for each (:class:`PagedKV`):

- E is the longest expected sequence (prompt + new tokens) of the engine's phases (``planning.lengths.sequence_tokens``:
  ``plan.*``, or the lengths a run recorded with ``--dry-run --from-run``);
- the row counts the tokens in flight, min(m, P // E) sequences of E tokens (at least one sequence of
  ``max_model_len``); the rest of the budget (vLLM fills it with blocks too) is the room for sequences longer than
  expected. A budgeted engine whose traits say its cache is not paged reserves ``max_model_len`` for each of m;
- the row refuses only where P < ``max_model_len``: vLLM does not start unless one sequence of the longest fits;
- the plan's ``max_num_seqs`` S = min(``max_num_batched_tokens``, floor((B - F) / (E kv / (1 - h) + 8 V))), h =
  ``plan.kv_headroom``: S sequences of E tokens fill (1 - h) of the cache they leave. A configured m > S is a warning
  naming S (vLLM preempts, recomputing sequences, when the blocks run out), not a refusal;
- in a phase of n sequences of t expected tokens a replica decodes c = max(1, min(n, m, P // t)) at once, in
  ceil(n / c) waves (the time plan's decode).

**Inference replica (the transformers engine, ``inference.backend: hf``), per GPU**: no budget and no sleep mode;
what it holds, all of it counted as resident (:func:`hf_engine_items`):

- its own copy of the base in the model dtype (it loads the weights itself: only the learners share one copy);
- its LoRA slots, one per member, in float32 (``MultiLoRAModel``'s master weights): ``adapters x 4 P``;
- the KV cache of its largest batch (:func:`hf_batch_rows`: the largest ``generate`` call of a step per replica,
  at most :data:`HF_MAX_BATCH_ROWS` rows), every row ``model.max_seq_len`` tokens long, ``2 x kv_heads x d x b x L``
  bytes per token, plus one layer's copy (``DynamicCache`` grows each layer by ``torch.cat``);
- the prefill of that batch: ``rows x W`` prompt tokens (W = ``model.max_seq_len`` - ``max_tokens``, the longest
  prompt that fits) of forward activations ``(4h + 3f) b`` and the padding mask, boolean and in the attention's
  dtype, ``W x W (1 + b)`` per row; the sampler's float32 temporaries (:data:`HF_SAMPLER_BYTES_PER_LOGIT` per row and
  vocabulary entry); its CUDA context.

The prefill and the full cache peak at different moments; the plan adds them (an upper bound). It counts all of it in
every moment: the engine's caching allocator keeps the blocks its last ``generate`` reserved (nothing empties it), so
its learners never get them back.

**Colocated GPU** (``resources.colocated``: replica g and learner pair g on GPU g, taking it in turn), three rows with
vLLM (two with the transformers engine, which has no budget row):

- ``GPU g engine``: the replica's vLLM budget, as above;
- ``GPU g generating`` (the engine awake): the engine's whole budget ``gpu_memory_utilization`` x capacity (vLLM
  fills it with KV cache) and its CUDA context, beside what the learners keep between updates
  (:func:`learner_resident_bytes`): the base, each learner's adapters and AdamW moments (12 P per slot), its CUDA
  context, and the cached blocks its release cannot return. The optimizer step sets the gradients to None and the
  learners empty their caching allocators before the engine wakes (``LearnerActor.release_memory``), but a
  segment that holds any live block stays reserved: measured, :data:`RELEASE_RETAINED_FRACTION` of the step's
  transient bytes;
- ``GPU g training`` (the engine asleep): the learners' row above plus what a sleeping engine keeps. vLLM's sleep
  level 1 (vLLM 0.32: ``CuMemBackend.suspend``, ``CuMemAllocator.sleep``) copies the weights and LoRA slot
  buffers to pinned host memory, frees the KV cache and workspace and empties the caching allocator; the CUDA
  context and the CUDA graphs (unless ``enforce_eager``) stay.

With the transformers engine (it has no sleep mode and stays awake) both moments hold its whole footprint (above):
``GPU g generating`` beside the learners' resident state, ``GPU g training`` beside the learners' peak.

The pinned copies (weights + LoRA slots of every vLLM replica of a node) are a ``host RAM`` row, checked where this
machine is the GPU node (``HostView.gpu_node``) and reported otherwise. vLLM's sleep mode is CUDA only: on CPU the
engine keeps its memory, and the host row says so.

**Host**: the shared base file in ``/dev/shm`` (its size is checked), and on CPU-only runs the learners and
the inference engine in RAM.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planning.lengths import Lengths, lengths_from_config, sequence_tokens
from planning.model_files import ModelPathError, model_directory
from planning.placement import PlacementPlan, planned_engine
from configs.schema import Config

GiB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

CUDA_CONTEXT_BYTES = int(0.5 * GiB)
"""Per GPU process: the CUDA context and kernels outside the caching allocator (an estimate, not measured here)."""
CUDA_GRAPHS_BYTES = 1 * GiB
"""vLLM's captured CUDA graphs when ``enforce_eager`` is not set (an estimate; vLLM logs the real figure)."""
VLLM_DEFAULT_BATCHED_TOKENS = 16384
"""``max_num_batched_tokens`` of ``vllm.LLM`` on a GPU when engine_args do not set it (vLLM V1 default)."""
VLLM_DEFAULT_UTILIZATION = 0.9
VLLM_DEFAULT_MAX_NUM_SEQS = 256
HF_MAX_BATCH_ROWS = 256
"""Rows the transformers engine decodes at once: ``HFEngine``'s ``max_batch_rows`` default, which the inference actor
keeps (``tests/test_plan_hf_engine.py`` checks that they agree)."""
HF_SAMPLER_BYTES_PER_LOGIT = 32
"""The transformers engine's sampler (``inference.sampling.sample_tokens``) per row and vocabulary entry: the float32
logits, tempered logits, probabilities, log-probabilities and CDF (4 B each) and, for top-p, the sorted probabilities'
int64 order (8 B). An estimate of what is alive at once, not measured."""
EVAL_PROBLEMS_DEFAULT = 164  # HumanEval's size, when eval.limit does not bound a benchmark
DEVICE_KINDS = ("cpu", "cuda")
LAYER_BACKWARD_FACTOR = {"cpu": 1.0, "cuda": 1.25}
"""Factor on one decoder layer's backward (recompute + workspace) per device kind. CUDA: fitted to the H100
measurements of 2026-11-25 (``tests/fixtures/memory_measured.json``): the derived term was 9% (4,096 tokens)
and 21% (16,384) under the measured checkpointed peaks; CPU: the derivation stands (measured within 4%)."""
RELEASE_RETAINED_FRACTION = 0.45
"""CUDA: of a learner step's transient bytes (``step_peak_bytes``), the fraction its caching allocator still reserves
after ``gc.collect(); torch.cuda.empty_cache()`` (``LearnerActor.release_memory``): a segment holding any live block
cannot be returned. Measured by ``bench/colocated_memory.py`` on an H200 on 2026-11-26
(``tests/fixtures/colocated_measured.json``): 0.28 (4 layers of Qwen2.5-7B's widths, 8,192 tokens) and 0.44
(28 layers, 16,384 tokens). With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` it was 0.05 and 0.09; the
learners do not set it, because they share the base through CUDA IPC, which expandable segments change (not
checked)."""
ALLOCATOR_MARGIN = {"cpu": 1.02, "cuda": 1.02}
"""Factor on a learner step's transient bytes: without it the derivation lands within 0.1% of three CUDA peaks,
and a plan must never be under one."""


class PlanInputError(ValueError):
    """The model's shape cannot be read (no ``config.json`` and not the built-in tiny model)."""


@dataclass(frozen=True)
class ModelDims:
    """The widths of a Qwen2/Llama-style decoder that the plan needs (from ``config.json``)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool = False
    head_dim: int = 0  # 0 = hidden / heads
    qkv_bias: bool = True  # Qwen2 has q/k/v biases

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Width of the K (or V) projection: kv_heads x head dim."""
        return self.kv_heads * self.dim

    @classmethod
    def from_config_json(cls, cfg: dict[str, Any]) -> "ModelDims":
        """Read a Hugging Face ``config.json`` dict (``num_key_value_heads`` defaults to the head count)."""
        try:
            heads = int(cfg["num_attention_heads"])
            return cls(
                hidden=int(cfg["hidden_size"]),
                intermediate=int(cfg["intermediate_size"]),
                layers=int(cfg["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                vocab=int(cfg["vocab_size"]),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                head_dim=int(cfg.get("head_dim") or 0),
                qkv_bias=cfg.get("model_type", "qwen2") == "qwen2" or bool(cfg.get("attention_bias", False)),
            )
        except KeyError as exc:
            raise PlanInputError(f"config.json lacks {exc.args[0]!r}: the memory plan needs the decoder's widths") from None

    def module_widths(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each LoRA-targetable projection of one decoder layer."""
        h, f, kv = self.hidden, self.intermediate, self.kv
        q = self.heads * self.dim
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h),
        }

    def base_params(self) -> int:
        """Every parameter of the frozen base: embeddings (+ an untied head), L layers, the final norm."""
        h, kv, q = self.hidden, self.kv, self.heads * self.dim
        per_layer = sum(i * o for i, o in self.module_widths().values()) + 2 * h
        if self.qkv_bias:
            per_layer += q + 2 * kv
        return self.vocab * h * (1 if self.tied_embeddings else 2) + self.layers * per_layer + h


def lora_params(dims: ModelDims, rank: int, targets: tuple[str, ...] | list[str]) -> int:
    """P = L x r x sum over the target modules of (d_in + d_out): one adapter's parameters."""
    widths = dims.module_widths()
    unknown = sorted(set(targets) - set(widths))
    if unknown:
        raise PlanInputError(f"lora.target_modules {unknown} are not projections the plan knows ({sorted(widths)})")
    return dims.layers * rank * sum(sum(widths[t]) for t in targets)


def load_model_dims(config: Config) -> ModelDims:
    """The widths of ``model.path``: its ``config.json`` (no weights read; a Hub id's from the local cache,
    ``planning.model_files.model_directory``), or the tiny model's build settings."""
    if config.model.path == "tiny":
        from tinycoder.settings import variant_settings

        settings = variant_settings(config.model.tiny_variant)
        shape = settings.model
        return ModelDims(shape.hidden, shape.intermediate, shape.layers, shape.hidden // 64, shape.kv_heads,
                         settings.vocab_size, tied_embeddings=True)
    try:
        path = model_directory(config.model.path) / "config.json"
    except ModelPathError as err:
        raise PlanInputError(str(err)) from None
    if not path.is_file():
        raise PlanInputError(f"no config.json in model.path={config.model.path}: the memory plan needs the model's widths")
    return ModelDims.from_config_json(json.loads(path.read_text()))


# ---------------------------------------------------------------------------------------------- learner


@dataclass(frozen=True)
class LearnerShape:
    """What one learner's peak depends on besides the model."""

    slots: int  # adapters this learner owns
    rank: int
    targets: tuple[str, ...]
    dtype_bytes: int  # base (compute) dtype
    micro_batch_tokens: int
    max_seq_len: int  # the longest row of a padded micro-batch
    checkpointing: bool
    logit_chunk_tokens: int  # 0 = all loss tokens at once
    entropy: bool = False
    padded: bool = True  # a padding mask is passed (the learners' default pad batching)
    loss_tokens: int | None = None  # completion tokens of a micro-batch (None: every token, the worst case)
    device: str = "cuda"  # the device kind the learner runs on: "cuda" or "cpu" (allocator factors differ)
    accumulating: bool = True  # gradients of earlier micro-batches alive (a step of more than one micro-batch)

    def __post_init__(self) -> None:
        if self.device not in DEVICE_KINDS:
            raise ValueError(f"LearnerShape.device must be one of {DEVICE_KINDS}, got {self.device!r}")


def layer_saved_bytes(dims: ModelDims, shape: LearnerShape) -> int:
    """Bytes per token that one decoder layer saves for backward (the table in the module docstring)."""
    h, f, b, r = dims.hidden, dims.intermediate, shape.dtype_bytes, shape.rank
    kv_saved = h if shape.padded else dims.kv
    targets = set(shape.targets)
    lora_inputs = b * h * bool(targets & {"q_proj", "k_proj", "v_proj"}) + b * h * bool(targets & {"gate_proj", "up_proj"})
    lora_inputs += b * f * ("down_proj" in targets)
    return (
        2 * (4 * h + 4)
        + lora_inputs
        + b * r * len(targets)
        + b * (dims.heads * dims.dim + 2 * kv_saved) + b * dims.heads * dims.dim + 4 * dims.heads
        + 3 * b * f
        + (b * shape.max_seq_len if shape.padded else 0)
    )


def logits_bytes_per_token(dims: ModelDims, shape: LearnerShape) -> int:
    """V (2 b + 12) per loss token alive at the logits' backward (+4 V with the entropy term)."""
    return dims.vocab * (2 * shape.dtype_bytes + 12 + (4 if shape.entropy else 0))


def step_peak_bytes(dims: ModelDims, shape: LearnerShape) -> int:
    """A learner step's peak bytes above its resident state (weights, AdamW moments): gradients + activations.

    The larger of the logits' backward and a decoder layer's backward (module docstring), or of a no-grad pass.
    """
    n, b, layers = shape.micro_batch_tokens, shape.dtype_bytes, dims.layers
    grads = 4 * lora_params(dims, shape.rank, shape.targets) * shape.slots
    casts = 0 if b == 4 else b * lora_params(dims, shape.rank, shape.targets) * shape.slots // layers
    one_layer = n * layer_saved_bytes(dims, shape) + casts
    mask = n * shape.max_seq_len if shape.padded else 0  # the boolean padding mask, 1 byte per (query, key)
    final_norm = n * (4 * dims.hidden + 4)
    workspace = n * 8 * dims.hidden  # float32 norm gradients; the f-wide gradients replace the saved tensors they free
    unit = n * b * dims.hidden if shape.checkpointing else one_layer  # what each layer keeps until its backward
    layer_backward = LAYER_BACKWARD_FACTOR[shape.device] * (workspace + (one_layer if shape.checkpointing else 0))
    loss = shape.loss_tokens if shape.loss_tokens is not None else n
    chunk = min(shape.logit_chunk_tokens, loss) if shape.logit_chunk_tokens > 0 else loss
    logits = chunk * logits_bytes_per_token(dims, shape)
    if shape.accumulating:
        at_logits = grads + layers * unit + mask + final_norm + logits
        at_layer = grads + layers * unit + mask + layer_backward
    else:
        at_logits = layers * unit + mask + final_norm + logits
        at_layer = max(unit + grads, layers * unit + grads / layers) + mask + layer_backward
    no_grad = n * (3 * b * dims.intermediate + 4 * b * dims.hidden) + chunk * dims.vocab * (b + 8)
    return int(ALLOCATOR_MARGIN[shape.device] * max(at_logits, at_layer, no_grad))


def learner_components(dims: ModelDims, shape: LearnerShape) -> dict[str, int]:
    """One learner's bytes by component (the base excluded: it is counted once per device)."""
    p = lora_params(dims, shape.rank, shape.targets)
    grads = 4 * p * shape.slots
    return {
        "adapters (fp32 weights, AdamW moments)": 12 * p * shape.slots,
        "adapter gradients (fp32)": grads,
        "activations + logits (policy pass)": step_peak_bytes(dims, shape) - grads,
    }


def learner_peak(dims: ModelDims, shape: LearnerShape) -> int:
    return sum(learner_components(dims, shape).values())


def learner_resident_bytes(dims: ModelDims, shape: LearnerShape) -> dict[str, int]:
    """What one CUDA learner keeps on its GPU between updates once it has released its cache (the base excluded):
    its adapters and AdamW moments, and the cached blocks the release cannot return
    (:data:`RELEASE_RETAINED_FRACTION` of its step's transient bytes)."""
    state = "adapters (fp32 weights, AdamW moments)"
    return {state: learner_components(dims, shape)[state],
            "cached blocks its release keeps (measured share of its step)":
                int(RELEASE_RETAINED_FRACTION * step_peak_bytes(dims, shape))}


# -------------------------------------------------------------------------------------------- inference


def kv_bytes_per_token(dims: ModelDims, dtype_bytes: int) -> int:
    """2 (K and V) x kv_heads x head dim x b x L."""
    return 2 * dims.kv * dtype_bytes * dims.layers


# ------------------------------------------------------------------------------------------------- plan


@dataclass
class DeviceRow:
    """One device of the plan: its capacity (or budget), what is on it, and by how much it fits."""

    device: str
    capacity: int
    items: dict[str, int] = field(default_factory=dict)
    note: str = ""
    knob: str = ""  # what to change when it does not fit
    checked: bool = True  # False: reported only (the capacity is not that of the machine that will hold it)

    @property
    def need(self) -> int:
        return sum(self.items.values())

    @property
    def headroom(self) -> int:
        return self.capacity - self.need


def span_devices(devices: list[str]) -> str:
    """Rows' device names, consecutive GPUs with the same part folded: ["GPU 0 generating", "GPU 1 generating",
    "GPU 4"] -> "GPU 0-1 generating, GPU 4" (eight replicas would otherwise be named one by one)."""
    runs: list[list] = []  # [first GPU, last GPU, the rest of the name]; a name that is no GPU: [None, None, name]
    for name in devices:
        match = re.fullmatch(r"GPU (\d+)(.*)", name)
        gpu, rest = (int(match[1]), match[2]) if match else (None, name)
        last = runs[-1] if runs else None
        if gpu is not None and last and last[0] is not None and last[2] == rest and last[1] + 1 == gpu:
            last[1] = gpu
        else:
            runs.append([gpu, gpu, rest])
    return ", ".join(rest if first is None else f"GPU {first}{'' if first == end else f'-{end}'}{rest}"
                     for first, end, rest in runs)


def _size(nbytes: int) -> str:
    """``85.3 GiB``, or below a GiB ``300 MiB`` (a small GPU's figures would read 0.3)."""
    return f"{nbytes / GiB:.1f} GiB" if abs(nbytes) >= GiB else f"{nbytes / 2**20:.0f} MiB"


@dataclass
class MemoryPlan:
    rows: list[DeviceRow]
    capacity_source: str
    activation_checkpointing: bool
    max_micro_batch_tokens: int | None = None
    kv: PagedKV | None = None  # the vLLM replicas' paged KV cache (None: no such replica on a GPU)

    @property
    def fits(self) -> bool:
        return all(row.headroom >= 0 for row in self.rows if row.checked)

    def verdict(self) -> str:
        """The one closing line: ``memory: fits (...)`` or ``memory: does not fit: ...`` naming the knob."""
        if self.fits:
            row = min((r for r in self.rows if r.checked), key=lambda r: r.headroom)
            return f"memory: fits (smallest headroom {row.headroom / GiB:.1f} GiB on {row.device})"
        groups: dict[str, list[str]] = {}  # identical devices (the replicas, the learner GPUs) share one message
        for r in self.rows:
            if r.checked and r.headroom < 0:
                groups.setdefault(f"needs {_size(r.need)} of {_size(r.capacity)} ({_size(-r.headroom)} short): {r.knob}",
                                  []).append(r.device)
        return "memory: does not fit: " + "; ".join(f"{span_devices(devices)} {message}" for message, devices in groups.items())

    def render(self) -> str:
        lines = [f"# memory plan (GPU capacity: {self.capacity_source}; "
                 f"activation checkpointing {'on' if self.activation_checkpointing else 'off'})"]
        for row in self.rows:
            lines.append(f"{row.device:<10} need {row.need / GiB:7.2f} of {row.capacity / GiB:7.2f} GiB, "
                         f"headroom {row.headroom / GiB:7.2f} GiB  {row.note}".rstrip())
            for name, nbytes in row.items.items():
                lines.append(f"{'':<12}{nbytes / GiB:8.2f} GiB  {name}")
        if self.kv is not None:
            lines.append(self.kv.summary())
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    @property
    def warnings(self) -> list[str]:
        """What runs but slower than planned (a ``max_num_seqs`` that risks preemption); never a refusal."""
        return [w for w in (self.kv.warning() if self.kv else None,) if w]

    def to_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "capacity_source": self.capacity_source,
            "activation_checkpointing": self.activation_checkpointing,
            "devices": [{"device": r.device, "capacity": r.capacity, "need": r.need, "headroom": r.headroom,
                         "items": r.items, "note": r.note, "checked": r.checked} for r in self.rows],
            "max_num_seqs": self.kv.to_dict() if self.kv else None,
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class HostView:
    """This machine's memory: RAM and the size of the RAM-backed directory the shared base goes to."""

    ram_bytes: int
    shm_bytes: int
    shm_path: str = "/dev/shm"
    gpu_node: bool = False  # this machine holds the plan's GPUs (its RAM takes the sleeping engines' weights)


def _members_per_shard(config: Config, role: str, shards: int, shard: int) -> int:
    """Adapters a learner of ``role`` holds: member i on shard i mod shards, or with ``rl.data_parallel`` every
    member of the role (each learner a replica)."""
    if config.population.single_agent:
        return 1
    count = config.population.teachers if role == "teacher" else config.population.students
    return count if config.rl.data_parallel else len(range(shard, count, shards))


def _learner_shape(config: Config, slots: int, checkpointing: bool, micro_batch_tokens: int | None = None,
                   device: str = "cuda") -> LearnerShape:
    return LearnerShape(
        slots=max(1, slots), rank=config.lora.rank, targets=tuple(config.lora.target_modules),
        dtype_bytes=DTYPE_BYTES[config.model.dtype],
        micro_batch_tokens=micro_batch_tokens or config.rl.micro_batch_tokens,
        max_seq_len=config.model.max_seq_len, checkpointing=checkpointing,
        logit_chunk_tokens=config.rl.logit_chunk_tokens, entropy=config.rl.entropy_coef > 0, device=device,
    )


def _gpu_learners(config: Config, placement: PlacementPlan) -> dict[int, list[tuple[str, int]]]:
    """GPU -> (learner name, adapter slots it owns) of every learner on a GPU."""
    out: dict[int, list[tuple[str, int]]] = {}
    for actor in placement.actors:
        if not actor.role.startswith("learner") or not actor.gpu_ids:
            continue
        shard = int(actor.name.rsplit("-", 1)[1]) if actor.name.count("-") == 2 else 0
        slots = _members_per_shard(config, actor.role.removeprefix("learner-"), placement.learner_shards, shard)
        out.setdefault(actor.gpu_ids[0], []).append((actor.name, slots))
    return out


def _engine_on(placement: PlacementPlan, gpu: int) -> str:
    return next(a.name for a in placement.by_role("inference") if gpu in a.gpu_ids)


def _learner_rows(config: Config, dims: ModelDims, placement: PlacementPlan, checkpointing: bool,
                  gpu_bytes: int, micro_batch_tokens: int | None = None) -> list[DeviceRow]:
    """The learner GPUs at the learners' peak; colocated (``GPU g training``) with the sleeping engine beside them."""
    base = dims.base_params() * DTYPE_BYTES[config.model.dtype]
    rows = []
    for gpu, learners in _gpu_learners(config, placement).items():
        row = DeviceRow(
            f"GPU {gpu}", gpu_bytes, {"frozen base (one copy, shared)": base},
            knob="lower rl.micro_batch_tokens" + ("" if checkpointing else ", set rl.activation_checkpointing=on")
                 + ", lower rl.logit_chunk_tokens, or raise resources.learner_gpus",
        )
        for name, slots in learners:
            shape = _learner_shape(config, slots, checkpointing, micro_batch_tokens)
            for part, nbytes in learner_components(dims, shape).items():
                row.items[f"{name}: {part}"] = nbytes
            row.items[f"{name}: CUDA context"] = CUDA_CONTEXT_BYTES
        row.note = f"learners ({', '.join(name for name, _ in learners)})"
        if placement.colocated:
            engine = _engine_on(placement, gpu)
            row.device += " training"
            if planned_engine(config, on_gpus=True).sleep_mode:
                row.items[f"{engine}: asleep (its CUDA context{'' if _eager(config) else ' and CUDA graphs'} stay)"] = (
                    _engine_asleep_bytes(config))
                row.note += f" training, {engine} asleep"
            else:
                for part, nbytes in hf_engine_items(config, dims, _replicas(placement)).items():
                    row.items[f"{engine} (awake): {part}"] = nbytes
                row.note += f" training, {engine} awake (the transformers engine has no sleep mode)"
                row.knob += "; " + _hf_knob(config, placement, colocated=True)
        rows.append(row)
    return rows


def _eager(config: Config) -> bool:
    return bool(config.inference.vllm_engine_args.get("enforce_eager", False))


def _engine_asleep_bytes(config: Config) -> int:
    """What a vLLM engine keeps on its GPU in sleep level 1 (module docstring): its CUDA context and, unless
    ``enforce_eager``, its CUDA graphs."""
    return CUDA_CONTEXT_BYTES + (0 if _eager(config) else CUDA_GRAPHS_BYTES)


def _colocated_generating_rows(config: Config, dims: ModelDims, placement: PlacementPlan, gpu_bytes: int,
                               checkpointing: bool) -> list[DeviceRow]:
    """Colocated GPUs while the engine generates: its whole budget and CUDA context (the transformers engine: its whole
    footprint) beside the learners' resident state (module docstring)."""
    if not planned_engine(config, on_gpus=True).budgeted_memory:
        return _colocated_hf_generating_rows(config, dims, placement, gpu_bytes, checkpointing)
    util = _engine_utilization(config)
    base = dims.base_params() * DTYPE_BYTES[config.model.dtype]
    rows = []
    for gpu, learners in _gpu_learners(config, placement).items():
        engine = _engine_on(placement, gpu)
        items = {f"{engine}: awake, its vLLM budget ({util:g} x capacity, KV cache included)": int(util * gpu_bytes),
                 f"{engine}: CUDA context": CUDA_CONTEXT_BYTES,
                 "frozen base (one copy, shared)": base}
        for name, slots in learners:
            for part, nbytes in learner_resident_bytes(dims, _learner_shape(config, slots, checkpointing)).items():
                items[f"{name}: {part}"] = nbytes
            items[f"{name}: CUDA context"] = CUDA_CONTEXT_BYTES
        resident = sum(items.values()) - int(util * gpu_bytes)
        most = math.floor(100 * (gpu_bytes - resident) / gpu_bytes) / 100
        rows.append(DeviceRow(
            f"GPU {gpu} generating", gpu_bytes, items,
            note=f"{engine} awake; learners between updates (gradients freed, cache released)",
            knob=f"lower inference.vllm_engine_args.gpu_memory_utilization to at most {most:.2f} (the learners keep "
                 f"{resident / GiB:.1f} GiB here while the engine is awake)",
        ))
    return rows


def _colocated_hf_generating_rows(config: Config, dims: ModelDims, placement: PlacementPlan, gpu_bytes: int,
                                  checkpointing: bool) -> list[DeviceRow]:
    """Colocated GPUs while the transformers engine generates: its whole footprint beside the learners' resident state."""
    base = dims.base_params() * DTYPE_BYTES[config.model.dtype]
    rows = []
    for gpu, learners in _gpu_learners(config, placement).items():
        engine = _engine_on(placement, gpu)
        items = {f"{engine} (awake): {part}": nbytes
                 for part, nbytes in hf_engine_items(config, dims, _replicas(placement)).items()}
        items["frozen base (one copy, shared)"] = base
        for name, slots in learners:
            for part, nbytes in learner_resident_bytes(dims, _learner_shape(config, slots, checkpointing)).items():
                items[f"{name}: {part}"] = nbytes
            items[f"{name}: CUDA context"] = CUDA_CONTEXT_BYTES
        rows.append(DeviceRow(
            f"GPU {gpu} generating", gpu_bytes, items,
            note=f"{engine} awake (transformers engine); learners between updates (gradients freed, cache released)",
            knob=_hf_knob(config, placement, colocated=True),
        ))
    return rows


def _replicas(placement: PlacementPlan) -> int:
    return max(1, len(placement.by_role("inference")))


def hf_batch_rows(config: Config, replicas: int = 1) -> int:
    """Rows of the largest batch one transformers engine replica decodes at once: the largest ``generate`` call of a
    step split over the replicas (``System.generate``: evenly below two full batches per replica, else in pieces of at
    least a full batch, ``planning.dispatch``), at most :data:`HF_MAX_BATCH_ROWS`.
    The calls: the proposals (a row each), the rollouts (``tasks.rollouts_k`` rows per valid proposal; every proposal
    valid at worst) and, with ``eval.every``, one benchmark's problems for every member and the base."""
    tasks, pop = config.tasks, config.population
    proposals = (1 if pop.single_agent else pop.teachers) * tasks.tasks_per_teacher
    rows = -(-proposals // replicas) * tasks.rollouts_k
    if config.eval.every:
        rows = max(rows, -(-(config.eval.limit or EVAL_PROBLEMS_DEFAULT) * (pop.adapters + 1) // replicas))
    return max(1, min(HF_MAX_BATCH_ROWS, rows))


def hf_engine_items(config: Config, dims: ModelDims, replicas: int = 1) -> dict[str, int]:
    """One transformers engine replica's bytes on its GPU by component (module docstring); it keeps all of them."""
    b = DTYPE_BYTES[config.model.dtype]
    rows, longest = hf_batch_rows(config, replicas), config.model.max_seq_len
    new = config.inference.max_tokens if not config.eval.every else min(config.inference.max_tokens, config.eval.max_tokens)
    width = max(1, longest - new)  # the longest prompt that leaves room for its new tokens
    kv = kv_bytes_per_token(dims, b)
    adapters = config.population.adapters
    h, f = dims.hidden, dims.intermediate
    return {
        f"weights (its own copy, {config.model.dtype})": dims.base_params() * b,
        f"LoRA slots ({adapters} x rank {config.lora.rank}, float32)":
            adapters * lora_params(dims, config.lora.rank, config.lora.target_modules) * 4,
        f"KV cache: {rows} rows x {longest} tokens x {kv / 1024:g} KiB, + one layer's copy as it grows":
            rows * longest * kv + rows * longest * kv // dims.layers,
        f"prefill of {rows} x {width} prompt tokens: activations + padding mask":
            rows * width * (4 * h + 3 * f) * b + rows * width * width * (1 + b),
        f"sampler ({rows} rows x V x {HF_SAMPLER_BYTES_PER_LOGIT} B)": rows * dims.vocab * HF_SAMPLER_BYTES_PER_LOGIT,
        "CUDA context": CUDA_CONTEXT_BYTES,
    }


def _hf_knob(config: Config, placement: PlacementPlan, colocated: bool) -> str:
    """What shrinks a transformers engine replica: its KV cache and prefill (rows, length), or vLLM, which sleeps."""
    rows = hf_batch_rows(config, _replicas(placement))
    calls = ("population.teachers x tasks.tasks_per_teacher x tasks.rollouts_k per replica"
             + (", eval.limit" if config.eval.every else ""))
    knob = (f"lower model.max_seq_len or the rows the transformers engine decodes at once ({rows}: {calls})")
    return knob + (", or use inference.backend=vllm (it sleeps while the learners train)" if colocated
                   else ", or use GPUs with more memory")


def _engine_utilization(config: Config) -> float:
    return float(config.inference.vllm_engine_args.get("gpu_memory_utilization", VLLM_DEFAULT_UTILIZATION))


def _engine_max_num_seqs(config: Config) -> int:
    return int(config.inference.vllm_engine_args.get("max_num_seqs", VLLM_DEFAULT_MAX_NUM_SEQS))


def _sampler_bytes_per_seq(dims: ModelDims) -> int:
    """The sampler's logits of one sequence: two float32 rows of the vocabulary, 8 V."""
    return 2 * dims.vocab * 4


def _engine_fixed_items(config: Config, dims: ModelDims, seqs: int) -> dict[str, int]:
    """One vLLM replica's bytes per GPU besides its KV cache, with ``seqs`` sequences' sampler logits."""
    args = config.inference.vllm_engine_args
    b = DTYPE_BYTES[config.model.dtype]
    tp = config.resources.tensor_parallel_size
    batched = int(args.get("max_num_batched_tokens", VLLM_DEFAULT_BATCHED_TOKENS))
    adapters = 1 if config.population.single_agent else config.population.teachers + config.population.students
    max_loras = int(args.get("max_loras", adapters))
    from inference.vllm_engine import vllm_lora_rank  # imports neither vLLM nor Ray

    rank = vllm_lora_rank(config.lora.rank)
    h, f = dims.hidden, dims.intermediate
    items = {
        "weights": dims.base_params() * b // tp,
        f"LoRA slots ({max_loras} x rank {rank})": max_loras * lora_params(dims, rank, config.lora.target_modules) * b // tp,
        f"forward workspace ({batched} batched tokens) + sampler logits ({seqs} x V fp32)":
            batched * (4 * h + 3 * f) * b // tp + seqs * _sampler_bytes_per_seq(dims),
    }
    if not args.get("enforce_eager", False):
        items["CUDA graphs"] = CUDA_GRAPHS_BYTES
    return items


@dataclass(frozen=True)
class PagedKV:
    """One vLLM replica's paged KV cache and the decode concurrency it allows (module docstring)."""

    pool_tokens: int  # P: tokens the cache holds at the configured max_num_seqs
    configured: int  # m: the max_num_seqs the engine runs with
    configured_set: bool  # m is inference.vllm_engine_args.max_num_seqs (else vLLM's default)
    chosen: int  # S: the plan's max_num_seqs
    expected: int  # E: expected tokens (prompt + new) of the longest phase's sequence
    phase: str  # the phase of E
    longest: int  # max_model_len: the longest sequence vLLM admits
    headroom: float  # h: plan.kv_headroom
    source: str  # where the expected lengths come from

    def running(self, sequences: int, tokens: int) -> int:
        """c = max(1, min(n, m, P // t)): sequences decoded at once in a phase of n sequences of t expected tokens."""
        return max(1, min(sequences, self.configured, self.pool_tokens // max(1, tokens)))

    def waves(self, sequences: int, tokens: int) -> int:
        """ceil(n / c): how many times a replica's phase fills its running sequences (0 without sequences)."""
        return -(-sequences // self.running(sequences, tokens)) if sequences > 0 else 0

    @property
    def configured_name(self) -> str:
        return (f"inference.vllm_engine_args.max_num_seqs={self.configured}" if self.configured_set
                else f"max_num_seqs {self.configured} (vLLM's default)")

    def summary(self) -> str:
        """The dry run's line: the configured and the planned max_num_seqs, and what the plan's rests on."""
        return (f"max_num_seqs: {self.configured_name}; the plan's {self.chosen}: each vLLM replica's paged KV cache holds "
                f"{self.pool_tokens:,} tokens, {1 - self.headroom:g} of them (plan.kv_headroom {self.headroom:g}) for "
                f"sequences of {self.expected:,} expected tokens ({self.phase}, the longest phase; lengths from "
                f"{self.source})")

    def warning(self) -> str | None:
        """Where m > S: the preemption risk and the value the plan would choose (no refusal: vLLM preempts)."""
        if self.configured <= self.chosen:
            return None
        tokens = self.configured * self.expected
        short = (f"need {tokens:,} KV-cache tokens, more than the {self.pool_tokens:,} each replica holds"
                 if tokens > self.pool_tokens else
                 f"take {tokens:,} of each replica's {self.pool_tokens:,} KV-cache tokens, leaving less than "
                 f"plan.kv_headroom {self.headroom:g} for sequences longer than expected")
        return (f"{self.configured_name} is more than the {self.chosen} the plan would choose: {self.configured} "
                f"sequences of {self.expected:,} expected tokens ({self.phase}) {short}: vLLM preempts (recomputes) "
                f"sequences when its blocks run out; set inference.vllm_engine_args.max_num_seqs={self.chosen}")

    def to_dict(self) -> dict[str, Any]:
        return {"pool_tokens": self.pool_tokens, "configured": self.configured, "chosen": self.chosen,
                "expected_tokens": self.expected, "phase": self.phase, "headroom": self.headroom}


def paged_kv(config: Config, dims: ModelDims, gpu_bytes: int, lengths: Lengths | None = None) -> PagedKV:
    """One vLLM replica's KV cache on GPUs of ``gpu_bytes`` (module docstring):
    P = (B - F - 8 V m) / kv and S = min(max_num_batched_tokens, floor((B - F) / (E kv / (1 - h) + 8 V)));
    ``lengths``: a run's recorded lengths, else the config's ``plan.*``."""
    lengths = lengths or lengths_from_config(config)
    args = config.inference.vllm_engine_args
    seqs = _engine_max_num_seqs(config)
    budget = _engine_utilization(config) * gpu_bytes
    fixed = sum(_engine_fixed_items(config, dims, 0).values())
    kv = kv_bytes_per_token(dims, DTYPE_BYTES[config.model.dtype]) / config.resources.tensor_parallel_size
    per_seq = _sampler_bytes_per_seq(dims)
    phase, expected = max(sequence_tokens(config, lengths).items(), key=lambda item: item[1])
    h = config.plan.kv_headroom
    batched = int(args.get("max_num_batched_tokens", VLLM_DEFAULT_BATCHED_TOKENS))
    chosen = max(1, min(batched, math.floor((budget - fixed) / (expected * kv / (1 - h) + per_seq))))
    return PagedKV(
        pool_tokens=max(0, math.floor((budget - fixed - per_seq * seqs) / kv)), configured=seqs,
        configured_set="max_num_seqs" in args, chosen=chosen, expected=expected, phase=phase,
        longest=int(args.get("max_model_len", config.model.max_seq_len)), headroom=h, source=lengths.source,
    )


def _engine_budget(config: Config, dims: ModelDims, kv: PagedKV) -> tuple[dict[str, int], float, str]:
    """One vLLM replica's items (its KV cache: the tokens in flight, :class:`PagedKV`), its budget fraction, and the
    knob for a replica that does not fit."""
    items = _engine_fixed_items(config, dims, kv.configured)
    kv_token = kv_bytes_per_token(dims, DTYPE_BYTES[config.model.dtype]) / config.resources.tensor_parallel_size
    if not planned_engine(config, on_gpus=True).paged_kv_cache:  # a contiguous cache: max_model_len for every sequence
        items[f"KV cache: {kv.configured} seqs x {kv.longest} tokens x {kv_token / 1024:g} KiB"] = (
            int(kv.configured * kv.longest * kv_token))
        return items, _engine_utilization(config), ("lower inference.vllm_engine_args.max_num_seqs or model.max_seq_len, "
                                                    "or raise inference.vllm_engine_args.gpu_memory_utilization")
    running = kv.running(kv.configured, kv.expected)
    if running * kv.expected >= kv.longest:
        items[f"KV cache in flight (paged): {running} seqs x {kv.expected} expected tokens x {kv_token / 1024:g} KiB"] = (
            int(running * kv.expected * kv_token))
    else:
        items[f"KV cache (paged): one sequence of {kv.longest} tokens, the least vLLM starts with"] = int(kv.longest * kv_token)
    knob = (f"lower model.max_seq_len (vLLM starts only if its KV cache holds one sequence of {kv.longest} tokens; it "
            f"holds {kv.pool_tokens:,}) or inference.vllm_engine_args.max_num_batched_tokens, or raise "
            "inference.vllm_engine_args.gpu_memory_utilization")
    return items, _engine_utilization(config), knob


def _inference_rows(config: Config, dims: ModelDims, placement: PlacementPlan, gpu_bytes: int,
                    kv: PagedKV | None) -> list[DeviceRow]:
    """The engine replicas' rows; ``kv``: a budgeted engine's KV cache (:func:`paged_kv`), None when none is on a GPU."""
    if not planned_engine(config, on_gpus=True).budgeted_memory:
        return _hf_inference_rows(config, dims, placement, gpu_bytes)
    if kv is None:
        return []
    items, util, knob = _engine_budget(config, dims, kv)
    rows = []
    for actor in placement.by_role("inference"):
        if not actor.gpu_ids:
            continue
        rows.append(DeviceRow(
            f"GPU {actor.gpu_ids[0]}" + (f"-{actor.gpu_ids[-1]}" if len(actor.gpu_ids) > 1 else "")
            + (" engine" if placement.colocated else ""),
            int(util * gpu_bytes), dict(items), knob=knob,
            note=f"{actor.name} (vLLM budget: {util:g} x capacity; its headroom is KV cache for longer sequences)",
        ))
    return rows


def _hf_inference_rows(config: Config, dims: ModelDims, placement: PlacementPlan, gpu_bytes: int) -> list[DeviceRow]:
    """Split layouts: each transformers engine replica alone on its GPU, all its bytes against the whole GPU (colocated:
    none, its bytes are in both moments of its GPU)."""
    if placement.colocated:
        return []
    items = hf_engine_items(config, dims, _replicas(placement))
    return [DeviceRow(f"GPU {actor.gpu_ids[0]}", gpu_bytes, dict(items),
                      note=f"{actor.name} (transformers engine: its own weights, awake throughout)",
                      knob=_hf_knob(config, placement, colocated=False))
            for actor in placement.by_role("inference") if actor.gpu_ids]


def _host_row(config: Config, dims: ModelDims, placement: PlacementPlan, host: HostView, checkpointing: bool) -> DeviceRow:
    """The shared base in /dev/shm; on CPU-only runs also the learners and the inference engine in RAM."""
    b = DTYPE_BYTES[config.model.dtype]
    base = dims.base_params() * b
    cpu_learners = [a for a in placement.actors if a.role.startswith("learner") and not a.gpu_ids]
    cpu_engines = [a for a in placement.by_role("inference") if not a.gpu_ids]
    if not cpu_learners and not cpu_engines:
        return DeviceRow(f"host {host.shm_path}", host.shm_bytes, {"shared base file (learners map it)": base},
                         note="RAM-backed", knob=f"enlarge {host.shm_path} (docker run --shm-size) to hold the base")
    items = {f"shared base in {host.shm_path}": base}
    for actor in cpu_learners:
        role = actor.role.removeprefix("learner-")
        slots = _members_per_shard(config, role, placement.learner_shards, 0)
        for name, nbytes in learner_components(dims, _learner_shape(config, slots, checkpointing, device="cpu")).items():
            items[f"{actor.name}: {name}"] = nbytes
    for actor in cpu_engines:
        items[f"{actor.name}: weights (its own copy)"] = base
    note = f"{host.shm_path} holds {host.shm_bytes / GiB:.1f} GiB"
    if config.resources.colocated:
        note += "; colocated on CPU: no sleep mode (vLLM's is CUDA only), the engine keeps its memory"
    return DeviceRow("host RAM", host.ram_bytes, items, note=note,
                     knob="lower rl.micro_batch_tokens or run on a machine with more memory")


def _pinned_row(config: Config, dims: ModelDims, placement: PlacementPlan, host: HostView) -> DeviceRow:
    """Colocated GPUs: the sleeping engines' weights and LoRA slots in pinned host RAM (module docstring)."""
    items = _engine_fixed_items(config, dims, _engine_max_num_seqs(config))
    pinned = sum(v for k, v in items.items() if k == "weights" or k.startswith("LoRA slots"))
    row = DeviceRow("host RAM", host.ram_bytes,
                    {f"{a.name}: weights + LoRA slots, pinned while asleep": pinned for a in placement.by_role("inference")},
                    note="vLLM sleep level 1 copies each engine's weights here", checked=host.gpu_node,
                    knob="run on a GPU node with more RAM (vLLM's sleep level 1 backs the weights up in pinned memory)")
    row.items[f"shared base file in {host.shm_path} (RAM-backed)"] = dims.base_params() * DTYPE_BYTES[config.model.dtype]
    if not row.checked:
        row.note += "; not checked: this machine is not the GPU node (that node's RAM must hold it)"
    return row


def plan_memory(config: Config, dims: ModelDims, placement: PlacementPlan, gpu_bytes: int, host: HostView,
                capacity_source: str = "config", checkpointing: bool | None = None,
                lengths: Lengths | None = None) -> MemoryPlan:
    """The plan of ``config``; ``checkpointing=None`` resolves ``rl.activation_checkpointing`` (auto: on iff needed);
    ``lengths``: the expected lengths the vLLM replicas' concurrency is sized from (None: the config's ``plan.*``)."""
    if checkpointing is None:
        setting = config.rl.activation_checkpointing
        checkpointing = setting == "on" or (
            setting == "auto"
            and not plan_memory(config, dims, placement, gpu_bytes, host, capacity_source, False, lengths).fits
        )
    engine = planned_engine(config, on_gpus=True)
    on_gpus = any(a.gpu_ids for a in placement.by_role("inference"))
    kv = paged_kv(config, dims, gpu_bytes, lengths) if engine.budgeted_memory and on_gpus else None
    rows = _inference_rows(config, dims, placement, gpu_bytes, kv)
    rows += _learner_rows(config, dims, placement, checkpointing, gpu_bytes)
    if placement.colocated:
        rows += _colocated_generating_rows(config, dims, placement, gpu_bytes, checkpointing)
    moments = {"engine": 0, "generating": 1, "training": 2}  # a colocated GPU's rows in the order of a step
    rows.sort(key=lambda r: (int(r.device.split()[1].split("-")[0]), moments.get(r.device.split()[-1], 0)))
    rows.append(_host_row(config, dims, placement, host, checkpointing))
    if placement.colocated and planned_engine(config, on_gpus=True).sleep_mode:
        rows.append(_pinned_row(config, dims, placement, host))
    plan = MemoryPlan(rows, capacity_source, checkpointing)
    plan.kv = kv if engine.paged_kv_cache else None
    plan.max_micro_batch_tokens = max_micro_batch_tokens(config, dims, placement, gpu_bytes, checkpointing)
    if plan.max_micro_batch_tokens is not None:
        for row in rows:
            if row.note.startswith("learners"):
                row.knob = row.knob.replace("lower rl.micro_batch_tokens",
                                            f"lower rl.micro_batch_tokens (at most {plan.max_micro_batch_tokens} fit)")
    return plan


def max_micro_batch_tokens(config: Config, dims: ModelDims, placement: PlacementPlan, gpu_bytes: int,
                           checkpointing: bool) -> int | None:
    """The largest ``rl.micro_batch_tokens`` whose learner GPUs fit (bisection; None without learner GPUs)."""
    def fits(tokens: int) -> bool:
        return all(r.headroom >= 0 for r in _learner_rows(config, dims, placement, checkpointing, gpu_bytes, tokens))

    if not config.resources.learner_gpus:
        return None
    lo, hi = 0, 1 << 24
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def with_resolved_checkpointing(config: Config, plan: MemoryPlan) -> Config:
    """``config`` with ``rl.activation_checkpointing`` 'auto' replaced by the plan's decision ('on' / 'off')."""
    if config.rl.activation_checkpointing != "auto":
        return config
    decided = "on" if plan.activation_checkpointing else "off"
    return config.model_copy(update={"rl": config.rl.model_copy(update={"activation_checkpointing": decided})})


__all__ = [
    "ALLOCATOR_MARGIN", "HostView", "LAYER_BACKWARD_FACTOR", "LearnerShape", "MemoryPlan", "ModelDims", "PagedKV",
    "PlanInputError",
    "RELEASE_RETAINED_FRACTION", "HF_MAX_BATCH_ROWS", "hf_batch_rows", "hf_engine_items", "kv_bytes_per_token", "layer_saved_bytes", "learner_components", "learner_peak",
    "learner_resident_bytes", "step_peak_bytes", "load_model_dims", "lora_params", "paged_kv", "plan_memory",
    "with_resolved_checkpointing",
]
