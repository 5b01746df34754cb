"""The tokenizer: trained locally, and loaded by AutoTokenizer exactly as it was trained."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tinycoder.model import qwen2_config
from tinycoder.settings import ModelShape
from tinycoder.tokenizer import EOS, PAD, reload, save_tokenizer, train_tokenizer

TEXTS = [
    "User: Deduce the output of f for the input.\n```python\ndef f(nums):\n    total = 0\n    for x in nums:\n"
    "        if x % 2 == 0:\n            total += x * 3\n    return total\n```\n```input\n[1, 22, 333]\n```\nAssistant: ",
    "<think>The output is an int.</think>\n<answer>\n```output\n66\n```\n</answer>",
    "def f(words):\n    counts = {}\n    for w in words:\n        counts[w] = counts.get(w, 0) + 1\n    return counts\n",
] * 20


def test_trained_tokenizer_round_trips_and_splits_digits(tmp_path):
    tok = train_tokenizer(TEXTS, vocab_size=400)
    text = "def f(nums):\n    return [x * 2 for x in nums if x > 3] + [1234]"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    digits = [tok.decode([i]) for i in tok("1234", add_special_tokens=False)["input_ids"]]
    assert digits == ["1", "2", "3", "4"]
    assert tok.eos_token == EOS and tok.pad_token == PAD and tok.eos_token_id != tok.pad_token_id


def test_reload_matches_what_autotokenizer_gives_a_qwen2_directory(tmp_path):
    tok = train_tokenizer(TEXTS, vocab_size=400)
    save_tokenizer(tok, tmp_path)
    qwen2_config(ModelShape(hidden=64, layers=1, kv_heads=1, intermediate=64), tok).save_pretrained(tmp_path)
    loaded = reload(tmp_path, tok, TEXTS[:3])
    auto = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS[:3]:
        assert auto(text)["input_ids"] == loaded(text)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]


def test_reload_refuses_a_tokenizer_that_loads_differently(tmp_path):
    """Merges trained across spaces (split on newlines only) are not what the Qwen2 pipeline that
    AutoTokenizer rebuilds produces: the mismatch is caught instead of training the model on
    tokens it will never see."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS, trainer=trainers.BpeTrainer(vocab_size=600, special_tokens=[EOS, PAD],
                                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    other = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=PAD)
    save_tokenizer(other, tmp_path)
    qwen2_config(ModelShape(hidden=64, layers=1, kv_heads=1, intermediate=64), other).save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="tokenizes .* differently"):
        reload(tmp_path, other, TEXTS[:3])


def test_tiny_vocab_is_a_clear_error():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(TEXTS, vocab_size=100)
