"""What a second learner process costs in memory when it maps the shared base, against one that copies it.

For each size (Qwen2-shaped ~0.1B, the Qwen2.5-0.5B and Qwen2.5-1.5B shapes; float32, random init) the model is saved to
a temporary directory and materialised once into ``/dev/shm`` (``learners.shared_base.materialise_base``).
Then, per mode, one learner process starts, then a second:

- ``shared``: each learner maps the base (``map_base``: a copy-on-write mapping of the one shm file);
- ``copy``:   each learner holds a private copy (``from_pretrained``, then every tensor cloned, as moving it
  to a device does; transformers alone would leave float32 weights mmapped from the checkpoint file).

A learner builds ``MultiLoRAModel`` with 4 adapters (r=8, all seven projections), one AdamW per adapter,
and runs one ``PolicyLearner.step`` (so gradients, optimizer moments and allocator caches exist), then
frees what it can (``gc``, ``malloc_trim``) and waits to be measured. PSS (proportional set size: every
page divided by the number of processes mapping it) is read with psutil for each learner process.

``second_learner_cost`` = (PSS of two learners - PSS of one) / bytes of the base weights, for the largest
size run (per size in ``sizes``). A copied base costs >= 1.0; the goal for the shared base is <= 0.25. Any
Python process that imports torch and transformers' Qwen2 code carries ~370 MiB of private memory (measured
here, before any weight exists), so the ratio is dominated by that fixed cost at 0.1B and by the base
above it; ``second_private_in_base_MiB`` (the second learner's private pages inside the base mapping:
0 means no byte of the base was copied) shows the sharing directly. Progress goes to stderr, the last
stdout line is one JSON object. Run: ``nice -n 10 python -m bench.learner_memory`` (about 14 minutes;
needs about 16 GiB free for the 1.5B copy mode; ``--sizes 0.1B,0.5B`` for a lighter run).

``--step-peaks`` measures instead what one learner step adds at Qwen2.5-7B's true widths (hidden 3584,
intermediate 18944, 28 query / 4 KV heads, vocabulary 152,064; ``--layers`` decoder layers, default 1;
bfloat16 base, tied embeddings to halve the process's weights, which changes no activation) with the 7B
preset's LoRA (rank 64, alpha 128, all seven projections) and 4 adapters in a mixed batch of ``--loss-tokens``
completion tokens: for activation checkpointing off/on x logits plain/chunked (``--chunk``), each in a fresh
process, the peak resident set during the first ``PolicyLearner.step`` (forward, loss, backward, AdamW state
created) over the resident set just before it (``/proc/self/clear_refs`` resets the high-water mark after
the model is built, so building's transients do not count). About 1 minute per configuration with 1 thread
and ~6 GiB per process at the defaults.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch


from bench.qwen25_7b import WIDTHS as WIDTHS_7B

MIB = 1 << 20
SIZES = {
    # ~0.1B: hidden 768, 12 layers, tied 32k vocab (104.5M parameters)
    "0.1B": dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=32768, tie_word_embeddings=True),
    # the Qwen2.5-0.5B shape (494M parameters)
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    # the Qwen2.5-1.5B shape (1.54B parameters, 5.9 GiB in float32)
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def learner_process(mode: str, source: str, ready: mp.Queue, stop: mp.Event) -> None:
    """One learner: base (mapped or copied) + 4 adapters + per-adapter AdamW, one real update, then idle."""
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from learners.adapter_optim import AdapterOptimizers
    from learners.batching import Sample
    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.pg_loss import PGConfig
    from learners.policy_learner import PolicyLearner, UpdateConfig
    from learners.shared_base import map_base

    if mode == "shared":
        base = map_base(source)
    else:
        base = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        with torch.no_grad():
            for t in list(base.parameters()) + list(base.buffers()):
                t.data = t.data.clone()
    model = MultiLoRAModel(base, LoRASpec(rank=8, alpha=16, num_slots=4), init_b_std=0.01, seed=0)
    learner = PolicyLearner(model, AdapterOptimizers(model, lr=1e-5), PGConfig(), UpdateConfig(micro_batch_tokens=1024), 0)
    g = torch.Generator().manual_seed(0)
    vocab = base.config.vocab_size
    samples = []
    for slot in range(4):
        for k in range(2):
            ids = torch.randint(1, vocab, (64,), generator=g).tolist()
            samples.append(Sample(slot, ids[:32], ids[32:], reward=float(k) * 2 - 1))
    learner.step(samples)
    del samples
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    ready.put(mp.current_process().pid)
    stop.wait(600)


def pss(pid: int) -> int:
    return psutil.Process(pid).memory_full_info().pss


def uss(pid: int) -> int:
    return psutil.Process(pid).memory_full_info().uss


def private_in(pid: int, path_suffix: str) -> int:
    """Private (unshared) bytes of process ``pid`` inside mappings whose path ends with ``path_suffix``."""
    return sum(m.private_clean + m.private_dirty for m in psutil.Process(pid).memory_maps(grouped=True)
               if m.path.endswith(path_suffix))


def measure_mode(mode: str, source: str, settle_s: float) -> dict:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    procs = []
    try:
        first = ctx.Process(target=learner_process, args=(mode, source, ready, stop))
        first.start()
        procs.append(first)
        ready.get(timeout=600)
        time.sleep(settle_s)
        one = pss(first.pid)
        log(f"[{mode}] one learner: PSS {one / MIB:.0f} MiB")
        second = ctx.Process(target=learner_process, args=(mode, source, ready, stop))
        second.start()
        procs.append(second)
        ready.get(timeout=600)
        time.sleep(settle_s)
        two_each = [pss(p.pid) for p in procs]
        private = [uss(p.pid) for p in procs]
        in_base = private_in(second.pid, "weights.bin")
        log(f"[{mode}] two learners: PSS {[round(x / MIB) for x in two_each]} MiB, USS {[round(x / MIB) for x in private]} MiB")
        return {"pss_one": one, "pss_two": sum(two_each), "uss_two": private, "second_private_in_base": in_base}
    finally:
        stop.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def run_size(size: str, settle_s: float) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learners.shared_base import materialise_base, read_manifest, release_base

    work = Path(tempfile.mkdtemp(prefix="populora-bench-mem-"))
    shm = Path("/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()) / work.name
    try:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(max_position_embeddings=1024, **SIZES[size]))
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(work / "model")
        del model
        gc.collect()
        log(f"[{size}] base: {params / 1e6:.1f}M parameters, float32")
        t0 = time.perf_counter()
        base_dir = materialise_base(work / "model", dtype=torch.float32, shm_dir=shm)
        materialise_s = time.perf_counter() - t0
        base_bytes = read_manifest(base_dir)["bytes"]
        log(f"[{size}] materialised {base_bytes / MIB:.0f} MiB into {base_dir} in {materialise_s:.1f}s")
        shared = measure_mode("shared", str(base_dir), settle_s)
        release_base(base_dir)
        copy = measure_mode("copy", str(work / "model"), settle_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    results = {"shared": shared, "copy": copy}
    return {
        "second_learner_cost": round((shared["pss_two"] - shared["pss_one"]) / base_bytes, 3),
        "second_learner_cost_copy": round((copy["pss_two"] - copy["pss_one"]) / base_bytes, 3),
        "base_params_M": round(params / 1e6, 1),
        "base_MiB": round(base_bytes / MIB, 1),
        "materialise_s": round(materialise_s, 2),
        "pss_MiB": {m: {"one": round(r["pss_one"] / MIB, 1), "two": round(r["pss_two"] / MIB, 1)} for m, r in results.items()},
        "second_learner_MiB": {m: round((r["pss_two"] - r["pss_one"]) / MIB, 1) for m, r in results.items()},
        "uss_two_MiB": {m: [round(x / MIB, 1) for x in r["uss_two"]] for m, r in results.items()},
        "second_private_in_base_MiB": round(shared["second_private_in_base"] / MIB, 2),
    }




def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def step_peak_process(layers: int, checkpointing: bool, chunk: int, loss_tokens: int, threads: int, out: mp.Queue) -> None:
    """One learner at 7B widths: build, settle, reset the high-water mark, one step; report the peak over the baseline."""
    torch.set_num_threads(threads)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learners.adapter_optim import AdapterOptimizers
    from learners.batching import Sample
    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.pg_loss import PGConfig
    from learners.policy_learner import PolicyLearner, UpdateConfig

    torch.manual_seed(0)
    config = Qwen2Config(num_hidden_layers=layers, max_position_embeddings=4096, tie_word_embeddings=True, **WIDTHS_7B)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialise in bfloat16: no float32 transient of the weights
    try:
        base = Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    slots = 4
    model = MultiLoRAModel(base, LoRASpec(rank=64, alpha=128, num_slots=slots), init_b_std=1e-3, seed=0)
    learner = PolicyLearner(model, AdapterOptimizers(model, lr=1e-5), PGConfig(),
                            UpdateConfig(micro_batch_tokens=1 << 20, activation_checkpointing=checkpointing, logit_chunk_tokens=chunk), 0)
    g = torch.Generator().manual_seed(0)
    prompt, completion = 64, loss_tokens // slots
    samples = []
    for slot in range(slots):
        ids = torch.randint(1, config.vocab_size, (prompt + completion,), generator=g).tolist()
        samples.append(Sample(slot, ids[:prompt], ids[prompt:], reward=float(slot % 2) * 2 - 1))
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    baseline = _proc_status_kib("VmRSS")
    t0 = time.perf_counter()
    learner.step(samples)
    seconds = time.perf_counter() - t0
    out.put({"peak_over_baseline_MiB": round((_proc_status_kib("VmHWM") - baseline) / 1024, 1),
             "baseline_MiB": round(baseline / 1024, 1), "step_s": round(seconds, 1)})


def run_step_peaks(layers: int, loss_tokens: int, chunk: int, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    results = {}
    for checkpointing in (False, True):
        for c in (0, chunk):
            name = f"ckpt_{'on' if checkpointing else 'off'}_{'chunk' + str(c) if c else 'plain'}"
            out = ctx.Queue()
            proc = ctx.Process(target=step_peak_process, args=(layers, checkpointing, c, loss_tokens, threads, out))
            proc.start()
            try:
                results[name] = out.get(timeout=1800)
            finally:
                proc.join(60)
                if proc.is_alive():
                    proc.kill()
            log(f"[7B widths, {layers} layer(s), {loss_tokens} loss tokens] {name}: {results[name]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.1B,0.5B,1.5B", help=f"comma-separated, from {sorted(SIZES)}")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait before reading PSS")
    parser.add_argument("--step-peaks", action="store_true", help="measure one step's peak at 7B widths instead")
    parser.add_argument("--layers", type=int, default=1, help="decoder layers of the 7B-width model (--step-peaks)")
    parser.add_argument("--loss-tokens", type=int, default=2048, help="completion tokens of the step's batch (--step-peaks)")
    parser.add_argument("--chunk", type=int, default=1024, help="logit_chunk_tokens of the chunked variants (--step-peaks)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per measured process (--step-peaks)")
    args = parser.parse_args()
    if args.step_peaks:
        peaks = run_step_peaks(args.layers, args.loss_tokens, args.chunk, args.threads)
        print(json.dumps({"layers": args.layers, "loss_tokens": args.loss_tokens, "chunk": args.chunk, "dtype": "bfloat16",
                          "lora_rank": 64, "adapters": 4, "peaks": peaks}))
        return
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or not sizes:
        raise SystemExit(f"unknown sizes {unknown}; choose from {sorted(SIZES)}")
    per_size = {size: run_size(size, args.settle) for size in sizes}
    largest = max(sizes, key=lambda s: per_size[s]["base_params_M"])
    print(json.dumps({
        "second_learner_cost": per_size[largest]["second_learner_cost"],
        "second_learner_cost_copy": per_size[largest]["second_learner_cost_copy"],
        "size": largest,
        "sizes": per_size,
    }))


if __name__ == "__main__":
    main()
