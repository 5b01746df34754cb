"""The tiny model's architecture: Qwen2 (the module names of the 7B targets), a few million parameters.

Head dimension 64 (a size every attention backend, vLLM's CPU one included, supports), grouped
query attention, tied input/output embeddings as in small Qwen2.5 models, and a 1024-token
context. Parameter count, roughly: V*h (tied embeddings) + L * (2*h*h + 2*h*h_kv + 3*h*h_ff).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tinycoder.settings import ModelShape


def qwen2_config(shape: ModelShape, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """A ``Qwen2Config`` of ``shape`` whose vocabulary and special ids match ``tokenizer``."""
    return _config(shape, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)


def stand_in_model(shape: ModelShape, vocab_size: int) -> Qwen2ForCausalLM:
    """A model of ``shape`` before any tokenizer exists (special ids 0-2), for timing a training step:
    its cost does not depend on which ids are special."""
    return Qwen2ForCausalLM(_config(shape, vocab_size, 0, 1, 2))


def _config(shape: ModelShape, vocab_size: int, bos: int | None, eos: int | None, pad: int | None) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.hidden // 64,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def new_model(shape: ModelShape, tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A randomly initialised model (seed torch before calling for a reproducible init)."""
    return Qwen2ForCausalLM(qwen2_config(shape, tokenizer))
