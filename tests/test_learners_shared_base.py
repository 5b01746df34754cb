"""The frozen base shared between real learner processes: one copy in memory, proven by per-mapping PSS."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import uuid
from pathlib import Path

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.shared_base_paths import default_shm_dir
from learners.shared_base import WEIGHTS, map_base, materialise_base, read_manifest, release_base

IDS = [[5, 17, 42, 8, 99, 3, 250], [7, 7, 300, 12, 41, 2, 9]]


def learner_process(model_dir: str, shm_dir: str, out: mp.Queue, go_on: mp.Event) -> None:
    """A learner: materialise (or reuse) the base, map it, train one adapter step, report, wait to be measured."""
    import os

    torch.set_num_threads(1)
    base_dir = materialise_base(model_dir, shm_dir=shm_dir)
    model = MultiLoRAModel(map_base(base_dir), LoRASpec(rank=4, alpha=8, num_slots=2), init_b_std=0.02, seed=0)
    opt = torch.optim.AdamW(model.slot_parameters(0), lr=1e-3)
    ids = torch.tensor(IDS)
    model(ids, adapter_index=[0, 1]).logits.logsumexp(-1).mean().backward()
    opt.step()
    with torch.no_grad():
        base_logits = model(ids, adapter_index=[-1, -1]).logits
    # Where does every base tensor live? Inside the file mapping, or somewhere private?
    mapped = [
        (int(m.addr.split("-")[0], 16), int(m.addr.split("-")[1], 16))
        for m in psutil.Process().memory_maps(grouped=False)
        if m.path.endswith(WEIGHTS)
    ]
    frozen = [t for n, t in model.model.named_parameters() if "lora_" not in n] + list(model.model.buffers())
    inside = sum(any(lo <= t.data_ptr() < hi for lo, hi in mapped) for t in frozen)
    checksum = sum(float(t.double().sum()) for t in frozen)  # touches every page of the base
    out.put({"pid": os.getpid(), "base_dir": str(base_dir), "inside": inside, "frozen": len(frozen),
             "checksum": checksum, "base_logits": base_logits})
    go_on.wait(120)


def mapping_memory(pid: int, base_dir: str) -> tuple[int, int]:
    """(RSS, PSS) bytes of the shared weights file mapped in process ``pid``."""
    target = str(Path(base_dir) / WEIGHTS)
    rss = pss = 0
    for m in psutil.Process(pid).memory_maps(grouped=True):
        if m.path == target:
            rss, pss = m.rss, m.pss
    return rss, pss


@pytest.fixture
def shm_dir():
    path = default_shm_dir() / f"populora-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_mapped_base_gives_the_same_model(tiny_qwen2_tied, shm_dir):
    base_dir = materialise_base(tiny_qwen2_tied, shm_dir=shm_dir)
    assert materialise_base(tiny_qwen2_tied, shm_dir=shm_dir) == base_dir, "a second call must reuse the copy"
    mapped = map_base(base_dir)
    loaded = AutoModelForCausalLM.from_pretrained(tiny_qwen2_tied, dtype=torch.float32).eval()
    ids = torch.tensor(IDS)
    with torch.no_grad():
        assert torch.equal(mapped(ids).logits, loaded(ids).logits)
    assert mapped.lm_head.weight is mapped.model.embed_tokens.weight, "tied weights must stay one parameter"
    assert not any(p.requires_grad for p in mapped.parameters())
    assert read_manifest(base_dir)["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    # Writing through one process's mapping never reaches the shared copy (private copy-on-write mapping).
    with torch.no_grad():
        mapped.model.norm.weight.add_(1.0)
        assert torch.equal(map_base(base_dir).model.norm.weight, loaded.model.norm.weight)
    release_base(base_dir)
    assert list(shm_dir.iterdir()) == [], "release must remove the base and its lock file"
    with pytest.raises(FileNotFoundError, match="materialise_base"):
        map_base(base_dir)


def test_two_learner_processes_map_one_copy_of_the_base(tiny_qwen2, shm_dir):
    ctx = mp.get_context("spawn")
    out, go_on = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=learner_process, args=(str(tiny_qwen2), str(shm_dir), out, go_on)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=180) for _ in procs]
        a, b = reports
        assert a["base_dir"] == b["base_dir"], "both learners must use the one materialised base"
        assert len(list(shm_dir.glob("populora-base-*"))) == 1
        base_bytes = read_manifest(a["base_dir"])["bytes"]
        for r in reports:
            assert r["inside"] == r["frozen"], "every frozen tensor must live in the shared mapping, none copied"
        assert a["checksum"] == b["checksum"]
        reference = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = reference(torch.tensor(IDS)).logits
        assert torch.equal(a["base_logits"], expected) and torch.equal(b["base_logits"], expected)
        (rss_a, pss_a), (rss_b, pss_b) = (mapping_memory(r["pid"], r["base_dir"]) for r in reports)
        # Each process has the whole base resident, but PSS splits every page between the two: one copy in all.
        page = 4096
        assert rss_a >= base_bytes - 64 * page and rss_b >= base_bytes - 64 * page
        assert abs((pss_a + pss_b) - max(rss_a, rss_b)) <= 64 * page
        assert abs(pss_a - rss_a / 2) <= 64 * page
    finally:
        go_on.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def cuda_learner_process(handle: dict, out: mp.Queue) -> None:
    from learners.shared_base import map_cuda_base

    model = map_cuda_base(handle)
    allocated = torch.cuda.memory_allocated()
    with torch.no_grad():
        logits = model(torch.tensor(IDS, device="cuda")).logits.cpu()
    # As numpy: a torch tensor goes through the queue as a shared-memory fd that this process must still serve when
    # the parent reads it, and it may have exited by then (the parent's read then fails: connection reset).
    out.put({"allocated_before_forward": allocated, "logits": logits.numpy()})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ipc_base_is_mapped_not_copied(tiny_qwen2, shm_dir):
    from learners.shared_base import CudaBaseOwner

    base_dir = materialise_base(tiny_qwen2, shm_dir=shm_dir)
    owner = CudaBaseOwner(base_dir, "cuda")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=cuda_learner_process, args=(owner.handle(), out))
    proc.start()
    try:
        report = out.get(timeout=180)
    finally:
        proc.join(60)
        owner.close()
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        expected = reference(torch.tensor(IDS, device="cuda")).logits.cpu()
    torch.testing.assert_close(torch.from_numpy(report["logits"]), expected, atol=1e-5, rtol=0)
    assert report["allocated_before_forward"] < read_manifest(base_dir)["bytes"] / 10, "the learner copied the base"


def test_a_node_cleanup_names_the_base_as_the_learners_do_without_importing_torch(tiny_qwen2, tmp_path):
    """``actors.node_cleanup`` runs in a bare Ray worker at every stop: it must find the base the learners wrote
    (named from a torch dtype there, from the config's dtype name here) and must not import torch to do it."""
    import subprocess
    import sys

    from learners.shared_base import base_dir_for

    written = materialise_base(tiny_qwen2, torch.float32, shm_dir=tmp_path)
    assert base_dir_for(tiny_qwen2, torch.float32, tmp_path) == written == base_dir_for(tiny_qwen2, "float32", tmp_path)
    assert base_dir_for(tiny_qwen2, "bfloat16", tmp_path) != written
    probe = ("import sys; from actors.node_cleanup import clean_node; from learners.shared_base_paths import base_dir_for, "
             f"release_base; release_base(base_dir_for({str(tiny_qwen2)!r}, 'float32', {str(tmp_path)!r})); "
             "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"]
    assert not written.exists() and list(tmp_path.iterdir()) == []  # the base and its lock file are gone
