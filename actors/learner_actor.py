"""A learner actor: a thin Ray shell over ``learners.PolicyLearner`` for the members of one role.

The frozen base is mapped from the machine's shared copy (``learners.shared_base``: one file in
``/dev/shm`` that every learner process maps without a private copy); on a GPU the first learner of
that GPU copies it into one CUDA buffer and the other maps that buffer through a CUDA IPC handle.
It is then wrapped with one LoRA slot per owned member. Members are addressed by id; the slot table maps ids to slots, and evolution
re-labels the victim's slot with the child's id. With ``rl.data_parallel`` every learner of a role is a replica
holding all the role's members (same slot table, same seed): :meth:`LearnerActor.share`, ``share_gradients`` and
``apply_gradients`` run one step split across the replicas (``actors.system.train_replicas``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ray


@ray.remote(max_restarts=0)  # stateful: the driver recovers it from a checkpoint (actors.driver)
class LearnerActor:
    def __init__(self, model_path: str, members: list[str], settings: Any, seed: int,
                 cuda_base: dict[str, Any] | None = None, base_name: str = ""):
        """``settings``: a ``learners.settings.LearnerSettings`` (``LearnerSettings.from_config(config, role)``).
        ``base_name``: what every adapter written names as its base (``planning.model_files.base_model_name``;
        default ``model_path``), so a checkpointed adapter loads outside the run."""
        from actors.cluster import actor_device, deterministic_torch, route_actor_output

        route_actor_output("learner")  # before any import prints
        import torch
        from transformers import AutoTokenizer

        from learners.adapter_optim import AdapterOptimizers
        from learners.multi_lora import MultiLoRAModel
        from learners.policy_learner import PolicyLearner
        from learners.shared_base import CudaBaseOwner, build_on_tensors, map_base, map_cuda_base, materialise_base

        on_gpu = actor_device() == "cuda"  # False in the CPU stand-in mode, whatever Ray gave
        deterministic_torch(on_gpu)  # POPULORA_DETERMINISTIC (gpu_check/system.py)
        if not on_gpu:
            torch.set_num_threads(max(1, int(os.environ.get("POPULORA_LEARNER_THREADS", "1"))))
        torch.manual_seed(seed)
        self.slots = {member: i for i, member in enumerate(members)}
        self.advantage_baseline = settings.advantage_baseline
        self.importance_correction = settings.importance_correction
        self.versions = {member: 0 for member in members}
        self._step: tuple[Any, dict[str, dict[str, float]]] | None = None  # a data-parallel share in progress
        self._share_index = 0  # its index among the replicas
        self.base_name = base_name or str(Path(model_path).resolve())
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.base_dir = base_dir = materialise_base(model_path, getattr(torch, settings.dtype))
        self.base_owner = None
        if not on_gpu:
            base = map_base(base_dir)  # the machine's one copy in /dev/shm, mapped without a private copy
        elif cuda_base is None:  # the first learner on this GPU holds the base; the others map it by IPC
            self.base_owner = CudaBaseOwner(base_dir)
            base = build_on_tensors(base_dir, self.base_owner.flat)
        else:
            base = map_cuda_base(cuda_base)
        self._base_allocated = int(torch.cuda.memory_allocated()) if on_gpu else None  # ``tensor_devices``
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.model = MultiLoRAModel(base, settings.lora_spec(len(members)), init_b_std=settings.init_std, seed=seed,
                                    device=device)
        optimizers = AdapterOptimizers(self.model, lr=settings.learning_rate, weight_decay=settings.weight_decay,
                                       grad_clip=settings.grad_clip)
        self.learner = PolicyLearner(
            self.model, optimizers, settings.loss, settings.update_for("cuda" if on_gpu else "cpu"),
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0,
        )
        # what this process holds on its device once built, before any step (``tensor_devices``)
        self._constructed_allocated = int(torch.cuda.memory_allocated()) if on_gpu else None

    def __repr__(self) -> str:
        return f"LearnerActor({ray.get_runtime_context().get_actor_name()})"

    def ready(self) -> bool:
        return True

    def release_memory(self) -> int:
        """Return the caching allocator's free segments to the GPU (colocated: before this GPU's engine wakes). What
        stays: the base, adapters, AdamW moments, and segments that still hold a live block (measured, docs/memory.md).
        Returns the bytes still reserved (0 on CPU)."""
        import gc

        import torch

        from actors.cluster import actor_device

        if actor_device() == "cpu":
            return 0
        gc.collect()
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_reserved())

    def tensor_devices(self) -> dict[str, Any]:
        """Where this learner's tensors are, read inside its process (``gpu_check/system.py`` asks during a run):
        ``devices`` of every parameter and buffer of its model (the frozen base and the LoRA slots) and of its
        optimizer states (AdamW's scalar step counters stay on the CPU by torch's design and are not counted);
        ``base_bytes`` (the shared base's size), ``base_span`` (the bytes from the first to the end of the last
        frozen tensor: at most ``base_bytes`` when they are all views of one copy), ``base_held`` (how this process
        holds it), ``in_shared_file`` (CPU: every frozen tensor inside the mapping of the machine's one base file);
        ``allocated_after_base`` and ``allocated_after_construction``: ``torch.cuda.memory_allocated()`` once the base
        was held and when ``__init__`` ended, before any step; ``own_bytes``: what its LoRA slots take in the caching
        allocator (each tensor rounded up to its 512-byte blocks), so that ``allocated_after_construction - own_bytes``
        is what construction added besides them (None on CPU: the CPU path's proof is ``in_shared_file``)."""
        import psutil
        import torch

        from learners.shared_base import WEIGHTS, read_manifest

        frozen = {t.data_ptr(): t for t in [p for p in self.model.parameters() if not p.requires_grad]
                  + list(self.model.buffers())}
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        for opt in self.learner.optimizers.optimizers:
            tensors += [v for state in opt.state.values() for v in state.values()
                        if isinstance(v, torch.Tensor) and v.dim() > 0]
        starts = list(frozen)
        ends = [ptr + t.numel() * t.element_size() for ptr, t in frozen.items()]
        on_gpu = self._constructed_allocated is not None
        in_file = None
        if not on_gpu:
            mapped = [(int(m.addr.split("-")[0], 16), int(m.addr.split("-")[1], 16))
                      for m in psutil.Process().memory_maps(grouped=False) if m.path.endswith(WEIGHTS)]
            in_file = all(any(lo <= ptr and end <= hi for lo, hi in mapped) for ptr, end in zip(starts, ends))
        held = ("a mapping of the machine's base file in /dev/shm" if not on_gpu
                else "its own CUDA copy, shared by IPC" if self.base_owner is not None
                else "a CUDA IPC mapping of another learner's copy")
        return {"devices": sorted({str(t.device) for t in tensors}), "pid": os.getpid(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "base_bytes": int(read_manifest(self.base_dir)["bytes"]), "base_span": max(ends) - min(starts),
                "base_held": held, "in_shared_file": in_file,
                "allocated_after_base": self._base_allocated, "allocated_after_construction": self._constructed_allocated,
                "own_bytes": sum(-(-p.numel() * p.element_size() // 512) * 512 for p in self.model.parameters()
                                 if p.requires_grad),
                "allocated_now": int(torch.cuda.memory_allocated()) if on_gpu else None}

    def cuda_base_handle(self) -> dict[str, Any] | None:
        """The CUDA IPC handle of the base this learner owns on its GPU (None on CPU)."""
        return self.base_owner.handle() if self.base_owner is not None else None

    def members(self) -> list[str]:
        return list(self.slots)

    def owns(self, member: str) -> bool:
        return member in self.slots

    def train(self, samples: list[Any]) -> dict[str, dict[str, float]]:
        """One update of every owned member present in ``samples`` (rollouts.Sample); stats per member id.

        With ``rl.importance_correction: tis`` each sample carries its behaviour log-probs to the loss; a
        sample whose log-probs are missing or misaligned is dropped and counted (``rollouts.learner_samples``:
        ``dropped_behaviour``, ``behind``); a member left with no sample is not updated.
        """
        batch, extra = self._learner_batch(samples)
        return self._member_stats(self.learner.step(batch) if batch else {}, extra)

    def share(self, samples: list[Any], index: int, shares: int) -> dict[str, dict[str, float]]:
        """Data parallel (``rl.data_parallel``): start replica ``index``'s share of a step split over ``shares``
        replicas of this role's members. ``samples`` are ALL the role's samples of the step (one object-store
        copy for every replica); each replica converts them as :meth:`train` does, and takes its share of one
        split with the whole step's targets (``PolicyLearner.share_of``). The no-grad passes run now; then per
        epoch :meth:`share_gradients` and :meth:`apply_gradients`. Returns {} (the stats come with the last apply)."""
        batch, extra = self._learner_batch(samples)
        self._step = (self.learner.share_of(batch, index, shares), extra)
        self._share_index = index
        return {}

    def share_gradients(self) -> Any:
        """One epoch of this replica's share: its per-slot gradients (flat float32 on the CPU) and the statistics'
        sums, a ``learners.data_parallel.SlotGradients`` that Ray puts into the object store once."""
        return self._pending_share()[0].gradients()

    def apply_gradients(self, *parts: Any) -> Any:
        """Sum every replica's :meth:`share_gradients` of this epoch (``parts`` in replica order, so every replica
        adds the same bits) and step with the sum. Returns a ``learners.data_parallel.AppliedGradients``: after
        every epoch the fingerprint of each member the apply concerned (``AdapterOptimizers.fingerprint``, taken
        on the learner's device), after the last one also the per-member stats (as :meth:`train`'s). Replicas
        report the same (``System.finish_training`` compares them: ``check_replicas``)."""
        from learners.data_parallel import AppliedGradients, sum_gradients

        share, extra = self._pending_share()
        summed = sum_gradients(parts)
        stats = self.learner.apply_gradients(summed)
        by_slot = {slot: member for member, slot in self.slots.items()}
        held = self.learner.optimizers.fingerprint(set(summed.grads) | set(summed.sums))
        epochs = self.learner.update_config.epochs
        name = ray.get_runtime_context().get_actor_name() or repr(self)
        report = AppliedGradients(f"{name} (share {self._share_index})",
                                  epochs - share.epochs_left, epochs, {by_slot[a]: h for a, h in held.items()})
        if not share.epochs_left:
            self._step = None
            report.stats = self._member_stats(stats, extra)
        return report

    def _pending_share(self) -> tuple[Any, dict[str, dict[str, float]]]:
        if self._step is None:
            raise RuntimeError(f"{self!r}: no data-parallel share is in progress (share() was not called or failed)")
        return self._step

    def _learner_batch(self, samples: list[Any]) -> tuple[list[Any], dict[str, dict[str, float]]]:
        """``samples`` as the learner's, with the members' extra statistics (``rollouts.learner_samples``);
        a sample of a member this learner does not own is an error."""
        from rollouts import learner_samples

        unowned = sorted({s.member for s in samples} - set(self.slots))
        if unowned:
            raise ValueError(f"{self!r} got samples of {unowned}, members it does not own (it owns {sorted(self.slots)}): "
                             "the driver's member table and the learners disagree")
        return learner_samples(samples, self.slots, self.versions, self.advantage_baseline, self.importance_correction)

    def _member_stats(self, stats: dict[int, dict[str, float]], extra: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """Per-slot stats of an update as per-member stats with the extras; each stepped member's version + 1."""
        by_slot = {slot: member for member, slot in self.slots.items()}
        for slot in stats:
            self.versions[by_slot[slot]] += 1
        out = {by_slot[slot]: {k: round(v, 6) for k, v in st.items()} for slot, st in stats.items()}
        for member, values in extra.items():
            out.setdefault(member, {}).update(values)
        return out

    def export(self, members: list[str] | None = None, dtype: str = "float32") -> dict[str, tuple[int, list[ray.ObjectRef]]]:
        """Publish each member (all owned ones by default): its PEFT files in ``dtype`` (the serving dtype,
        the engine's ``model.dtype``) put once into the object store, as read-only numpy views.

        Returns member -> (version, [ref]). The ref sits in a list so Ray hands it to the caller unresolved:
        the driver receives references only and passes the same one to every engine replica.
        """
        import numpy as np
        import torch

        from learners.peft_io import adapter_files

        out = {}
        for member in members if members is not None else list(self.slots):
            if member not in self.slots:
                continue
            files = adapter_files(self.model, self.slots[member], getattr(torch, dtype), self.base_name)
            payload = {name: np.frombuffer(data, dtype=np.uint8) for name, data in files.items()}
            out[member] = (self.versions[member], [ray.put(payload)])
        return out

    def state_dict(self, member: str) -> dict[str, Any]:
        """PEFT-keyed state dict of one member (what the evolution operators take)."""
        from learners.peft_io import slot_state_dict

        return slot_state_dict(self.model, self.slots[member])

    def replace(self, victim: str, child: str, state: dict[str, Any]) -> None:
        """Evolution: the child takes the victim's slot (weights in place, fresh optimizer state). ``state``
        arrives from the league actor by object reference (resolved here by Ray), never through the driver."""
        from learners.peft_io import load_slot_state_dict

        slot = self.slots.pop(victim)
        self.versions.pop(victim)
        load_slot_state_dict(self.model, slot, state)
        self.learner.optimizers.reset(slot)
        self.slots[child] = slot
        self.versions[child] = 0

    def checkpoint(self, checkpoint_dir: str, token: str, subdir: str) -> dict[str, dict[str, Any]]:
        """Write this learner's state into ``checkpoint_dir/subdir`` (the driver's temporary checkpoint
        directory, which ``token`` proves this process sees): ``adapters/<member>/`` PEFT directories
        (float32 master weights), optimizer states, torch RNG, slot table; synced. Returns the manifest
        entries (size, SHA-256) of the files written, by path relative to ``checkpoint_dir/subdir``."""
        import torch

        from checkpoints import check_checkpoint_dir, fsync_tree, tree_digests

        check_checkpoint_dir(Path(checkpoint_dir), token, repr(self))
        root = Path(checkpoint_dir) / subdir
        root.mkdir(parents=True, exist_ok=True)
        for member, slot in self.slots.items():
            self.learner.save_adapter(slot, root / "adapters" / member, self.base_name)
        torch.save(self.learner.optimizers.state_dict(), root / "optimizers.pt")
        torch.save(torch.get_rng_state(), root / "torch_rng.pt")
        (root / "slots.json").write_text(json.dumps({"slots": self.slots, "versions": self.versions}))
        fsync_tree(root)
        return tree_digests(root)

    def restore(self, checkpoint_dir: str, token: str, subdir: str) -> None:
        """Load the state ``checkpoint`` wrote into ``checkpoint_dir/subdir``."""
        import torch

        from checkpoints import check_checkpoint_dir

        check_checkpoint_dir(Path(checkpoint_dir), token, repr(self))
        root = Path(checkpoint_dir) / subdir
        if not (root / "slots.json").is_file():
            raise FileNotFoundError(f"{root}/slots.json not found: the checkpoint holds no state for {self!r}")
        table = json.loads((root / "slots.json").read_text())
        self.slots, self.versions = table["slots"], table["versions"]
        for member, slot in self.slots.items():
            self.learner.load_adapter(slot, root / "adapters" / member)
        # Onto the CPU first: a checkpoint written on a GPU then restores on any machine; the optimizers' own
        # load_state_dict moves each state tensor to its parameter's device.
        self.learner.optimizers.load_state_dict(torch.load(root / "optimizers.pt", weights_only=False, map_location="cpu"))
        torch.set_rng_state(torch.load(root / "torch_rng.pt", weights_only=False, map_location="cpu"))
