"""The placement plan: which actor gets which GPUs and CPUs, and whether a cluster can hold it.

Pure planning (no Ray import): ``launch.py --dry-run`` prints it, and the system creates its actors
from it. The GPUs are numbered in order: inference replicas first, then the learner GPUs; on each
learner GPU the teacher and the student learner share one base copy (0.5 GPU each). The numbers are the
plan's, not a node's: on a cluster Ray puts each replica (its ``tp`` GPUs together) and each learner GPU
(one placement-group bundle, so the pair shares a node and a GPU) on any node with room.
Colocated (``resources.colocated``): GPU g holds inference replica g (0.5 of it) and learner pair g
(0.25 each); the fractions only make Ray put the three on one GPU, whose memory they share in turn
(``planning.memory_plan``), and each GPU is one placement-group bundle holding all of them.
Verifiers ask for the custom resource that marks CPU worker nodes; where no node has it they fall
back to the head's CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from configs.engines import EngineTraits
from configs.engines import planned_engine as planned_engine_traits
from configs.schema import Config


@dataclass(frozen=True)
class ActorPlan:
    """One actor to create: its Ray name, the resources it reserves and where it lands."""

    name: str
    role: str
    num_cpus: float
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    gpu_ids: tuple[int, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class ClusterView:
    """What a cluster offers: totals and per-node resource dicts (as ``ray.nodes()`` reports them)."""

    total: dict[str, float]
    nodes: list[dict[str, float]]
    source: str
    gpu_memory_bytes: int | None = None  # the smallest GPU's memory where it could be read (nvidia-smi), else None


@dataclass
class PlacementPlan:
    actors: list[ActorPlan]
    verifier_resource: str
    learner_shards: int
    colocated: bool = False  # every GPU holds an engine replica and a learner pair (resources.colocated)

    def by_role(self, role: str) -> list[ActorPlan]:
        return [a for a in self.actors if a.role == role]

    def shares_gpu(self, actor: ActorPlan) -> bool:
        """Whether ``actor`` shares its GPU with others (a learner pair; colocated, the engine too), so that they
        must land in one placement-group bundle (:meth:`gpu_bundle`)."""
        return bool(actor.gpu_ids) and (actor.role.startswith("learner") or self.colocated)

    def gpu_bundle(self, gpu: int) -> dict[str, float]:
        """The placement-group bundle of GPU ``gpu``: the whole GPU and the CPUs of every actor placed on it."""
        return {"GPU": 1.0, "CPU": sum(a.num_cpus for a in self.actors if gpu in a.gpu_ids)}

    def totals(self, verifier_on_workers: bool = True) -> dict[str, float]:
        """Resources the plan reserves (verifiers counted on their resource when workers carry it)."""
        need: dict[str, float] = {"CPU": 0.0, "GPU": 0.0}
        for actor in self.actors:
            need["CPU"] += actor.num_cpus
            need["GPU"] += actor.num_gpus
            for key, value in actor.resources.items():
                if key == self.verifier_resource and not verifier_on_workers:
                    continue
                need[key] = need.get(key, 0.0) + value
        return need

    def check(self, cluster: ClusterView) -> tuple[bool, list[str]]:
        """Whether ``cluster`` can hold the plan; a line per resource, and the verifier fallback."""
        on_workers = any(node.get(self.verifier_resource, 0) > 0 for node in cluster.nodes)
        lines = []
        if not on_workers:
            lines.append(
                f"no node carries the '{self.verifier_resource}' resource: verifiers fall back to the head's CPUs"
            )
        need = self.totals(verifier_on_workers=on_workers)
        ok = True
        for key, amount in need.items():
            if amount == 0:
                continue
            have = cluster.total.get(key, 0.0)
            fits = have + 1e-9 >= amount
            ok &= fits
            lines.append(f"{key}: need {amount:g}, have {have:g} ({'ok' if fits else 'NOT ENOUGH'})")
        if need.get("GPU", 0):
            fits, line = self.gpus_per_node([n.get("GPU", 0) for n in cluster.nodes])
            ok &= fits
            lines.append(line)
        return ok, lines

    def gpus_per_node(self, node_gpus: list[float]) -> tuple[bool, str]:
        """Whether the GPU actors can be laid out on nodes with these GPU counts, and a line saying how.

        Each engine replica takes its ``tp`` GPUs on one node, each learner GPU (its teacher/student pair) one
        GPU of one node. With replicas of equal size a node holds ``floor(G_n / tp)`` of them whatever the
        others do, so the replicas fit iff ``R <= sum_n floor(G_n / tp)``; the learner GPUs, one each, then
        fit in any GPUs left (the total, checked beside)."""
        replicas = [a for a in self.by_role("inference") if a.num_gpus]
        tp = len(replicas[0].gpu_ids) if replicas else 1  # GPUs a replica spans (colocated: a share of one)
        room = sum(int(g + 1e-9) // tp for g in node_gpus)
        learner_gpus = len({a.gpu_ids[0] for a in self.actors if a.role.startswith("learner") and a.gpu_ids})
        gpu_nodes = [g for g in node_gpus if g > 0]
        where = ("no node with GPUs" if not gpu_nodes else f"one GPU node ({gpu_nodes[0]:g} GPUs)" if len(gpu_nodes) == 1
                 else f"{len(gpu_nodes)} GPU nodes ({', '.join(f'{g:g}' for g in gpu_nodes)} GPUs)")
        if len(replicas) > room:
            return False, (f"GPU per node: {len(replicas)} engine replicas of tensor_parallel_size {tp} need {tp} GPUs "
                           f"on one node each; {where}: room for {room} (NOT ENOUGH)")
        return True, (f"GPU per node: {len(replicas)} engine replica(s) of {tp} GPU(s) and {learner_gpus} learner "
                      f"GPU(s) on {where}, each replica and each learner pair on one node (ok)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "actors": [
                {
                    "name": a.name,
                    "role": a.role,
                    "num_cpus": a.num_cpus,
                    "num_gpus": a.num_gpus,
                    "resources": a.resources,
                    "gpu_ids": list(a.gpu_ids),
                    "note": a.note,
                }
                for a in self.actors
            ],
            "totals": self.totals(),
        }

    def render(self) -> str:
        """A table of the actors; the verifier pool is one row (its actors are identical)."""
        rows = [f"{'actor':<24}{'CPU':>6}{'GPU':>6}  placement"]
        verifiers = self.by_role("verifier")
        for a in self.actors:
            if a.role == "verifier" and a is not verifiers[0]:
                continue
            name = a.name if a.role != "verifier" else f"verifier-0..{len(verifiers) - 1} (x{len(verifiers)})"
            where = f"GPU {','.join(map(str, a.gpu_ids))}" if a.gpu_ids else "CPU"
            extra = "".join(f" +{k}:{v:g}" for k, v in a.resources.items())
            rows.append(f"{name:<24}{a.num_cpus:>6g}{a.num_gpus:>6g}  {where}{extra}  {a.note}".rstrip())
        return "\n".join(rows)


COLOCATED_ENGINE_SHARE = 0.5
"""Ray's GPU share of a colocated engine replica; its GPU's learners take the rest (a logical split that puts
them on one GPU, not a memory split)."""


def planned_engine(config: Any, on_gpus: bool) -> EngineTraits:
    """The traits of the engine a plan assumes (``configs.engines.planned_engine``): the one ``inference.backend``
    names, or with ``auto`` vLLM on GPUs and the transformers engine on CPU. The planners read its traits, never
    its name."""
    return planned_engine_traits(config.inference.backend, on_gpus)


def learner_shard_names(role: str, shards: int) -> list[str]:
    """``learner-<role>`` for one shard, ``learner-<role>-<g>`` for one per learner GPU.

    Roles: ``teacher`` and ``student``; ``agent`` for the single-agent baseline's one adapter.
    """
    return [f"learner-{role}"] if shards <= 1 else [f"learner-{role}-{g}" for g in range(shards)]


def plan_placement(config: Config) -> PlacementPlan:
    """Lay out the actors of ``config`` (see the module docstring for the rules)."""
    res = config.resources
    actors: list[ActorPlan] = []
    colocated = res.colocated and bool(res.inference_gpus)
    roles = ("agent",) if config.population.single_agent else ("teacher", "student")

    replicas = max(1, res.inference_gpus // res.tensor_parallel_size) if res.inference_gpus else 1
    gpu = 0
    for i in range(replicas):
        name = "inference" if replicas == 1 else f"inference-{i}"
        if res.inference_gpus:
            ids = tuple(range(gpu, gpu + res.tensor_parallel_size))
            gpu += res.tensor_parallel_size
            engine = planned_engine(config, on_gpus=True)
            note = (f"{engine.label}, tensor_parallel_size={res.tensor_parallel_size}, every adapter"
                    if engine.tensor_parallel else f"{engine.label}, every adapter")
            share = float(len(ids))
            if colocated:
                share = COLOCATED_ENGINE_SHARE
                note = (f"{engine.label}, every adapter; sleeps while this GPU's learners train" if engine.sleep_mode else
                        f"{engine.label}, every adapter; stays awake beside this GPU's learners (no sleep mode)")
            actors.append(ActorPlan(name, "inference", res.inference_cpus, share, gpu_ids=ids, note=note))
        else:
            actors.append(ActorPlan(name, "inference", res.inference_cpus, note=f"{config.inference.backend} backend on CPU"))

    shards = max(1, res.learner_gpus)
    first_learner_gpu = 0 if colocated else gpu  # colocated: learner pair g beside replica g
    learner_share = (1.0 - COLOCATED_ENGINE_SHARE) if colocated else 1.0
    for shard in range(shards):
        gpu_ids = (first_learner_gpu + shard,) if res.learner_gpus else ()
        for role in roles:
            name = learner_shard_names(role, shards)[shard]
            share = learner_share / len(roles) if res.learner_gpus else 0.0
            note = "shares this GPU's base copy (CUDA IPC)" if res.learner_gpus else "shares the base in shared memory"
            if role == "agent":
                note = "the single agent's adapter (proposes and solves)"
            actors.append(ActorPlan(name, f"learner-{role}", res.learner_cpus, share, gpu_ids=gpu_ids, note=note))

    for i in range(config.verifier.actors):
        actors.append(
            ActorPlan(
                f"verifier-{i}",
                "verifier",
                config.verifier.cpus_per_actor,
                resources={config.verifier.resource: 1.0},
                note="sandboxed execution",
            )
        )
    actors.append(ActorPlan("league", "league", 0.0, note="ratings, PFSP, buffers, evolution, lineage"))
    return PlacementPlan(actors, config.verifier.resource, shards, colocated=colocated)
