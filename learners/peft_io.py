"""One adapter slot <-> a PEFT LoRA directory (``adapter_config.json`` + ``adapter_model.safetensors``).

The directory is what ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest(name, id, path)`` load. Tensor
keys follow PEFT's saved layout, ``base_model.model.<module path>.lora_A.weight`` (shape r x d_in) and
``...lora_B.weight`` (d_out x r), e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from learners.multi_lora import MultiLoRAModel

if TYPE_CHECKING:
    from peft import LoraConfig

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."


def peft_key(module_path: str, factor: str) -> str:
    """PEFT's saved key of factor 'A' or 'B' of the LoRA on ``module_path``."""
    return f"{KEY_PREFIX}{module_path}.lora_{factor}.weight"


def slot_state_dict(model: MultiLoRAModel, slot: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """One adapter as a PEFT-keyed dict of contiguous CPU tensors (what ``adapter_model.safetensors`` holds)."""
    state: dict[str, torch.Tensor] = {}
    for path, (a, b) in model.slot_factors(slot).items():
        state[peft_key(path, "A")] = a.to(dtype).contiguous()
        state[peft_key(path, "B")] = b.to(dtype).contiguous()
    return state


def load_slot_state_dict(model: MultiLoRAModel, slot: int, state: dict[str, torch.Tensor], scale_b: float = 1.0) -> None:
    """Overwrite one adapter in place from a PEFT-keyed dict; every wrapped module must be present, nothing else.

    ``scale_b`` multiplies B on the way in (used to convert an adapter saved with another alpha: s' B = s (s'/s) B).
    """
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    unexpected = []
    for key in state:
        if not (key.startswith(KEY_PREFIX) and key.endswith((".lora_A.weight", ".lora_B.weight"))):
            unexpected.append(key)
    if unexpected:
        raise KeyError(f"adapter holds tensors that are not LoRA factors of a target module: {unexpected[:4]}")
    for path in model.lora_layers:
        ka, kb = peft_key(path, "A"), peft_key(path, "B")
        if ka not in state or kb not in state:
            raise KeyError(f"adapter has no LoRA factors for module {path!r} (expected keys {ka!r}, {kb!r})")
        factors[path] = (state[ka].float(), state[kb].float() * scale_b)
    extra = sorted(set(state) - {peft_key(p, f) for p in model.lora_layers for f in "AB"})
    if extra:
        raise KeyError(f"adapter has LoRA factors for modules this model does not wrap: {extra[:4]}")
    model.set_slot_factors(slot, factors)


def lora_config(model: MultiLoRAModel, base_model_name_or_path: str = "") -> LoraConfig:
    """The PEFT ``LoraConfig`` describing every slot of ``model`` (same rank, alpha, targets)."""
    from peft import LoraConfig  # here: peft imports transformers' model machinery, which the driver never needs

    spec = model.spec
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        use_rslora=spec.rslora,
        target_modules=sorted(spec.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_name_or_path or getattr(model.config, "_name_or_path", "") or None,
    )


def peft_files(tensors: dict[str, torch.Tensor], config: LoraConfig) -> dict[str, bytes]:
    """A PEFT adapter directory in memory: file name -> bytes of ``adapter_config.json`` and
    ``adapter_model.safetensors`` (the tensors in the dtype they have)."""
    with tempfile.TemporaryDirectory(prefix="populora-peft-config-") as tmp:
        config.save_pretrained(tmp)  # PEFT writes its own config format
        config_bytes = (Path(tmp) / CONFIG_NAME).read_bytes()
    return {CONFIG_NAME: config_bytes, WEIGHTS_NAME: safetensors_bytes(tensors, metadata={"format": "pt"})}


def adapter_files(model: MultiLoRAModel, slot: int, dtype: torch.dtype = torch.float32,
                  base_model_name_or_path: str = "") -> dict[str, bytes]:
    """Adapter ``slot`` as the files of a PEFT directory, its factors cast to ``dtype`` (the serving dtype
    when publishing to an engine; float32, the master weights, for checkpoints)."""
    return peft_files(slot_state_dict(model, slot, dtype), lora_config(model, base_model_name_or_path))


def save_adapter(model: MultiLoRAModel, slot: int, path: str | os.PathLike, base_model_name_or_path: str = "",
                 dtype: torch.dtype = torch.float32) -> Path:
    """Write adapter ``slot`` as a PEFT directory at ``path`` (created; files replaced atomically). Returns the path."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # Weights first, config last, each to a temporary name then renamed: a reader (vLLM) never sees half a file.
    for name, data in sorted(adapter_files(model, slot, dtype, base_model_name_or_path).items(), reverse=True):
        tmp = out / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        # created as open() creates a file (mode 0o666 less the umask), not 0o600 as a tempfile's: a user's
        # exports and checkpoints get the mode of their other files
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            handle.write(data)
        os.replace(tmp, out / name)
    return out


def read_adapter_config(path: str | os.PathLike) -> dict:
    """The JSON of ``<path>/adapter_config.json``, with a clear error when missing or not a LoRA."""
    config_file = Path(path) / CONFIG_NAME
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found: not a PEFT adapter directory")
    config = json.loads(config_file.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{config_file}: peft_type is {config.get('peft_type')!r}, only LORA adapters can be loaded")
    if config.get("use_dora"):
        raise ValueError(f"{config_file}: DoRA adapters are not supported")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise ValueError(f"{config_file}: per-module {key} is not supported (every module must share r and alpha)")
    if config.get("modules_to_save"):
        raise ValueError(f"{config_file}: modules_to_save (full weights) cannot be loaded into a LoRA slot")
    return config


def load_adapter(model: MultiLoRAModel, slot: int, path: str | os.PathLike) -> None:
    """Load the PEFT directory at ``path`` into ``slot`` in place. Its rank must equal the model's; a different
    alpha (or rsLoRA setting) is converted exactly by rescaling B."""
    config = read_adapter_config(path)
    if int(config["r"]) != model.spec.rank:
        raise ValueError(f"{path}: adapter rank {config['r']} differs from the model's rank {model.spec.rank}")
    rank = int(config["r"])
    their_scaling = float(config["lora_alpha"]) / (math.sqrt(rank) if config.get("use_rslora") else rank)
    weights = Path(path) / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found")
    state = load_file(str(weights))
    # PEFT keeps the adapter name out of saved keys, but some tools leave ".default" in; accept both.
    state = {k.replace(".lora_A.default.weight", ".lora_A.weight").replace(".lora_B.default.weight", ".lora_B.weight"): v
             for k, v in state.items()}
    load_slot_state_dict(model, slot, state, scale_b=their_scaling / model.spec.scaling)
