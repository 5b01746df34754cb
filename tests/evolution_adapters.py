"""Small random PEFT-layout adapters and dense Delta W helpers shared by the evolution tests."""

from __future__ import annotations

import torch

# (d_out, d_in) per module; 'k' has d_out = 2r for r = 4 so a rotation can move every output component
SHAPES = {"self_attn.q_proj": (24, 16), "self_attn.k_proj": (8, 16), "mlp.down_proj": (20, 40)}


def make_adapter(seed: int, rank: int = 4, layers: int = 3, shapes=SHAPES, dtype=torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    adapter = {}
    for layer in range(layers):
        for module, (d_out, d_in) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            adapter[f"{prefix}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen).to(dtype)
            adapter[f"{prefix}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen).to(dtype)
    return adapter


def slot_names(adapter: dict[str, torch.Tensor]) -> list[str]:
    return [k[: -len(".lora_A.weight")] for k in adapter if k.endswith(".lora_A.weight")]


def delta(adapter: dict[str, torch.Tensor], slot: str) -> torch.Tensor:
    """Dense Delta W / s = B A in float64."""
    return adapter[f"{slot}.lora_B.weight"].double() @ adapter[f"{slot}.lora_A.weight"].double()


def rel(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y||_F / ||y||_F."""
    return float(torch.linalg.matrix_norm(x - y) / torch.linalg.matrix_norm(y))


def dense_svd(m: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    return u[:, :rank], s[:rank], vh[:rank]


def principal_cosines(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cosines of the principal angles between span(x) and span(y) (orthonormal columns)."""
    return torch.linalg.svdvals(x.mT @ y)


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (the operators' determinism contract is per generator)."""
    return torch.Generator().manual_seed(seed)
