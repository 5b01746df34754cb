"""Qwen2.5-7B's public shapes (its ``config.json``), the one definition the benches build 7B-shaped models from.

Qwen2.5-7B and Qwen2.5-Coder-7B share them: hidden 3584, intermediate 18944, 28 layers, 28 query / 4 KV heads
(head dim 128), vocabulary 152,064, untied embeddings. Benches build a random Qwen2 with these widths and
fewer layers; ``planning.memory_plan.ModelDims`` reads the same dict as it reads a model's ``config.json``.
"""

from __future__ import annotations

from typing import Any

CONFIG: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
LAYERS = CONFIG["num_hidden_layers"]
WIDTHS = {k: CONFIG[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")}
"""The widths alone, as ``transformers.Qwen2Config`` keyword arguments."""


def config_json(layers: int = LAYERS, **overrides: Any) -> dict[str, Any]:
    """The config with ``layers`` decoder layers (and any other field overridden)."""
    return {**CONFIG, "num_hidden_layers": layers, **overrides}
