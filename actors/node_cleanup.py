"""What a node keeps of a run outside its processes, released by one task per node when a system stops.

Its own module, importing neither torch nor our actors: Ray runs the task in a fresh worker process, which imports
the module the function is defined in (``actors.system`` would pull torch, transformers and peft: ~8 s of CPU at
the end of every run and every recovery)."""

from __future__ import annotations

import contextlib
import os
import shutil

import ray

from learners.shared_base_paths import base_dir_for, release_base


@ray.remote(num_cpus=0)
def clean_node(paths: list[str], model_path: str | None = None, dtype: str = "float32") -> str:
    """On the node this task runs on, delete ``paths`` (what a killed engine left in /dev/shm: directories and shared-memory segments) and, given
    ``model_path``, the learners' shared base of that model in ``dtype`` (``learners.shared_base``: named from
    the model directory as this node sees it, so each node releases its own copy). Returns the node's id."""
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:  # a dead engine's shared-memory segment (inference.shared_memory)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    if model_path is not None:
        try:
            release_base(base_dir_for(model_path, dtype))
        except FileNotFoundError:  # this node does not see the model: no learner of it ran here
            pass
    return ray.get_runtime_context().get_node_id()
