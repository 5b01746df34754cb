"""A small byte-level BPE tokenizer trained locally on the corpus, saved in the Hugging Face format.

The pipeline around the BPE (NFC normalizer, Qwen2's pre-tokenizer regex, byte-level decoder) is
exactly Qwen2's: transformers 5 loads any ``model_type: qwen2`` directory with its
``Qwen2Tokenizer`` class, which rebuilds that pipeline around the saved vocabulary and merges
whatever ``tokenizer.json`` says. Training the merges under the same pipeline is what makes the
tokens a consumer gets (``AutoTokenizer``, the engines, vLLM) the tokens the model was trained on;
:func:`reload` checks it. Qwen2's regex also splits numbers into single digits.

``<|endoftext|>`` ends every completion (the model's EOS) and ``<|pad|>`` pads batches. The chat
template concatenates message contents (AZR replaces a base model's chat template by plain
concatenation). Training is deterministic for a given text list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

EOS = "<|endoftext|>"
PAD = "<|pad|>"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts`` and wrap it for transformers."""
    if vocab_size < 300:
        raise ValueError(f"vocab_size must be at least 300 (256 bytes + specials + merges), got {vocab_size}")
    bpe = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
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


def reload(out_dir: Path, trained: PreTrainedTokenizerFast, probes: Iterable[str]) -> PreTrainedTokenizerBase:
    """The tokenizer exactly as ``AutoTokenizer`` loads it from ``out_dir``, after checking that it
    splits ``probes`` into the same ids as the freshly trained one (else a clear error)."""
    loaded = AutoTokenizer.from_pretrained(out_dir)
    for text in probes:
        ours = trained(text, add_special_tokens=False)["input_ids"]
        theirs = loaded(text, add_special_tokens=False)["input_ids"]
        if ours != theirs:
            raise RuntimeError(
                f"AutoTokenizer loads {type(loaded).__name__} from {out_dir}, which tokenizes {text[:60]!r} "
                f"differently from the trained tokenizer; the model would be trained on other tokens than it sees"
            )
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(loaded, name) != getattr(trained, name):
            raise RuntimeError(f"the reloaded tokenizer's {name} differs from the trained one's")
    return loaded
