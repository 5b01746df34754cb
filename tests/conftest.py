"""Shared test fixtures: tiny random causal LMs and a locally trained tokenizer, built once per session.

Nothing is downloaded. ``tiny_qwen2`` is a directory holding a random-init ``Qwen2ForCausalLM`` (config.json +
model.safetensors) and a byte-level BPE tokenizer trained here on a few Python snippets, saved with
``save_pretrained`` so ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained`` and vLLM load it.
Head dim is 64, a size every attention backend (vLLM CPU included) supports.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# Under `pytest -n auto` every core runs a worker, so a worker's torch (and what it starts) gets its share of the
# cores: OpenMP threads beyond it only spin against the other worker. Measured on two busy cores (a study beside),
# two workers, the learner, evolution and tinycoder files: 131 CPU-s in 112 s with one thread each, 172-208 CPU-s in
# 138-142 s with torch's default of two. Set before torch is imported; a value the user exported is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from actors.cluster import NO_IDLE_WORKERS_ENV
from learners.shared_base_paths import SHM_DIR_ENV, default_shm_dir
from short_runs import SHORT, SHORT_RUN, Launched, launched

# Ray started by any test binds loopback only, and its raylets start no idle workers for tasks (the clusters tests start
# with ray.init, cluster_utils or `ray start`; launch.py's own local cluster sets the same, actors.cluster.NO_IDLE_WORKERS).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
for _key, _value in NO_IDLE_WORKERS_ENV.items():
    os.environ.setdefault(_key, _value)

# Each process of the suite (each xdist worker) keeps our RAM-backed files (adapter stores, the learners' shared base)
# in a directory of its own, which every Ray cluster and `launch.py` it starts inherits: tests that count what a run
# leaves behind see only their own worker's files.
SHM_DIR = default_shm_dir() / f"pytest-populora-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
SHM_DIR.mkdir(exist_ok=True)
os.environ[SHM_DIR_ENV] = str(SHM_DIR)

# The test files that start Ray clusters or vLLM engines, each in one of two groups: under the README's
# `pytest -n auto --dist loadgroup` a group's files run one after another on one worker, the two groups side by side,
# and every other file on whichever worker is free. vLLM's message queues live in /dev/shm whatever POPULORA_SHM_DIR
# says, so every file that starts a vLLM engine is in the first group (one of them counts those segments). The split
# balances the groups' measured minutes (README, "Tests").
MACHINE_GROUPS = {
    "machine-a": frozenset({
        "test_cluster_faults", "test_colocated", "test_engines", "test_evaluation_vllm", "test_existing_cluster",
        "test_gpu_system_check", "test_recovery", "test_vllm_engine_process", "test_vllm_system",
    }),
    "machine-b": frozenset({
        "test_adapter_transport", "test_calibrate", "test_data_parallel_system", "test_doc_commands", "test_dynamics_bench",
        "test_engines_fit", "test_engines_parts", "test_evaluation_cli", "test_export", "test_learners_shared_base", "test_nodes",
        "test_overlap", "test_plan_hf_engine", "test_prompt_budget_system", "test_prompt_styles", "test_replica_dispatch",
        "test_report", "test_system", "test_system_actors", "test_terminal_output", "test_time_plan_overlap",
        "test_tracking",
    }),
}
MACHINE_WIDE = frozenset().union(*MACHINE_GROUPS.values())


def pytest_unconfigure(config) -> None:
    shutil.rmtree(SHM_DIR, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Put each ``MACHINE_GROUPS`` file's tests in its xdist group (a no-op without ``-n``)."""
    group_of = {name: group for group, names in MACHINE_GROUPS.items() for name in names}
    for item in items:
        if item.path.stem in group_of:
            item.add_marker(pytest.mark.xdist_group(group_of[item.path.stem]))


PYTHON_SNIPPETS = [
    "def f(a):\n    return a\n",
    "def f(xs):\n    total = 0\n    for x in xs:\n        total += x * x\n    return total\n",
    "def f(s):\n    return ''.join(reversed(s))\n",
    "def f(n):\n    if n < 2:\n        return n\n    return f(n - 1) + f(n - 2)\n",
    "def f(d, k):\n    return sorted(d.items(), key=lambda kv: kv[1])[:k]\n",
    "def f(a, b):\n    out = []\n    for i, (x, y) in enumerate(zip(a, b)):\n        out.append((i, x + y))\n    return out\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n",
    "<think>The input is 'abc'.</think>\n<answer>\n```output\n'cba'\n```\n</answer>\n",
    "```python\ndef f(x):\n    return [c for c in x if c.isalpha()]\n```\n```input\n'Hello world', 3\n```\n",
]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(out_dir: Path, vocab_size: int = 512):
    """Train a byte-level BPE on ``PYTHON_SNIPPETS`` and save it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(PYTHON_SNIPPETS * 4, vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    tok.save_pretrained(out_dir)
    return tok


def build_tiny_causal_lm(
    out_dir: Path,
    arch: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 2,
    tie_word_embeddings: bool = False,
    seed: int = 0,
) -> Path:
    """Save a random-init tiny ``Qwen2ForCausalLM`` or ``LlamaForCausalLM`` plus tokenizer into ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=max(1, hidden_size // 128),
        max_position_embeddings=512,
        initializer_range=0.08,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; use 'qwen2' or 'llama'")
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """Directory of a tiny random Qwen2ForCausalLM (hidden 128, 2 layers, head dim 64, untied) + tokenizer."""
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def tiny_qwen2_tied(tmp_path_factory) -> Path:
    """Like ``tiny_qwen2`` but with tied input/output embeddings (as small Qwen2.5 models have)."""
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_qwen2_tied"), arch="qwen2", tie_word_embeddings=True, seed=1)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Directory of a tiny random LlamaForCausalLM + tokenizer."""
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_llama"), arch="llama", seed=2)


@pytest.fixture(scope="session")
def short_run(tmp_path_factory) -> Launched:
    """`launch.py --steps 2` with ``SHORT_RUN`` on the tiny test model, default terminal output: the run the
    system, terminal-output and report tests each check their part of (one launch instead of one per file)."""
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    run_dir = tmp_path_factory.mktemp("short_run") / "run"
    return launched(run_dir, "--run-dir", str(run_dir), "--steps", "2", *SHORT_RUN)


@pytest.fixture(scope="session")
def short_run_resumed(short_run, tmp_path_factory) -> Launched:
    """A copy of ``short_run`` resumed for one more step with ``--quiet`` (steps 1-3)."""
    assert short_run.returncode == 0, short_run.stderr[-3000:]
    run_dir = tmp_path_factory.mktemp("short_run_resumed") / "run"
    shutil.copytree(short_run.run_dir, run_dir)
    return launched(run_dir, "--resume", str(run_dir), "--steps", "1", "--quiet", "run.dashboard=false")


@pytest.fixture(scope="session")
def single_agent_run(tmp_path_factory) -> Launched:
    """`launch.py --config configs/tiny-single.yaml --steps 3 --verbose` with ``SHORT`` (evolution keys left out):
    the report compares it with the population run, the terminal-output test checks what ``--verbose`` forwards."""
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    run_dir = tmp_path_factory.mktemp("single_agent_run") / "single"
    overrides = [o for o in SHORT if not o.startswith("evolution.")]
    return launched(run_dir, "--config", "configs/tiny-single.yaml", "--run-dir", str(run_dir), "--steps", "3",
                    *overrides, "--verbose")


@pytest.fixture(scope="module")
def parent() -> dict:
    """Parent a of the evolution operator tests (a small random adapter, ``evolution_adapters.make_adapter``)."""
    from evolution_adapters import make_adapter

    return make_adapter(0)


@pytest.fixture(scope="module")
def other() -> dict:
    """Parent b of the evolution crossover tests."""
    from evolution_adapters import make_adapter

    return make_adapter(1)


@pytest.fixture(autouse=True)
def torch_set_num_threads_restored():
    """Undo vLLM's process-wide patch: its CPU worker, started in-process by the engine tests, replaces
    ``torch.set_num_threads`` with a no-op that logs a warning, which would leave every later test of the
    session unable to set torch's thread count (the evolution shards and ``on_threads`` set it)."""
    yield
    import torch

    if torch.set_num_threads is not torch._C.set_num_threads:
        torch.set_num_threads = torch._C.set_num_threads
