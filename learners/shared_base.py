"""The frozen base, materialised once per machine and mapped by every learner process without a copy.

CPU: the weights (and buffers, e.g. rotary ``inv_freq``) are written once into one flat file in a
RAM-backed directory (``/dev/shm``), each tensor 64-byte aligned, with a JSON manifest (name, dtype,
shape, byte offset), the tied-weight aliases, and ``config.json``. A learner process maps the file with
``torch.from_file(..., shared=False)``, a private copy-on-write mapping: its pages are the page-cache
pages of the file, shared by every process that maps it (PSS splits them), and a write could only ever
change the writer's own copy, never the shared one. The model is built on the ``meta`` device and its
parameters are replaced by views into the mapping, so no process holds a private copy of the base.

GPU: an owner process copies the same flat bytes into one CUDA buffer once and hands out a CUDA IPC
handle (``torch.multiprocessing.reductions.reduce_tensor``); each learner rebuilds the buffer from the
handle on its local device index (matched by GPU UUID, since ``CUDA_VISIBLE_DEVICES`` differs between
processes) and takes the same views. The owner must stay alive while any learner maps it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from learners.shared_base_paths import base_dir_for, release_base  # noqa: F401  (release_base: part of this API)

MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
ALIGN = 64
FORMAT = "populora-shared-base-v1"
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool)}


def _canonical_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every distinct parameter and buffer by its first name, and alias name -> first name (tied weights)."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first_name: dict[int, str] = {}
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, t in named:
        if id(t) in first_name:
            aliases[name] = first_name[id(t)]
        else:
            first_name[id(t)] = name
            tensors[name] = t.detach()
    return tensors, aliases


def write_base(model: nn.Module, out_dir: str | os.PathLike) -> Path:
    """Write ``model``'s parameters and buffers as a flat, aligned weights file + manifest + config into ``out_dir``.

    Tensors are copied one at a time into the file's mapping, so writing needs no second copy in memory.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors, aliases = _canonical_tensors(model)
    entries: dict[str, dict] = {}
    offset = 0
    for name, t in tensors.items():
        if t.device.type == "meta":
            raise ValueError(f"tensor {name!r} is on the meta device: load real weights before sharing the base")
        if str(t.dtype) not in _DTYPES:
            raise TypeError(f"tensor {name!r} has unsupported dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        entries[name] = {"dtype": str(t.dtype), "shape": list(t.shape), "offset": offset, "nbytes": nbytes}
        offset += -(-nbytes // ALIGN) * ALIGN
    total = max(offset, ALIGN)
    flat = torch.from_file(str(out / WEIGHTS), shared=True, size=total, dtype=torch.uint8)
    for name, t in tensors.items():
        e = entries[name]
        view = flat[e["offset"] : e["offset"] + e["nbytes"]].view(t.dtype).view(t.shape)
        view.copy_(t)
    del flat
    model.config.save_pretrained(out)
    (out / MANIFEST).write_text(json.dumps({"format": FORMAT, "bytes": total, "tensors": entries, "aliases": aliases}))
    return out


def materialise_base(
    model_dir: str | os.PathLike,
    dtype: torch.dtype | None = None,
    shm_dir: str | os.PathLike | None = None,
) -> Path:
    """The shared-base directory for ``model_dir`` on this machine, writing it if no process has yet.

    Safe to call from several processes at once: a file lock serialises them and the first one writes
    (into a temporary directory renamed into place), the others reuse the result. The name is derived
    from the model directory's path, file sizes and mtimes and the dtype, so a changed model gets a new
    copy. Returns the directory to pass to :func:`map_base`.
    """
    from transformers import AutoModelForCausalLM

    src = Path(model_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a Hugging Face model directory (no config.json)")
    target = base_dir_for(src, dtype, shm_dir)
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MANIFEST).is_file():
            return target
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype if dtype is not None else "auto")
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}-"))
        try:
            write_base(model, tmp)
            del model
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def read_manifest(base_dir: str | os.PathLike) -> dict:
    path = Path(base_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {base_dir} is not a shared base (call materialise_base first)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown shared-base format {manifest.get('format')!r}")
    return manifest


def build_on_tensors(base_dir: str | os.PathLike, flat: torch.Tensor) -> nn.Module:
    """The causal LM of ``base_dir`` built on ``meta`` with every parameter/buffer a view into ``flat`` (uint8).

    Tied weights share one ``nn.Parameter``; every parameter has ``requires_grad=False``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    manifest = read_manifest(base_dir)
    if flat.dtype != torch.uint8 or flat.numel() < manifest["bytes"]:
        raise ValueError(f"flat base buffer must be uint8 with >= {manifest['bytes']} bytes")
    config = AutoConfig.from_pretrained(base_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    views: dict[str, torch.Tensor] = {}
    for name, e in manifest["tensors"].items():
        views[name] = flat[e["offset"] : e["offset"] + e["nbytes"]].view(_DTYPES[e["dtype"]]).view(e["shape"])
    params: dict[str, nn.Parameter] = {}
    missing = []
    for name, current in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        source = manifest["aliases"].get(name, name)
        if source not in views:
            missing.append(name)
            continue
        if tuple(views[source].shape) != tuple(current.shape):
            raise ValueError(f"{name}: shared tensor shape {tuple(views[source].shape)} != model's {tuple(current.shape)}")
        module_path, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_path)
        if leaf in module._parameters:
            if source not in params:
                params[source] = nn.Parameter(views[source], requires_grad=False)
            module._parameters[leaf] = params[source]
        else:
            module._buffers[leaf] = views[source]
    if missing:
        raise KeyError(f"shared base lacks tensors the model needs: {missing[:5]}")
    return model.eval()


def map_base(base_dir: str | os.PathLike) -> nn.Module:
    """Build the frozen causal LM on a read-only (copy-on-write) mapping of the shared CPU weights."""
    manifest = read_manifest(base_dir)
    flat = torch.from_file(str(Path(base_dir) / WEIGHTS), shared=False, size=manifest["bytes"], dtype=torch.uint8)
    return build_on_tensors(base_dir, flat)


def _local_cuda_index(uuid: str) -> int:
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    raise RuntimeError(f"GPU {uuid} that holds the shared base is not visible to this process")


class CudaBaseOwner:
    """Holds the base's flat bytes in one CUDA buffer and exports a CUDA IPC handle to it.

    Keep this object (and its process) alive while any learner uses the mapping; ``close()`` frees it.
    """

    def __init__(self, base_dir: str | os.PathLike, device: str | torch.device = "cuda") -> None:
        manifest = read_manifest(base_dir)
        self.base_dir = str(base_dir)
        host = torch.from_file(str(Path(base_dir) / WEIGHTS), shared=False, size=manifest["bytes"], dtype=torch.uint8)
        self.flat: torch.Tensor | None = host.to(device)
        self.device_uuid = str(torch.cuda.get_device_properties(self.flat.device).uuid)

    def handle(self) -> dict:
        """A picklable handle (send it through Ray or a pipe) for :func:`map_cuda_base`."""
        from torch.multiprocessing.reductions import reduce_tensor

        if self.flat is None:
            raise RuntimeError("this CudaBaseOwner is closed")
        _, args = reduce_tensor(self.flat)
        return {"base_dir": self.base_dir, "device_uuid": self.device_uuid, "ipc_args": args}

    def close(self) -> None:
        self.flat = None
        torch.cuda.ipc_collect()


def map_cuda_base(handle: dict) -> nn.Module:
    """Build the frozen causal LM on the owner's CUDA buffer (no copy), from :meth:`CudaBaseOwner.handle`."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = list(handle["ipc_args"])
    args[6] = _local_cuda_index(handle["device_uuid"])  # the owner's device index means nothing here
    flat = rebuild_cuda_tensor(*args)
    return build_on_tensors(handle["base_dir"], flat)
