"""The inference actor: a thin Ray shell over one engine (vLLM or transformers) serving every adapter.

A new adapter version arrives as the files of its PEFT directory: the driver passes each replica the
same object-store reference that the adapter's learner put once (``LearnerActor.export``), Ray resolves
it in this process (on the learner's node a read-only, zero-copy view of the shared-memory object;
elsewhere one pull per node), and the actor writes the files to a directory on its own RAM-backed file
system, which the engine adopts into its versioned store (a rename, no copy) and swaps in (vLLM:
``add_lora(..., load_inplace=True)``). Learner and engine need not share a file system.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray
from typing_extensions import Buffer

from inference.adapter_store import ram_backed_root, write_adapter_dir

log = logging.getLogger(__name__)


@ray.remote(max_restarts=0)  # stateful: the driver recovers it from a checkpoint (actors.driver)
class InferenceActor:
    def __init__(self, backend: str, model_path: str, max_adapters: int, max_lora_rank: int, dtype: str,
                 max_model_len: int, engine_args: dict[str, Any], seed: int, target_modules: tuple[str, ...],
                 sleep_mode: bool = False, allow_untested_vllm: bool = False):
        from actors.cluster import actor_device, deterministic_torch, route_actor_output

        route_actor_output("inference")  # engine processes inherit it
        import torch

        from inference import make_engine

        device = actor_device()  # "cpu" in the CPU stand-in mode, whatever Ray gave
        if deterministic_torch(device == "cuda"):  # POPULORA_DETERMINISTIC (gpu_check/system.py)
            # vLLM's engine core is a child process on CUDA: the torch flags set here would not reach it, so the core
            # runs in this process instead (slower: no overlap of scheduling and the model's steps).
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if device == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("POPULORA_INFERENCE_THREADS", "1"))))
        hf_options = {"target_modules": tuple(target_modules), "device": device} if backend != "vllm" else {}
        self.engine = make_engine(backend, model_path, max_adapters=max_adapters, max_lora_rank=max_lora_rank,
                                  dtype=dtype, engine_args=engine_args or None, max_model_len=max_model_len,
                                  seed=seed, sleep_mode=sleep_mode, allow_untested_vllm=allow_untested_vllm, **hf_options)
        self._tmp = Path(tempfile.mkdtemp(prefix="populora-incoming-", dir=ram_backed_root()))  # the store's file system
        self._busy_s = 0.0

    def __repr__(self) -> str:
        return "InferenceActor(inference)"

    def backend(self) -> str:
        return self.engine.backend

    def runtime(self) -> str:
        """What the engine runs (vLLM: its version, model runner and CUDA graphs; transformers: its version)."""
        import transformers

        return getattr(self.engine, "runtime", f"transformers {transformers.__version__}")

    def generate(self, requests: list[Any]) -> list[list[Any]]:
        started = time.perf_counter()
        try:
            return self.engine.generate(requests)
        finally:
            self._busy_s += time.perf_counter() - started

    def busy_s(self) -> float:
        """Seconds this replica has spent in ``generate`` since it started (``bench/replica_balance.py``: the
        replicas' busy seconds together over their count are the balanced ideal of a phase)."""
        return self._busy_s

    def load_adapter_files(self, name: str, files: Mapping[str, Buffer], version: int) -> None:
        """Make ``version`` of adapter ``name`` live from its PEFT files (file name -> bytes or numpy view)."""
        incoming = write_adapter_dir(files, self._tmp / f"{name}-v{version}")
        try:
            self.engine.load_adapter(name, incoming, version, move=True)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)  # gone already unless the load failed

    def remove_adapter(self, name: str) -> None:
        self.engine.remove_adapter(name)

    def sleep(self) -> bool:
        """Free the engine's GPU memory for the learners (colocated); False where it has no sleep mode."""
        return self.engine.sleep()

    def wake_up(self) -> bool:
        return self.engine.wake_up()

    def sleep_mode(self) -> str:
        """How the engine sleeps, or why it does not."""
        return self.engine.sleep_mode

    def tensor_devices(self) -> dict[str, Any]:
        """Where this engine's tensors are, read inside its process (``gpu_check/system.py`` asks during a run): the
        ``devices`` of every parameter and buffer of the transformers engine's model (its weights and LoRA slots,
        into which each published adapter is loaded); None for vLLM, whose weights live in its own engine process."""
        import torch

        model = getattr(self.engine, "model", None)
        if self.engine.backend == "vllm" or not isinstance(model, torch.nn.Module):
            return {"devices": None, "reason": f"the {self.engine.backend} engine's tensors are not this process's"}
        tensors = list(model.parameters()) + list(model.buffers())
        return {"devices": sorted({str(t.device) for t in tensors}), "pid": os.getpid(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "allocated_now": int(torch.cuda.memory_allocated()) if torch.cuda.is_initialized() else None}

    def adapters(self) -> dict[str, int]:
        return self.engine.adapters()

    def scratch(self) -> tuple[str, list[str]]:
        """(node id, what this actor owns in RAM-backed storage: its directories and the shared-memory segments its
        engine's processes map, ``inference.shared_memory``): what to delete should it be killed before ``close``
        (``System.stop`` removes them on that node)."""
        from inference.shared_memory import mapped_segments

        store = getattr(self.engine, "store", None)
        paths = [str(self._tmp)] + ([str(store.root)] if store is not None else [])
        return ray.get_runtime_context().get_node_id(), paths + mapped_segments(os.getpid())

    def close(self) -> None:
        """Free the engine and delete its adapter directories (called before the actor is killed)."""
        self.engine.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
