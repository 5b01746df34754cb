"""Multi-adapter LoRA: N stacked adapters on every target linear of one frozen causal LM, picked per row.

Each wrapped linear computes, for a token x of a row routed to slot a,

    y = W x + b + s * B_a (A_a x),        s = alpha / r   (or alpha / sqrt(r) with rsLoRA)

with A_a of shape (r, d_in) and B_a of shape (d_out, r), exactly PEFT's LoRA. A row routed to
``NO_ADAPTER`` (-1) gets the frozen base y = W x + b, which is the KL reference for free. Every slot's
factors are separate ``nn.Parameter``s, so gradients reach only the slots present in a batch (the
others keep ``grad is None``) and each slot can have its own optimizer.

The routing (one adapter index per row, or per token for packed rows) is held by an
:class:`AdapterRouter` shared by all wrapped layers of a model, so it is set once per batch and stays
fixed through KV-cached generation (the batch dimension does not change between decode steps).

The LoRA branch runs in the dtype of its input (the base's compute dtype): with a bfloat16 base,
x A^T and (.) B^T are bfloat16 matmuls on bfloat16 casts of the float32 master factors, and autograd
returns float32 gradients to the masters through the cast, so no float32 copy of an activation is
kept. With a float32 base the casts are no-ops and the arithmetic is exactly float32.

Activation checkpointing (:meth:`MultiLoRAModel.set_activation_checkpointing`) runs each decoder layer
under ``torch.utils.checkpoint`` (non-reentrant) whenever autograd records: only the layer's inputs
are kept, and its activations are recomputed in backward with the routing of the forward pass.

Two kernels, chosen per router (``bench/learner.py`` measures them):
- ``"grouped"``: order the adapter tokens by slot (no copy when the batch is already sorted by adapter),
  two small matmuls per slot on contiguous slices, concatenate, add back (``index_add`` when reordered).
  Cost grows with the slots present only through per-slot launch overhead, not FLOPs.
- ``"bmm"``: gather each row's (A, B) and do two batched matmuls; one launch per module whatever the
  mix, per-row routing only.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from configs.schema import TARGET_MODULES

NO_ADAPTER = -1
"""Adapter index of a row (or token) that uses no adapter: the frozen base model."""

Strategy = Literal["grouped", "bmm"]


@dataclass(frozen=True)
class LoRASpec:
    """Shape of every adapter of a model: rank, alpha, rsLoRA, target module names, number of slots."""

    rank: int
    alpha: float
    num_slots: int
    target_modules: tuple[str, ...] = TARGET_MODULES
    rslora: bool = False

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha}")
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one linear layer")

    @property
    def scaling(self) -> float:
        """s = alpha / r, or alpha / sqrt(r) with rsLoRA (Kalajdzievski 2023)."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


@dataclass(frozen=True)
class RoutingState:
    """One routing of an :class:`AdapterRouter`: the index and the plans cached for it (never mutated after
    the router moves on, so a checkpointed layer can replay exactly the routing of its forward pass)."""

    index: torch.Tensor | None
    plans: dict
    row_slots: dict


@dataclass(frozen=True)
class TokenPlan:
    """Adapter tokens in slot order: ``segments`` = (slot, start, stop) into that order; ``order`` = their flat
    positions in the input, or None when that order is the identity over every token."""

    segments: list[tuple[int, int, int]]
    order: torch.Tensor | None


class AdapterRouter:
    """The adapter index of the current batch, shared by every :class:`MultiLoRALinear` of a model.

    ``index`` is either one int per row (shape ``[B]``) or one per token (shape ``[B, T]``, for packed
    rows that hold sequences of several adapters). Values are slots in ``[0, num_slots)`` or
    ``NO_ADAPTER``. Token plans are computed once per input shape and cached until the index changes.
    """

    def __init__(self, num_slots: int, strategy: Strategy = "grouped") -> None:
        if strategy not in ("grouped", "bmm"):
            raise ValueError(f"unknown multi-LoRA strategy {strategy!r}; use 'grouped' or 'bmm'")
        self.num_slots = num_slots
        self.strategy: Strategy = strategy
        self._index: torch.Tensor | None = None
        self._plans: dict[tuple, TokenPlan] = {}
        self._row_slots: dict[torch.device, tuple[list[int], torch.Tensor]] = {}

    def state(self) -> RoutingState:
        """The current routing (index and its cached plans), to replay later with :meth:`replay`."""
        return RoutingState(self._index, self._plans, self._row_slots)

    @contextmanager
    def replay(self, state: RoutingState) -> Iterator[None]:
        """Route with ``state`` inside (no plan recomputed), then restore the routing found on entry.

        Activation checkpointing recomputes a layer in backward; this makes the recompute see the routing
        of the forward even if the index was set to something else in between.
        """
        if state.index is self._index:
            yield
            return
        current = self.state()
        self._index, self._plans, self._row_slots = state.index, state.plans, state.row_slots
        try:
            yield
        finally:
            self._index, self._plans, self._row_slots = current.index, current.plans, current.row_slots

    @property
    def index(self) -> torch.Tensor | None:
        """The current index (on CPU, int64), or None when unset."""
        return self._index

    def set(self, index: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None) -> None:
        """Route the next forward passes: one slot per row (``[B]``) or per token (``[B, T]``); None clears."""
        # New containers, not clear(): a RoutingState taken before keeps its own plans.
        self._plans = {}
        self._row_slots = {}
        if index is None:
            self._index = None
            return
        idx = torch.as_tensor(index).detach().to("cpu")
        if idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise TypeError(f"adapter index must hold integers, got dtype {idx.dtype}")
        idx = idx.long()
        if idx.dim() not in (1, 2) or idx.numel() == 0:
            raise ValueError(f"adapter index must have shape [B] (per row) or [B, T] (per token), got {tuple(idx.shape)}")
        bad = (idx < NO_ADAPTER) | (idx >= self.num_slots)
        if bad.any():
            raise ValueError(
                f"adapter index values must be in [0, {self.num_slots}) or NO_ADAPTER={NO_ADAPTER}; "
                f"got {sorted(set(idx[bad].tolist()))}"
            )
        self._index = idx

    def _require(self) -> torch.Tensor:
        if self._index is None:
            raise RuntimeError("no adapter index is set: pass adapter_index= or call set_adapter_index() first")
        return self._index

    def token_plan(self, lead_shape: torch.Size, device: torch.device) -> "TokenPlan":
        """How the grouped kernel visits the tokens of an input of ``lead_shape`` (its shape minus the feature dim).

        Tokens (flattened row-major) that use an adapter are ordered by slot (stable); ``segments`` gives
        each slot's [start, stop) in that order and ``order`` the flat positions (None when the order is the
        identity over all tokens, e.g. a batch sorted by adapter with no ``NO_ADAPTER`` rows). Cached per shape.
        """
        key = (tuple(lead_shape), device)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        idx = self._require()
        if idx.dim() == 1:
            if lead_shape[0] != idx.shape[0]:
                raise ValueError(
                    f"adapter index has {idx.shape[0]} rows but the input has {lead_shape[0]} "
                    "(repeat the index when generation expands the batch, e.g. num_return_sequences)"
                )
            per_token = idx.repeat_interleave(math.prod(lead_shape[1:]))
        else:
            if tuple(lead_shape[:2]) != tuple(idx.shape) or len(lead_shape) != 2:
                raise ValueError(
                    f"per-token adapter index of shape {tuple(idx.shape)} does not match input tokens {tuple(lead_shape)}; "
                    "per-token routing is for full-sequence (no KV cache) forward passes"
                )
            per_token = idx.reshape(-1)
        used = torch.nonzero(per_token != NO_ADAPTER).squeeze(1)
        order = used[torch.argsort(per_token[used], stable=True)]
        slots, counts = torch.unique_consecutive(per_token[order], return_counts=True)
        segments, start = [], 0
        for slot, count in zip(slots.tolist(), counts.tolist()):
            segments.append((slot, start, start + count))
            start += count
        identity = order.numel() == per_token.numel() and bool((order == torch.arange(order.numel())).all())
        plan = TokenPlan(segments, None if identity else order.to(device))
        self._plans[key] = plan
        return plan

    def row_slots(self, device: torch.device) -> tuple[list[int], torch.Tensor]:
        """For the ``bmm`` kernel: the slots present, and each row's position among them (len = NO_ADAPTER row)."""
        cached = self._row_slots.get(device)
        if cached is not None:
            return cached
        idx = self._require()
        if idx.dim() != 1:
            raise ValueError("the 'bmm' multi-LoRA strategy supports per-row routing only; use 'grouped' for per-token")
        present = sorted(s for s in set(idx.tolist()) if s != NO_ADAPTER)
        position = {s: i for i, s in enumerate(present)}
        rows = torch.tensor([position.get(s, len(present)) for s in idx.tolist()], device=device)
        self._row_slots[device] = (present, rows)
        return present, rows


class MultiLoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus ``num_slots`` LoRA adapters; each row/token uses the slot its router gives.

    ``lora_A[a]`` has shape (r, d_in), ``lora_B[a]`` (d_out, r), the layout of PEFT's ``lora_A.weight`` /
    ``lora_B.weight``. The factors are master weights in ``dtype`` (float32 by default); the LoRA path
    runs in the input's dtype on casts of them (no-ops when the dtypes agree), so a bfloat16 base keeps
    bfloat16 activations while the optimizer sees float32 gradients.
    """

    def __init__(
        self,
        base_layer: nn.Linear,
        spec: LoRASpec,
        router: AdapterRouter,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if base_layer.weight.device.type == "meta":
            raise ValueError("cannot wrap a linear layer whose weight is on the meta device; load the base weights first")
        self.base_layer = base_layer
        self.spec = spec
        self.scaling = spec.scaling
        self.router = router
        d_out, d_in = base_layer.weight.shape
        device = base_layer.weight.device
        self.lora_A = nn.ParameterList(
            [nn.Parameter(torch.empty(spec.rank, d_in, device=device, dtype=dtype)) for _ in range(spec.num_slots)]
        )
        self.lora_B = nn.ParameterList(
            [nn.Parameter(torch.zeros(d_out, spec.rank, device=device, dtype=dtype)) for _ in range(spec.num_slots)]
        )
        for slot in range(spec.num_slots):
            self.reset_slot(slot)

    @torch.no_grad()
    def reset_slot(self, slot: int, b_std: float = 0.0, generator: torch.Generator | None = None) -> None:
        """PEFT's default init: A ~ kaiming_uniform(a=sqrt(5)), B = 0 (so Delta W = 0); B ~ N(0, b_std) if b_std > 0.

        The draws are made on the CPU in float32 (from ``generator``, a CPU generator, or the global CPU stream) and
        copied to the slot's device and dtype, so one seed gives the same adapter on every device: a CPU generator
        cannot draw into CUDA memory, and CUDA's generator would give other numbers.
        """
        a, b = self.lora_A[slot], self.lora_B[slot]
        drawn = torch.empty(a.shape, dtype=torch.float32)
        nn.init.kaiming_uniform_(drawn, a=math.sqrt(5), generator=generator)
        a.copy_(drawn)
        if b_std > 0:
            b.copy_(torch.empty(b.shape, dtype=torch.float32).normal_(0.0, b_std, generator=generator))
        else:
            b.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        if self.router.strategy == "bmm":
            return self._forward_bmm(x, out)
        plan = self.router.token_plan(x.shape[:-1], x.device)
        if not plan.segments:
            return out
        flat_x = x.reshape(-1, x.shape[-1])
        xs = flat_x if plan.order is None else flat_x.index_select(0, plan.order)
        # One small matmul pair per slot on a contiguous chunk, concatenated: a constant number of
        # full-size passes per layer whatever the number of slots (in-place adds into views would clone
        # the output gradient once per slot in backward).
        # torch.split, not slicing: its backward is one concatenation, a slice's is a zero-filled
        # full-size tensor per slot.
        chunks = xs.split([stop - start for _, start, stop in plan.segments]) if len(plan.segments) > 1 else (xs,)
        # .to(x.dtype): a bfloat16 view of the float32 master for a bfloat16 base (its backward casts the
        # gradient back to float32); the identity when the dtypes agree.
        deltas = [
            F.linear(F.linear(chunk, self.lora_A[slot].to(xs.dtype)) * self.scaling, self.lora_B[slot].to(xs.dtype))
            for chunk, (slot, _, _) in zip(chunks, plan.segments)
        ]
        delta = (deltas[0] if len(deltas) == 1 else torch.cat(deltas)).to(out.dtype)
        if plan.order is None:
            return out + delta.view_as(out)
        return out.view(-1, out.shape[-1]).index_add(0, plan.order, delta).view_as(out)

    def _forward_bmm(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        present, rows = self.router.row_slots(x.device)
        if not present:
            return out
        # One zero slot at the end for NO_ADAPTER rows; only present slots join the graph.
        a_all = torch.stack([self.lora_A[s] for s in present] + [self.lora_A[present[0]].new_zeros(self.lora_A[0].shape)])
        b_all = torch.stack([self.lora_B[s] for s in present] + [self.lora_B[present[0]].new_zeros(self.lora_B[0].shape)])
        a_all, b_all = a_all.to(x.dtype), b_all.to(x.dtype)
        xr = x.reshape(x.shape[0], -1, x.shape[-1])
        delta = torch.bmm(torch.bmm(xr, a_all[rows].transpose(1, 2)), b_all[rows].transpose(1, 2))
        return out + (delta * self.scaling).to(out.dtype).view_as(out)

    def extra_repr(self) -> str:
        return f"slots={self.spec.num_slots}, rank={self.spec.rank}, scaling={self.scaling:g}"


def _checkpointed_forward(forward: Callable[..., Any], router: AdapterRouter, *args: Any, **kwargs: Any) -> Any:
    """A decoder layer's ``forward`` under non-reentrant ``torch.utils.checkpoint`` while autograd records.

    Only the layer's inputs stay alive; its activations are recomputed in backward, replaying the routing
    of this forward pass (:meth:`AdapterRouter.replay`). Without grad (no-grad passes, generation) the
    layer runs as is.
    """
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    routing = router.state()

    def run(*a: Any, **k: Any) -> Any:
        with router.replay(routing):
            return forward(*a, **k)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def check_one_device(model: nn.Module, expected: torch.device | str | None = None) -> torch.device:
    """The one device every parameter and buffer of ``model`` is on; a clear error naming the first module that
    is elsewhere (or, with ``expected``, the first module not on it), rather than a crash deep in a step."""
    want = torch.device(expected) if expected is not None else None
    first: tuple[str, torch.device] | None = None
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        here = tensor.device
        if want is not None and not _same_device(here, want):
            raise ValueError(f"the base's {name} is on {here}, but this learner runs on {want}: "
                             f"load or move the whole base to {want} before wrapping it")
        if first is None:
            first = (name, here)
        elif not _same_device(here, first[1]):
            raise ValueError(f"the base's {name} is on {here} while {first[0]} is on {first[1]}: "
                             "a base must sit on one device (move the whole model with .to(device))")
    if first is None:
        raise ValueError("the base model has no parameters")
    return first[1]


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Equal devices, ``cuda`` (no index) read as the current CUDA device."""
    def normal(d: torch.device) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d

    return normal(a) == normal(b)


class MultiLoRAModel(nn.Module):
    """A Hugging Face causal LM whose target linears are :class:`MultiLoRALinear`; the base is frozen.

    ``model`` is wrapped in place (its module paths are unchanged, each wrapped linear keeps the base as
    ``.base_layer``). Typical use::

        mlm = MultiLoRAModel(AutoModelForCausalLM.from_pretrained(path), LoRASpec(rank=8, alpha=16, num_slots=4))
        logits = mlm(input_ids, adapter_index=[0, 2, NO_ADAPTER]).logits      # one forward, three routings
        with mlm.route([1, 1, 3]):                                             # fixed during KV-cached generation
            ids = mlm.model.generate(input_ids, attention_mask=mask, max_new_tokens=16)
    """

    def __init__(
        self,
        model: nn.Module,
        spec: LoRASpec,
        strategy: Strategy = "grouped",
        init_b_std: float = 0.0,
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        """``device``: where the learner runs; the base must already be there (checked, see :func:`check_one_device`)."""
        super().__init__()
        check_one_device(model, device)
        self.model = model
        self.spec = spec
        self.router = AdapterRouter(spec.num_slots, strategy)
        self.init_b_std = init_b_std
        for p in model.parameters():
            p.requires_grad_(False)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.lora_layers: dict[str, MultiLoRALinear] = {}
        targets = set(spec.target_modules)
        for path, module in list(model.named_modules()):
            if path.rsplit(".", 1)[-1] not in targets:
                continue
            if not isinstance(module, nn.Linear):
                raise TypeError(f"target module {path!r} is {type(module).__name__}, not nn.Linear")
            wrapped = MultiLoRALinear(module, spec, self.router, dtype=dtype)
            if generator is not None:
                for slot in range(spec.num_slots):
                    wrapped.reset_slot(slot, init_b_std, generator)
            elif init_b_std > 0:
                for slot in range(spec.num_slots):
                    wrapped.reset_slot(slot, init_b_std)
            parent_path, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent_path) if parent_path else model, child, wrapped)
            self.lora_layers[path] = wrapped
        if not self.lora_layers:
            raise ValueError(f"no linear layer of the model is named one of {sorted(targets)}")
        found = {p.rsplit(".", 1)[-1] for p in self.lora_layers}
        if found != targets:
            raise ValueError(f"target modules {sorted(targets - found)} are not in the model")
        self.activation_checkpointing = False

    def decoder_layers(self) -> nn.ModuleList:
        """The wrapped model's decoder layers (``base_model.layers`` of Qwen2 / Llama)."""
        layers = getattr(self.model.base_model, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise TypeError(f"{type(self.model).__name__} has no base_model.layers ModuleList to checkpoint")
        return layers

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Checkpoint every decoder layer (non-reentrant) in passes that record autograd, or stop doing so.

        Per layer only its input hidden states are kept between forward and backward; backward recomputes
        the layer's activations (one layer at a time) with the routing of the forward pass. Module paths,
        parameters and results are unchanged (the recompute is the same arithmetic).
        """
        for layer in self.decoder_layers():
            if enabled and "forward" not in vars(layer):
                layer.forward = partial(_checkpointed_forward, type(layer).forward.__get__(layer), self.router)
            elif not enabled and "forward" in vars(layer):
                del layer.forward
        self.activation_checkpointing = enabled

    @property
    def config(self):
        """The wrapped model's Hugging Face config."""
        return self.model.config

    @property
    def num_slots(self) -> int:
        return self.spec.num_slots

    def set_adapter_index(self, index: torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None) -> None:
        """Route subsequent forwards (per row ``[B]`` or per token ``[B, T]``); ``NO_ADAPTER`` = base."""
        self.router.set(index)

    @contextmanager
    def route(self, index: torch.Tensor | Sequence[int] | Sequence[Sequence[int]]) -> Iterator[None]:
        """Context manager: route with ``index`` inside, restore the previous routing after."""
        previous = self.router.index
        self.router.set(index)
        try:
            yield
        finally:
            self.router.set(previous)

    def forward(self, *args, adapter_index=None, **kwargs):
        """The wrapped model's forward; ``adapter_index`` (if given) replaces the current routing first."""
        if adapter_index is not None:
            self.router.set(adapter_index)
        return self.model(*args, **kwargs)

    def generate(self, *args, adapter_index, **kwargs):
        """``model.generate`` with one adapter per row, fixed for every decode step."""
        with self.route(adapter_index):
            return self.model.generate(*args, **kwargs)

    def slot_parameters(self, slot: int) -> list[nn.Parameter]:
        """Every trainable tensor of one adapter (A and B of each wrapped layer), in a fixed order."""
        self._check_slot(slot)
        params: list[nn.Parameter] = []
        for layer in self.lora_layers.values():
            params += [layer.lora_A[slot], layer.lora_B[slot]]
        return params

    def reset_slot(self, slot: int, seed: int | None = None) -> None:
        """Re-initialise one adapter (PEFT init, so Delta W = 0 unless ``init_b_std`` > 0)."""
        self._check_slot(slot)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        for layer in self.lora_layers.values():
            layer.reset_slot(slot, self.init_b_std, generator)

    def slot_factors(self, slot: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Module path -> (A, B) of one adapter, detached copies on CPU in float32."""
        self._check_slot(slot)
        return {
            path: (layer.lora_A[slot].detach().float().cpu().clone(), layer.lora_B[slot].detach().float().cpu().clone())
            for path, layer in self.lora_layers.items()
        }

    @torch.no_grad()
    def set_slot_factors(self, slot: int, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Overwrite one adapter in place (same Parameter objects) from module path -> (A, B)."""
        self._check_slot(slot)
        missing = sorted(set(self.lora_layers) - set(factors))
        extra = sorted(set(factors) - set(self.lora_layers))
        if missing or extra:
            raise KeyError(f"adapter factors do not match the model: missing {missing[:4]}, unexpected {extra[:4]}")
        for path, (a, b) in factors.items():
            layer = self.lora_layers[path]
            for name, src, dst in (("A", a, layer.lora_A[slot]), ("B", b, layer.lora_B[slot])):
                if tuple(src.shape) != tuple(dst.shape):
                    raise ValueError(f"{path} {name}: shape {tuple(src.shape)} does not match {tuple(dst.shape)}")
                if not torch.isfinite(src).all():
                    raise ValueError(f"{path} {name}: factor holds NaN or inf")
        for path, (a, b) in factors.items():
            layer = self.lora_layers[path]
            layer.lora_A[slot].copy_(a)
            layer.lora_B[slot].copy_(b)

    @torch.no_grad()
    def copy_slot(self, src: int, dst: int) -> None:
        """Copy adapter ``src`` into slot ``dst`` (in place)."""
        self._check_slot(src)
        self._check_slot(dst)
        for layer in self.lora_layers.values():
            layer.lora_A[dst].copy_(layer.lora_A[src])
            layer.lora_B[dst].copy_(layer.lora_B[src])

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.spec.num_slots:
            raise IndexError(f"adapter slot {slot} out of range [0, {self.spec.num_slots})")
