"""One AdamW per adapter slot: its own learning rate, its own moments, its own gradient-norm clip.

A step only touches the slots that were in the batch (an absent slot's moments must not keep moving it),
and evolution can reset one slot's state when it replaces that slot's weights. Each step measures, per slot, the
norm of the change it made to the slot's parameters, ||theta_after - theta_before||_2 over all its tensors
(``last_update_norms``): how far the update moved the adapter, which the pre-clip gradient norm does not say (Adam
rescales every coordinate).
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from learners.multi_lora import MultiLoRAModel


# The quantities of AdapterOptimizers.fingerprint, in order.
FINGERPRINT = ("step", "param_sum", "param_sq_sum", "exp_avg_sum", "exp_avg_sq_sum")


def _sum(tensors: list[torch.Tensor], device: torch.device, squares: bool = False) -> torch.Tensor:
    """sum of x (``squares``: of x^2) over every element of ``tensors``: a float64 scalar on ``device`` (0 for
    none), computed on the tensors' device one tensor at a time (no copy of the whole set, none to the host)."""
    parts = []
    for t in tensors:
        t = t.detach()
        parts.append(t.to(torch.float64).square().sum() if squares else t.sum(dtype=torch.float64))
    return torch.stack(parts).sum() if parts else torch.zeros((), dtype=torch.float64, device=device)


class AdapterOptimizers:
    """``torch.optim.AdamW`` per slot of a :class:`MultiLoRAModel`, with per-slot gradient clipping.

    Clipping (``torch.nn.utils.clip_grad_norm_``) scales slot a's gradient by min(1, c / ||g_a||_2), the
    norm taken over that slot's tensors only, so one adapter's large gradient never shrinks another's.
    """

    def __init__(
        self,
        model: MultiLoRAModel,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        grad_clip: float | None = 1.0,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {grad_clip}")
        self.model = model
        self.grad_clip = grad_clip
        self._kwargs = dict(weight_decay=weight_decay, betas=betas, eps=eps)
        self._lrs = [lr] * model.num_slots
        self.optimizers = [self._new(slot) for slot in range(model.num_slots)]
        self.last_update_norms: dict[int, float] = {}  # slot -> ||theta_after - theta_before|| of the last step call

    def _new(self, slot: int) -> torch.optim.AdamW:
        params = self.model.slot_parameters(slot)
        try:
            # The fused kernel (CPU and CUDA, float32) was ~5x faster than the per-tensor loop here.
            return torch.optim.AdamW(params, lr=self._lrs[slot], fused=True, **self._kwargs)
        except (RuntimeError, ValueError):
            return torch.optim.AdamW(params, lr=self._lrs[slot], **self._kwargs)

    def lr(self, slot: int) -> float:
        return self._lrs[slot]

    def set_lr(self, slot: int, lr: float) -> None:
        """Change one slot's learning rate (its moments are kept)."""
        if not lr > 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        self._lrs[slot] = lr
        for group in self.optimizers[slot].param_groups:
            group["lr"] = lr

    def reset(self, slot: int) -> None:
        """Fresh AdamW state (step count and moments) for one slot, same learning rate; drops its gradients."""
        for p in self.model.slot_parameters(slot):
            p.grad = None
        self.optimizers[slot] = self._new(slot)

    def step(self, slots: Iterable[int]) -> dict[int, float]:
        """Clip and step each slot in ``slots``, then clear their gradients. Returns each slot's pre-clip grad norm;
        ``last_update_norms`` holds each stepped slot's ||theta_after - theta_before||_2 (over every tensor of the
        slot, weight decay included; 0 for a slot not stepped).

        A slot whose gradient is not finite is not stepped (its gradient is dropped) and reports inf/nan. The update
        norm needs the slot's parameters before its step: one slot's copy at a time, on their device, freed before
        the next slot (the peak grows by one adapter's parameters, the size of its gradient).
        """
        norms: dict[int, float] = {}
        self.last_update_norms = {}
        for slot in sorted(set(slots)):
            every = self.model.slot_parameters(slot)
            params = [p for p in every if p.grad is not None]
            if not params:
                continue
            if self.grad_clip is not None:
                norm = float(torch.nn.utils.clip_grad_norm_(params, self.grad_clip, foreach=True))
            else:
                norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
            norms[slot] = norm
            self.last_update_norms[slot] = 0.0
            if math.isfinite(norm):
                before = [p.detach().clone() for p in every]
                self.optimizers[slot].step()
                with torch.no_grad():
                    torch._foreach_sub_(before, [p.detach() for p in every])  # theta_before - theta_after, in place
                    self.last_update_norms[slot] = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(before))))
                del before
            self.optimizers[slot].zero_grad(set_to_none=True)
        return norms

    def fingerprint(self, slots: Iterable[int]) -> dict[int, dict[str, float]]:
        """What this learner holds for each slot in ``slots``, in five numbers: ``step`` (its AdamW step count)
        and float64 sums over the slot's tensors of the parameters (``param_sum``, ``param_sq_sum``: sum of x and
        of x^2) and of the AdamW moments (``exp_avg_sum``, ``exp_avg_sq_sum``; 0 before the first step).

        Data-parallel replicas (``learners.data_parallel``) compare these to see that they still hold the same
        member. Sums suffice: healthy replicas apply the same gradient bits in the same order to the same state,
        so they are bit-identical and their sums equal exactly, while a perturbed element or moment changes
        them (a change that cancels exactly in both the sum and the sum of squares is not a plausible fault).
        They are cheap where the tensors live: each sum runs on the tensors' own device (a 7B model's adapters
        stay on the GPU, no tensor is copied to the host), and only the few scalars come back, in one transfer.
        """
        slots = sorted(set(slots))
        rows, host_steps = [], []
        for slot in slots:
            params = self.model.slot_parameters(slot)
            state = self.optimizers[slot].state
            device = params[0].device
            step = state[params[0]].get("step", 0.0) if params[0] in state else 0.0
            # The fused AdamW keeps its step count on the device: it joins the device sums; a host one is read as is.
            on_device = isinstance(step, torch.Tensor) and step.device.type != "cpu"
            host_steps.append(None if on_device else float(step))
            moments = [[state[p][k] for p in params if k in state.get(p, {})] for k in ("exp_avg", "exp_avg_sq")]
            rows.append(torch.stack([
                step.to(torch.float64) if on_device else torch.zeros((), dtype=torch.float64, device=device),
                _sum(params, device), _sum(params, device, squares=True), _sum(moments[0], device), _sum(moments[1], device),
            ]))
        values = torch.stack([r.to(rows[0].device) for r in rows]).tolist() if rows else []  # the one host transfer
        for row, step in zip(values, host_steps):
            if step is not None:
                row[0] = step
        return {slot: dict(zip(FINGERPRINT, row)) for slot, row in zip(slots, values)}

    def state_dict(self) -> dict:
        return {"lrs": list(self._lrs), "optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["optimizers"]) != self.model.num_slots:
            raise ValueError(f"optimizer state has {len(state['optimizers'])} slots, the model {self.model.num_slots}")
        for slot, (lr, opt_state) in enumerate(zip(state["lrs"], state["optimizers"])):
            self._lrs[slot] = lr
            self.optimizers[slot] = self._new(slot)
            self.optimizers[slot].load_state_dict(opt_state)
