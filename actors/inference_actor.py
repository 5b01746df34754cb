"""The inference actor: a thin Ray shell over one engine (vLLM or transformers) serving every adapter.

Learners send a new adapter version as the bytes of its PEFT files; the actor writes them to a
temporary directory on its own node and the engine copies them into its versioned, RAM-backed store
and swaps them in (vLLM: ``add_lora(..., load_inplace=True)``), so learner and engine need not share
a file system.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray

log = logging.getLogger(__name__)


@ray.remote(max_restarts=3)
class InferenceActor:
    def __init__(self, backend: str, model_path: str, max_adapters: int, max_lora_rank: int, dtype: str,
                 max_model_len: int, engine_args: dict[str, Any], seed: int, target_modules: tuple[str, ...]):
        import torch

        from actors.engines import make_engine

        if not ray.get_gpu_ids():
            torch.set_num_threads(max(1, int(os.environ.get("POPULORA_INFERENCE_THREADS", "1"))))
        hf_options = {"target_modules": tuple(target_modules)} if backend != "vllm" else {}
        self.engine = make_engine(backend, model_path, max_adapters=max_adapters, max_lora_rank=max_lora_rank,
                                  dtype=dtype, engine_args=engine_args or None, max_model_len=max_model_len,
                                  seed=seed, **hf_options)
        self._tmp = Path(tempfile.mkdtemp(prefix="populora-incoming-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))

    def __repr__(self) -> str:
        return "InferenceActor(inference)"

    def backend(self) -> str:
        return self.engine.backend

    def generate(self, requests: list[Any]) -> list[list[Any]]:
        return self.engine.generate(requests)

    def load_adapter_files(self, name: str, files: dict[str, bytes], version: int) -> None:
        incoming = self._tmp / f"{name}-v{version}"
        incoming.mkdir(parents=True, exist_ok=True)
        for filename, data in files.items():
            (incoming / filename).write_bytes(data)
        try:
            self.engine.load_adapter(name, incoming, version)
        finally:
            for file in incoming.iterdir():
                file.unlink()
            incoming.rmdir()

    def remove_adapter(self, name: str) -> None:
        self.engine.remove_adapter(name)

    def adapters(self) -> dict[str, int]:
        return self.engine.adapters()

    def close(self) -> None:
        """Free the engine and delete its adapter directories (called before the actor is killed)."""
        self.engine.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
