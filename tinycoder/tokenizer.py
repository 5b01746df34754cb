"""A small byte-level BPE tokenizer trained locally on the corpus, saved in the Hugging Face format.

Digits are split one per token (as Qwen2's tokenizer does) so numbers share the ten digit
embeddings. ``<|endoftext|>`` ends every completion (the model's EOS) and ``<|pad|>`` pads
batches. The chat template concatenates message contents (AZR replaces the chat template of a
base model by plain concatenation). Training is deterministic for a given text list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
PAD = "<|pad|>"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts`` and wrap it for transformers."""
    if vocab_size < 300:
        raise ValueError(f"vocab_size must be at least 300 (256 bytes + specials + merges), got {vocab_size}")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    tokenizer.save_pretrained(out_dir)
