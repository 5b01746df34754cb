"""The time plan: expected seconds of every phase of a step on each device group, for a described cluster.

Pure arithmetic beside the memory plan (no Ray, no torch): from the config, the model's widths
(``planning.memory_plan.ModelDims``), the expected lengths (``planning.lengths``: ``plan.*`` config keys or a
finished run's ``metrics.jsonl``) and the rates of ``planning.time_constants``. The cluster is described, not probed: the
dry run on a laptop plans the 8-GPU node the config names (``--cluster 2x8xH100`` plans others).

Per step, with T teachers of ``tasks_per_teacher`` proposals each, a valid fraction v and k rollouts:

    proposals  n_p = T x tasks_per_teacher            rollouts  n_s = n_p x v x k
    teacher tokens  n_p (prompt_p + proposal)         student tokens  n_s (prompt_s + answer)

- **generation** on R = inference GPUs / tp replicas, the requests handed out in pieces as replicas free up
  (``System.generate``, ``planning.dispatch``; one piece per replica, the even split ceil(requests / R), below two
  full batches per replica): prefill ``2 N x prompt tokens / (peak x prefill_mfu)`` (a student prompt prefilled
  once for its k rollouts on vLLM, whose prefix cache shares it; once per row on the transformers engine), decode
  ``2 N x new tokens / (peak x decode_mfu x (1 - lora_overhead))``, each over R, plus the steps: each decode step
  reads every weight once (``weight bytes / memory bandwidth``), and the busiest replica takes
  ``(W - 1) x new + max_tokens`` of them. Its n sequences of a phase decode c at once, in W = ceil(n / c) waves: with
  a paged KV cache c = max(1, min(n, max_num_seqs, P // t)), P the tokens the cache holds and t the phase's expected
  tokens per sequence (``planning.memory_plan.PagedKV``); the transformers engine decodes all n at once (W = 1).
  Continuous batching refills a slot as its sequence ends, so each wave but the last takes the expected new tokens
  and the last the longest row's ``max_tokens`` (W = 1: the longest row alone). Plus the replicas' imbalance
  ``(1 - 1/R) x G / (2 R k)`` (``planning.dispatch.imbalance_s``: G the prefill and decode seconds on one replica,
  k the pieces per replica; the replicas' last pieces end about half a piece apart on average);
- **verification**: executions (a proposal runs twice, a code_f one per input; an answer once per hidden
  input) / (tasks per core-second x the verifiers' cores);
- **training** on the learner GPUs: each GPU trains the members placed on it (member i on shard i mod shards,
  the teacher and student learners of a GPU sharing its compute; on CPU each learner is its own process), ``tokens x F / (peak x
  train_mfu)`` with ``F = (4 + 2 [checkpointing]) N x epochs + 2 N [KL] + 2 N [epochs > 1] + 6 N_lora``;
  the step waits for the busiest GPU. With ``rl.data_parallel`` every GPU trains total / shards tokens
  (``learners.data_parallel.split_by_tokens``: equal within one sample) and each epoch adds the gradient
  exchange: every replica reads, per role, at most (members + shards - 1) float32 member gradients (the split
  cuts at most shards - 1 members) through the object store, at the adapter hand-over's bandwidth;
- **hand-over**: each updated adapter (serving dtype) to every replica, the replicas loading in parallel from
  one object-store copy: members x (bytes / bandwidth + one swap);
- **league** (constant), **evolution** (two children every E steps, seconds per child proportional to its
  parameters), **checkpoint** (adapters + AdamW state every ``checkpoint_every`` steps), **evaluation**
  (every ``eval.every`` steps: each benchmark problem decoded by every member and the base, every answer
  ``eval.max_tokens`` long: ``W x eval.max_tokens`` steps, the benchmarks' calls counted as one).

The phases run in turn (``actors/loop.py``), so the step is their sum and a group's busy fraction is its
phases' seconds over the step; the critical phase is the longest. Colocated layouts (``resources.colocated``)
give every GPU to each phase and add one ``switch`` per step: vLLM engines sleep before the update and wake
after it (``sleep_wake_s``); the transformers engine has no sleep mode and stays awake, so its switch is 0 s.

**The engine** (``planned_engine``: vLLM where the config asks for it or ``auto`` on GPUs, else the transformers
engine). The generation constants of a GPU kind are vLLM's (cited or measured with vLLM); the transformers engine's
are not built in (docs/time.md has one H200's), so a transformers engine on a GPU is planned at the kind's rates and the plan says so
(:attr:`TimePlan.notes`): a lower bound, since a small model's decode steps are bound by per-step overhead (kernel
launches, Python) that the rates and the weight-read tail do not count. ``planning/calibrate.py`` on the node
measures the engine's own (a constants file of the ``hf`` engine replaces them).

**Overlapped steps** (``run.max_staleness: 1``, :class:`Overlap`): the engines generate step t+1 (the
phases of ``actors.loop.generate_rollouts``: league, propose, validate, solve, judge; seconds G) while the
learners train on step t (T); handover, evolve, checkpoint, evaluate and the colocated switch overlap
nothing (R). The pipeline drains after checkpoint steps, evolution steps and the last step
(``actors.loop.drains_after``): the step after a drain generates before it trains, and the last step trains
alone. Over N steps of which D drain (the last one included) that is N (max(G, T) + R) + D min(G, T), so

    overlapped step = max(G, T) + f min(G, T) + R,   f = D / N (the drained fraction)
    serial step = G + T + R,   speed-up = serial / overlapped,   bound = 1 + min(G, T) / max(G, T)

(the bound is the speed-up with f = 0 and R = 0: the most overlap can give). A colocated layout cannot
overlap (engines and learners take the same GPUs in turn): its overlapped step is its serial one.

On CPU the learner processes (teacher, student) run on their own cores unless ``learner_cores`` says how many
they share: then they time-share them and train = max(busiest learner, all learners' work / learner_cores).

**The ranking** (:func:`choose_layout`): every way to run the described cluster is one candidate, a GPU split
(:func:`candidate_layouts`: engines + learners, and the colocated layout) times a :class:`RunMode` (serial or
overlapped, data parallel off or on), each planned with its own memory plan (the ``unfit`` callback: data
parallel puts every member of a role on every learner GPU). A mode that cannot run on a layout (overlap on the
colocated layout, data parallel with one learner GPU) is listed with the reason, never recommended. A
candidate's step is its wall-clock step (:attr:`TimePlan.wall_s`: overlapped where the mode overlaps), and its
GPU busy fraction the GPU-seconds of generation and training over that step times the GPUs. The recommendation
is the fastest runnable candidate, with every key it needs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from planning.lengths import Lengths, RunRecordError, lengths_from_config, lengths_from_run, sequence_tokens
from planning.memory_plan import DTYPE_BYTES, EVAL_PROBLEMS_DEFAULT, GiB, ModelDims, PagedKV, lora_params, paged_kv
from configs.engines import engine_traits
from planning.dispatch import imbalance_s, piece_count, replica_batch_rows
from planning.placement import planned_engine
from planning.time_constants import DEVICE_KINDS, HOST, DeviceKind, HostConstants, Sourced

GENERATION_NEEDS = ("peak_flops", "memory_bandwidth", "prefill_mfu", "decode_mfu", "lora_decode_overhead")
TRAINING_NEEDS = ("peak_flops", "train_mfu")


class ClusterError(ValueError):
    """A cluster description that cannot be read (``--cluster NODESxGPUSxKIND``)."""


@dataclass(frozen=True)
class Cluster:
    """What the plan is for: ``nodes`` nodes of ``gpus_per_node`` GPUs of one kind (0 GPUs: CPU only)."""

    nodes: int
    gpus_per_node: int
    kind: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def parse(cls, text: str) -> "Cluster":
        """``8xH100`` (one node) or ``2x8xH100`` (two nodes of eight)."""
        match = re.fullmatch(r"(?:(\d+)x)?(\d+)x([A-Za-z0-9_-]+)", text.strip())
        if not match:
            raise ClusterError(f"--cluster {text!r}: write GPUSxKIND or NODESxGPUSxKIND, e.g. 8xH100 or 2x8xH100")
        nodes, gpus, kind = int(match.group(1) or 1), int(match.group(2)), match.group(3)
        if nodes < 1 or gpus < 1:
            raise ClusterError(f"--cluster {text!r}: nodes and GPUs per node must be at least 1")
        return cls(nodes, gpus, kind)

    def __str__(self) -> str:
        if not self.gpus:
            return "CPU"
        return f"{self.nodes}x{self.gpus_per_node}x{self.kind}" if self.nodes > 1 else f"{self.gpus_per_node}x{self.kind}"


@dataclass(frozen=True)
class Layout:
    """How the GPUs are split: ``inference`` GPUs for engines (tp each), ``learners`` GPUs for learner pairs;
    colocated: every GPU holds both and the phases take them in turn."""

    inference: int
    learners: int
    tp: int = 1
    colocated: bool = False

    @property
    def name(self) -> str:
        if self.colocated:
            return f"colocated {self.inference} GPUs" + (f" (tp {self.tp})" if self.tp > 1 else "")
        if not self.inference and not self.learners:
            return "CPU"
        return f"{self.inference}+{self.learners}" + (f" (tp {self.tp})" if self.tp > 1 else "")

    @property
    def gpus(self) -> int:
        return self.inference if self.colocated else self.inference + self.learners

    @property
    def replicas(self) -> int:
        return max(1, self.inference // self.tp)

    def engine_wider_than(self, gpus_per_node: int) -> bool:
        """Whether an engine replica's ``tp`` GPUs, which must share one node, exceed ``gpus_per_node`` (a layout with
        no engine GPU has none to place)."""
        return self.inference > 0 and self.tp > gpus_per_node


@dataclass(frozen=True)
class Phase:
    name: str
    group: str  # "inference", "learners", "verifiers", "host"
    seconds: float
    detail: str = ""


@dataclass(frozen=True)
class ReplicaLoad:
    """One generation phase on one engine replica: its sequences and how many of them it decodes at once."""

    phase: str
    sequences: int
    running: int

    @property
    def waves(self) -> int:
        """W = ceil(n / c), 0 without sequences."""
        return -(-self.sequences // self.running) if self.sequences else 0

    def describe(self) -> str:
        if self.running >= self.sequences:
            return f"{self.phase} {self.sequences} sequences, all at once"
        return f"{self.phase} {self.sequences} sequences, {self.running} at once ({self.waves} waves)"


GENERATION_PHASES = ("league", "propose", "validate", "solve", "judge")  # actors.loop.generate_rollouts
TRAINING_PHASES = ("train",)


@dataclass(frozen=True)
class Overlap:
    """Serial and overlapped steps from the seconds of generation G, training T and the rest R (module docstring):
    overlapped = max(G, T) + f min(G, T) + R with f the drained fraction of the steps."""

    generation_s: float
    train_s: float
    rest_s: float
    drained_fraction: float
    possible: bool = True  # False: engines and learners on the same devices (colocated), no overlap

    @classmethod
    def of(cls, seconds: dict[str, float], drained_fraction: float, possible: bool = True) -> "Overlap":
        """From a phase -> seconds table (planned or measured, the league's phase named ``league``): G the sum of
        ``GENERATION_PHASES``, T of ``TRAINING_PHASES``, R of every other phase."""
        if not 0.0 <= drained_fraction <= 1.0:
            raise ValueError(f"drained fraction {drained_fraction} is not within [0, 1]")
        g = sum(seconds.get(p, 0.0) for p in GENERATION_PHASES)
        t = sum(seconds.get(p, 0.0) for p in TRAINING_PHASES)
        rest = sum(s for p, s in seconds.items() if p not in GENERATION_PHASES + TRAINING_PHASES)
        return cls(g, t, rest, drained_fraction, possible)

    @property
    def serial_step_s(self) -> float:
        return self.generation_s + self.train_s + self.rest_s

    @property
    def step_s(self) -> float:
        if not self.possible:
            return self.serial_step_s
        g, t = self.generation_s, self.train_s
        return max(g, t) + self.drained_fraction * min(g, t) + self.rest_s

    @property
    def speedup(self) -> float:
        """Steps per hour overlapped / serial."""
        return self.serial_step_s / self.step_s if self.step_s else 1.0

    @property
    def bound(self) -> float:
        """1 + min(G, T) / max(G, T): the speed-up of a pipeline that never drains and has nothing else to do."""
        g, t = self.generation_s, self.train_s
        return 1.0 + min(g, t) / max(g, t) if self.possible and max(g, t) > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"generation_s": round(self.generation_s, 3), "train_s": round(self.train_s, 3),
                "rest_s": round(self.rest_s, 3), "drained_fraction": round(self.drained_fraction, 4),
                "serial_step_s": round(self.serial_step_s, 3), "overlapped_step_s": round(self.step_s, 3),
                "overlap_vs_serial": round(self.speedup, 4), "overlap_bound": round(self.bound, 4),
                "possible": self.possible}


def drained_steps(config: Any, steps: int) -> int:
    """How many of steps 1..``steps`` an overlapped run drains after: checkpoint steps, evolution steps and the
    last step (``Config.overlap_drains_after``, the rule the loop follows)."""
    if steps < 1:
        raise ValueError(f"steps {steps} must be at least 1")
    return sum(1 for t in range(1, steps + 1) if config.overlap_drains_after(t, steps))


@dataclass
class TimePlan:
    cluster: Cluster
    layout: Layout
    phases: list[Phase]
    lengths: Lengths
    tokens: dict[str, float]
    missing: list[str] = field(default_factory=list)
    drained_fraction: float = 1.0  # of the config's run.steps, were it overlapped (drained_steps / run.steps)
    overlapped: bool = False  # the config runs overlapped (run.max_staleness: 1)
    data_parallel: bool = False  # the config splits each member's update over the learner GPUs (rl.data_parallel)
    engine: str = "vllm"  # the name of the engine the plan assumes (planned_engine; configs.engines)
    notes: list[str] = field(default_factory=list)  # what the reader must know of how a phase was planned
    generation_lower_bound: bool = False  # the transformers engine on a GPU at vLLM's rates (notes say so)
    loads: dict[str, list[ReplicaLoad]] = field(default_factory=dict)  # generation phase -> each replica's load
    kv: PagedKV | None = None  # each replica's paged KV cache (None: the engine does not page it, or on CPU)

    @property
    def mode(self) -> "RunMode":
        return RunMode(1 if self.overlapped else 0, self.data_parallel)

    @property
    def name(self) -> str:
        """``5+3 overlapped, data parallel``: the layout and how it runs."""
        return f"{self.layout.name} {self.mode.name}" if self.cluster.gpus else self.layout.name

    @property
    def wall_s(self) -> float:
        """Seconds of one step as the run goes: the overlapped step (:class:`Overlap`) where the config overlaps and
        the layout allows it, else the serial one (:attr:`step_seconds`)."""
        return self.overlap().step_s if self.overlapped and not self.layout.colocated else self.step_seconds

    def overlap(self, drained_fraction: float | None = None) -> Overlap:
        """This plan's steps serial and overlapped (``drained_fraction``: the run's own when None)."""
        f = self.drained_fraction if drained_fraction is None else drained_fraction
        return Overlap.of({p.name: p.seconds for p in self.phases}, f, possible=not self.layout.colocated)

    @property
    def step_seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def group_seconds(self, group: str) -> float:
        return sum(p.seconds for p in self.phases if p.group == group)

    def busy(self) -> dict[str, float]:
        """Fraction of the (wall-clock) step each GPU group computes (colocated: one group does both)."""
        step = self.wall_s or 1.0
        if self.layout.colocated:
            return {"gpus": (self.group_seconds("inference") + self.group_seconds("learners")) / step}
        out = {}
        if self.layout.inference:
            out["inference"] = self.group_seconds("inference") / step
        if self.layout.learners:
            out["learners"] = self.group_seconds("learners") / step
        return out

    def gpu_busy(self) -> float:
        """Busy fraction of all the layout's GPUs, weighted by their count."""
        busy = self.busy()
        if self.layout.colocated:
            return busy["gpus"]
        gpus = self.layout.inference + self.layout.learners
        if not gpus:
            return 0.0
        return (self.layout.inference * busy.get("inference", 0.0) + self.layout.learners * busy.get("learners", 0.0)) / gpus

    def critical(self) -> Phase:
        return max(self.phases, key=lambda p: p.seconds)

    @property
    def steps_per_hour(self) -> float:
        return 3600.0 / self.wall_s if self.wall_s else math.inf

    def summary(self) -> str:
        busy = ", ".join(f"{g} {f:.0%}" for g, f in self.busy().items())
        how = f" overlapped ({self.step_seconds:.0f} s serial)" if self.wall_s != self.step_seconds else ""
        return (f"step ~{self.wall_s:.0f} s{how}, GPU busy {self.gpu_busy():.0%} ({busy}), "
                f"limited by {self.critical().name}")

    def render(self) -> str:
        lines = [f"# time plan ({self.cluster}, layout {self.layout.name}; lengths from {self.lengths.source})",
                 f"{'phase':<12}{'group':<11}{'seconds':>9}  what"]
        for p in self.phases:
            lines.append(f"{p.name:<12}{p.group:<11}{p.seconds:9.2f}  {p.detail}")
        busy = ", ".join(f"{g} busy {f:.0%}" for g, f in self.busy().items())
        lines.append(f"{'step':<23}{self.step_seconds:9.2f}  {self.steps_per_hour:.1f} steps/hour" + (f"; {busy}" if busy else ""))
        lines.append(self.overlap_line())
        if self.missing:
            lines.append("constants missing: " + "; ".join(self.missing) + " (set plan.constants to plan those phases)")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines + self.concurrency_lines())

    def concurrency_lines(self) -> list[str]:
        """What each replica decodes at once in each phase (a paged KV cache only), identical replicas folded."""
        if self.kv is None or not self.loads:
            return []
        groups: list[list] = []  # [first replica, last replica, its phases]
        for i, loads in enumerate(zip(*self.loads.values())):
            text = "; ".join(load.describe() for load in loads)
            if groups and groups[-1][2] == text:
                groups[-1][1] = i
            else:
                groups.append([i, i, text])
        return ([f"# decode concurrency per replica ({self.kv.configured_name}; each replica's paged KV cache holds "
                 f"{self.kv.pool_tokens:,} tokens)"]
                + [f"replica {first}{'' if first == last else f'-{last}'}: {text}" for first, last, text in groups])

    def overlap_line(self) -> str:
        o = self.overlap()
        if not o.possible:
            return "overlapped (run.max_staleness 1): not possible on a colocated layout"
        state = "on" if self.overlapped else "off"
        return (f"overlapped (run.max_staleness 1, {state} here): step {o.step_s:.2f} s = max(G {o.generation_s:.2f}, "
                f"T {o.train_s:.2f}) + {o.drained_fraction:.2f} x min + R {o.rest_s:.2f}; {3600 / o.step_s:.1f} steps/hour, "
                f"{o.speedup:.2f}x serial (bound {o.bound:.2f}x)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": str(self.cluster), "layout": self.layout.name, "step_s": round(self.step_seconds, 3),
            "steps_per_hour": round(self.steps_per_hour, 2), "gpu_busy": round(self.gpu_busy(), 4),
            "busy": {g: round(f, 4) for g, f in self.busy().items()}, "critical": self.critical().name,
            "phases": {p.name: round(p.seconds, 4) for p in self.phases}, "tokens": self.tokens,
            "lengths": self.lengths.__dict__, "missing": self.missing, "overlap": self.overlap().to_dict(),
            "engine": self.engine, "notes": self.notes,
            "decode_concurrency": {phase: [[load.sequences, load.running] for load in loads]
                                   for phase, loads in self.loads.items()} if self.kv else None,
        }


# ---------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    """What one step does, from the config and the expected lengths."""

    proposals: float
    rollouts: float
    teacher_tokens: dict[int, float]  # member index -> tokens trained
    student_tokens: dict[int, float]
    propose_tokens: tuple[float, float]  # (prompt tokens the engines compute, new tokens) of the proposals
    solve_tokens: tuple[float, float]  # the same of the rollouts (a shared prompt computed once with prefix sharing)
    validate_runs: float  # sandbox runs of the proposals (each twice: the determinism check)
    judge_runs: float  # sandbox runs of the answers

    @property
    def trained_tokens(self) -> float:
        return sum(self.teacher_tokens.values()) + sum(self.student_tokens.values())


def step_workload(config: Any, lengths: Lengths, prefix_sharing: bool) -> Workload:
    """Expected sequences, tokens and executions of one step (module docstring)."""
    tasks, pop = config.tasks, config.population
    teachers = 1 if pop.single_agent else pop.teachers
    students = 1 if pop.single_agent else pop.students
    proposals = teachers * tasks.tasks_per_teacher
    rollouts = proposals * lengths.valid_fraction * tasks.rollouts_k
    per_teacher = tasks.tasks_per_teacher * (lengths.propose_prompt + lengths.proposal)
    per_student = rollouts / students * (lengths.solve_prompt + lengths.answer)
    families = tasks.families
    f_share = families.count("code_f") / len(families)
    run_inputs = (1 - f_share) + f_share * tasks.code_f_inputs
    judge_inputs = (1 - f_share) + f_share * max(1, tasks.code_f_inputs // 2)
    solve_prompts = rollouts / tasks.rollouts_k if prefix_sharing else rollouts
    return Workload(
        proposals=proposals,
        rollouts=rollouts,
        teacher_tokens={i: float(per_teacher) for i in range(teachers)},
        student_tokens={j: per_student for j in range(students)},  # single agent: its one adapter (index 0) again
        propose_tokens=(proposals * lengths.propose_prompt, proposals * lengths.proposal),
        solve_tokens=(solve_prompts * lengths.solve_prompt, rollouts * lengths.answer),
        validate_runs=proposals * 2 * run_inputs,
        judge_runs=rollouts * judge_inputs,
    )


# ------------------------------------------------------------------------------------------------- plan


def _flops_per_trained_token(config: Any, dims: ModelDims, checkpointing: bool) -> float:
    """F = (4 + 2 [checkpointing]) N x epochs + 2 N [KL] + 2 N [epochs > 1] + 6 N_lora x epochs."""
    n = dims.base_params()
    n_lora = lora_params(dims, config.lora.rank, config.lora.target_modules)
    epochs = config.rl.epochs
    return ((4 + 2 * checkpointing) * n + 6 * n_lora) * epochs + 2 * n * (config.rl.kl_coef > 0) + 2 * n * (epochs > 1)


def _learner_tokens(work: Workload, shards: int, on_gpus: bool, data_parallel: bool = False) -> list[float]:
    """Tokens of each learner device: member i on shard i mod shards, or with ``data_parallel`` an equal share of
    every token. On a GPU the shard's teacher and student learners share its compute, so their tokens add; on CPU
    each learner is its own process on its own cores."""
    if data_parallel and on_gpus:
        return [work.trained_tokens / shards] * shards
    per = [0.0] * (shards if on_gpus else 2)
    for role, members in enumerate((work.teacher_tokens, work.student_tokens)):
        for i, tokens in members.items():
            per[i % shards if on_gpus else role] += tokens
    return per


def gradient_exchange_bytes(config: Any, dims: ModelDims, shards: int) -> float:
    """Bytes of one epoch's gradient shares with ``rl.data_parallel`` over ``shards`` learner GPUs: per role, at
    most (members + shards - 1) float32 member gradients (each share exports the members it trained; the split
    by tokens cuts at most shards - 1 members); 0 on one GPU. Every replica reads them all."""
    if shards < 2:
        return 0.0
    pop = config.population
    members = [1] if pop.single_agent else [pop.teachers, pop.students]
    return sum(m + shards - 1 for m in members) * 4.0 * lora_params(dims, config.lora.rank, config.lora.target_modules)


def described_gpu_bytes(config: Any, kind: DeviceKind | None) -> int:
    """Bytes per GPU of the described cluster: ``resources.gpu_memory_gib``, else the kind's memory, else 80 GiB."""
    return int((config.resources.gpu_memory_gib or (kind.memory_gib if kind else 80.0)) * GiB)


def eval_problems(config: Any) -> int:
    """Benchmark problems of one evaluation, every benchmark together (``eval.limit`` of each, or HumanEval's size)."""
    return (config.eval.limit or EVAL_PROBLEMS_DEFAULT) * max(1, len(config.eval.benchmarks))


def replica_sequences(requests: int, replicas: int, per_request: int) -> list[int]:
    """Sequences of each replica: ``System.generate`` gives each ceil(requests / replicas) requests in turn (the last
    fewer), each request ``per_request`` sequences (a student's k rollouts)."""
    size = -(-requests // replicas)
    return [per_request * max(0, min(size, requests - i * size)) for i in range(replicas)]


def replica_loads(config: Any, work: Workload, lengths: Lengths, replicas: int,
                  kv: PagedKV | None) -> dict[str, list[ReplicaLoad]]:
    """Each generation phase on each replica: the expected requests split as ``System.generate`` splits them, decoded
    ``kv.running`` at once with a paged KV cache (module docstring), else all at once."""
    tokens = sequence_tokens(config, lengths)
    k = config.tasks.rollouts_k
    requests = {"propose": (round(work.proposals), 1), "solve": (round(work.rollouts / k), k)}
    if config.eval.every:
        requests["evaluate"] = (eval_problems(config) * (config.population.adapters + 1), 1)
    return {phase: [ReplicaLoad(phase, n, kv.running(n, tokens[phase]) if kv else max(1, n))
                    for n in replica_sequences(count, replicas, per)]
            for phase, (count, per) in requests.items()}


def plan_time(config: Any, dims: ModelDims, layout: Layout, cluster: Cluster, lengths: Lengths,
              kinds: dict[str, DeviceKind] | None = None, host: HostConstants | None = None,
              checkpointing: bool = True, learner_cores: float | None = None) -> TimePlan:
    """The time plan of ``config`` under ``layout`` on ``cluster`` (module docstring for every term).

    ``learner_cores``: on CPU, the cores the learner processes share (None: one each)."""
    if learner_cores is not None and learner_cores <= 0:
        raise ValueError(f"learner_cores {learner_cores} must be positive")
    kinds = kinds or DEVICE_KINDS
    host = host or HOST
    kind = kinds.get(cluster.kind if cluster.gpus else "cpu")
    missing: list[str] = []
    if kind is None:
        kind = DeviceKind(name=cluster.kind, memory_gib=80.0)
    engine = planned_engine(config, cluster.gpus > 0)
    work = step_workload(config, lengths, prefix_sharing=engine.prefix_cache)
    n = dims.base_params()
    b = DTYPE_BYTES[config.model.dtype]
    phases: list[Phase] = []

    def rate(name: str, need: tuple[str, ...]) -> DeviceKind | None:
        absent = kind.missing(need)
        if absent:
            missing.append(f"{kind.name}: {', '.join(absent)} ({name} not planned)")
            return None
        return kind

    # generation: the step's requests over the replicas (planning.dispatch), each decoding what its KV cache allows at once
    gen = rate("generation", GENERATION_NEEDS)
    replicas = layout.replicas
    tp = layout.tp if cluster.gpus else 1
    kv = (paged_kv(config, dims, described_gpu_bytes(config, kind), lengths)
          if engine.paged_kv_cache and cluster.gpus else None)
    loads = replica_loads(config, work, lengths, replicas, kv)
    waves = {phase: max(1, max(load.waves for load in per_replica)) for phase, per_replica in loads.items()}
    propose_s = solve_s = 0.0
    if gen is not None:
        peak = gen.peak_flops.value * tp
        prefill_rate = peak * gen.prefill_mfu.value / (2 * n)
        decode_rate = peak * gen.decode_mfu.value * (1 - gen.lora_decode_overhead.value) / (2 * n)
        step_latency = n * b / (gen.memory_bandwidth.value * tp)

        def generation(prefill: float, decode: float, phase: str, new: float, longest: int) -> float:
            """prefill / R / prefill_rate + decode / R / decode_rate + ((W - 1) new + longest) x step latency."""
            if not decode:
                return 0.0
            steps = (waves[phase] - 1) * new + longest
            return prefill / replicas / prefill_rate + decode / replicas / decode_rate + steps * step_latency

        def imbalance(prefill: float, decode: float, requests: float, rows: float) -> float:
            """The work queue's tail beyond the balanced share (``planning.dispatch``: its pieces per replica)."""
            count = piece_count(round(requests), replicas, rows=round(rows), min_rows=replica_batch_rows(config))
            return imbalance_s(prefill / prefill_rate + decode / decode_rate, replicas, count / replicas)

        max_new, k = config.inference.max_tokens, config.tasks.rollouts_k
        propose_s = (generation(*work.propose_tokens, "propose", lengths.proposal, max_new)
                     + imbalance(*work.propose_tokens, work.proposals, work.proposals))
        solve_s = (generation(*work.solve_tokens, "solve", lengths.answer, max_new)
                   + imbalance(*work.solve_tokens, work.rollouts / k, work.rollouts))

    def in_waves(phase: str) -> str:
        return f", {waves[phase]} waves on the busiest replica" if waves[phase] > 1 else ""

    phases.append(Phase("propose", "inference", propose_s,
                        f"{work.proposals:.0f} proposals x ({lengths.propose_prompt} prompt + {lengths.proposal} new) "
                        f"tokens on {replicas} replica(s){in_waves('propose')}"))
    cores = config.verifier.actors * config.verifier.cpus_per_actor
    exec_rate = host.verifier_tasks_per_core_s.value * cores
    phases.append(Phase("validate", "verifiers", work.validate_runs / exec_rate,
                        f"{work.validate_runs:.0f} sandbox runs on {cores:g} cores"))
    phases.append(Phase("solve", "inference", solve_s,
                        f"{work.rollouts:.0f} rollouts x ({lengths.solve_prompt} prompt + {lengths.answer} new) tokens"
                        f"{in_waves('solve')}"))
    phases.append(Phase("judge", "verifiers", work.judge_runs / exec_rate, f"{work.judge_runs:.0f} sandbox runs"))

    # training: the busiest learner GPU sets the time
    train = rate("training", TRAINING_NEEDS)
    shards = max(1, layout.learners if cluster.gpus else 1)
    split = config.rl.data_parallel and cluster.gpus > 0 and shards > 1
    per_shard = _learner_tokens(work, shards, cluster.gpus > 0, split)
    flops = _flops_per_trained_token(config, dims, checkpointing)
    train_s = 0.0
    busiest = max(per_shard)
    if not cluster.gpus and learner_cores is not None:
        busiest = max(busiest, sum(per_shard) / learner_cores)  # the processes time-share their cores
    if train is not None:
        train_s = busiest * flops / (train.peak_flops.value * train.train_mfu.value)
    where = f"{shards} learner GPU(s)" if cluster.gpus else "the teacher and student learner processes"
    if not cluster.gpus and learner_cores is not None:
        where += f" on {learner_cores:g} core(s)"
    detail = f"{work.trained_tokens:,.0f} tokens over {where}, busiest {max(per_shard):,.0f}"
    if split:
        exchanged = gradient_exchange_bytes(config, dims, shards)
        exchange_s = config.rl.epochs * exchanged / host.adapter_load_bandwidth.value
        train_s += exchange_s
        detail += f" (data parallel); gradient exchange {exchange_s:.1f} s ({exchanged / 2**30:.2f} GiB per GPU and epoch)"
    phases.append(Phase("train", "learners", train_s, detail))

    members = config.population.adapters
    adapter_bytes = lora_params(dims, config.lora.rank, config.lora.target_modules) * b
    handover = members * (adapter_bytes / host.adapter_load_bandwidth.value + host.adapter_swap_s.value)
    phases.append(Phase("handover", "host", handover, f"{members} adapters x {adapter_bytes / 2**20:.0f} MiB to {replicas} replica(s)"))
    phases.append(Phase("league", "host", host.league_s.value, "match + record"))
    if config.evolution.enabled:
        p_m = lora_params(dims, config.lora.rank, config.lora.target_modules) / 1e6
        child = host.evolution_s_floor.value + p_m * host.evolution_s_per_mparam.value
        phases.append(Phase("evolve", "host", 2 * child / config.evolution.period,
                            f"2 children of {p_m:.1f} M parameters every {config.evolution.period} steps"))
    ckpt_bytes = members * 12 * lora_params(dims, config.lora.rank, config.lora.target_modules)
    phases.append(Phase("checkpoint", "host", ckpt_bytes / host.checkpoint_bandwidth.value / config.run.checkpoint_every,
                        f"{ckpt_bytes / 2**30:.2f} GiB every {config.run.checkpoint_every} steps"))
    if config.eval.every and gen is not None:
        problems = eval_problems(config)
        decode = problems * (members + 1) * config.eval.max_tokens
        eval_s = generation(0.0, decode, "evaluate", config.eval.max_tokens, config.eval.max_tokens)
        eval_s += imbalance(0.0, decode, problems * (members + 1), problems * (members + 1))
        phases.append(Phase("evaluate", "inference", eval_s / config.eval.every,
                            f"{problems} problems x {members + 1} models every {config.eval.every} steps"
                            f"{in_waves('evaluate')}"))
    if layout.colocated and engine.sleep_mode:
        wake = kind.sleep_wake_s
        if wake is None:
            missing.append(f"{kind.name}: sleep_wake_s (colocated switch not planned)")
        phases.append(Phase("switch", "host", wake.value if wake else 0.0, "engines sleep for training and wake after"))
    elif layout.colocated:
        phases.append(Phase("switch", "host", 0.0, f"none: the {engine.label} has no sleep mode, it stays awake"))
    notes, lower_bound = [], False
    if not engine.own_time_constants and cluster.gpus and gen is not None:
        note, lower_bound = _hf_on_gpu_note(kind)
        notes.append(note)
    tokens = {"teacher": sum(work.teacher_tokens.values()), "student": sum(work.student_tokens.values()),
              "prefill": work.propose_tokens[0] + work.solve_tokens[0], "decode": work.propose_tokens[1] + work.solve_tokens[1]}
    steps = config.run.steps
    return TimePlan(cluster, layout, phases, lengths, {k: round(v) for k, v in tokens.items()}, missing,
                    drained_steps(config, steps) / steps, config.run.max_staleness == 1, config.rl.data_parallel,
                    engine.name, notes, lower_bound, loads, kv)


HF_BORROWED = ("prefill_mfu", "decode_mfu", "lora_decode_overhead")
"""A GPU kind's generation rates that are vLLM's (cited or measured with vLLM), not the transformers engine's."""


def _hf_on_gpu_note(kind: DeviceKind) -> tuple[str, bool]:
    """What the generation phases of a transformers engine on a GPU rest on (module docstring), and whether they are a
    lower bound: the kind's shipped rates are vLLM's; rates set for the plan (a constants file, ``plan.constants``)
    are taken as the engine's own."""
    shipped = DEVICE_KINDS.get(kind.name)
    borrowed = [n for n in HF_BORROWED if shipped is not None and getattr(kind, n) == getattr(shipped, n)]
    if not borrowed:
        return (f"the transformers engine on {kind.name}: generation planned with the rates set for this plan "
                f"(decode_mfu: {kind.decode_mfu.source})"), False
    return (f"the transformers engine on {kind.name}: generation planned at vLLM's rates ({', '.join(borrowed)} of "
            f"{kind.name}; none is measured for the transformers engine on a GPU) and the weight-read tail at the "
            "memory bandwidth: a lower bound, as a small model's decode steps are bound by per-step overhead (kernel "
            "launches, Python) these do not count; planning/calibrate.py on the node measures the engine's own"), True


def candidate_layouts(cluster: Cluster, tp: int) -> list[Layout]:
    """Every split of the cluster's GPUs into engines (multiples of tp) and learners, and the colocated layout."""
    if not cluster.gpus:
        return [Layout(0, 0)]
    out = [Layout(i, cluster.gpus - i, tp) for i in range(tp, cluster.gpus, tp)]
    if cluster.gpus % tp == 0:
        out.append(Layout(cluster.gpus, cluster.gpus, tp, colocated=True))
    return out


# --------------------------------------------------------------------------------------- inputs and choice


def measured_phase_seconds(rows: list[dict[str, Any]], events: list[dict[str, Any]] = ()) -> dict[str, float]:
    """Mean seconds of each recorded phase over a run's step rows (``phase_seconds``); checkpoints, logged as
    events with their seconds, spread over the steps."""
    steps = [r["phase_seconds"] for r in rows if "phase_seconds" in r and "step" in r]
    if not steps:
        return {}
    names = sorted({k for s in steps for k in s})
    out = {k: sum(s.get(k, 0.0) for s in steps) / len(steps) for k in names}
    first, last = min(r["step"] for r in rows if "step" in r), max(r["step"] for r in rows if "step" in r)
    saved = [e["seconds"] for e in events if e.get("event") == "checkpoint" and first <= e.get("checkpoint_step", -1) <= last]
    if saved:
        out["checkpoint"] = sum(saved) / len(steps)
    return out


def cluster_of(config: Any, described: str | None = None) -> Cluster:
    """The cluster to plan for: ``--cluster`` when given, else the config's ``plan`` block and GPU counts."""
    if described:
        return Cluster.parse(described)
    plan = config.plan
    gpus = plan.gpus_per_node or config_layout(config).gpus  # colocated: the engines' GPUs hold the learners too
    return Cluster(plan.nodes, gpus, plan.gpu_kind)


def config_layout(config: Any) -> Layout:
    res = config.resources
    return Layout(res.inference_gpus, res.learner_gpus, res.tensor_parallel_size, colocated=res.colocated)


COLOCATED_NOT_RUN = ("built, not yet run on a GPU (vLLM's sleep mode beside the learners): try it with "
                     "resources.colocated=true")
"""Why the plan does not yet recommend a colocated layout that fits: its CUDA path (engines sleeping while their
GPU's learners train) has run only on CPU, where vLLM has no sleep mode. None once a GPU run has checked it."""
COLOCATED_HF_NOT_RUN = ("built, not yet run on a GPU (the transformers engine awake beside the learners): try it with "
                        "resources.colocated=true")
"""The same for a colocated layout with the transformers engine (no sleep mode: its bytes stay beside the learners)."""


@dataclass(frozen=True)
class RunMode:
    """How a layout runs: ``staleness`` 0 (serial) or 1 (overlapped, ``run.max_staleness``), and whether each
    member's update is split over the learner GPUs (``rl.data_parallel``)."""

    staleness: int = 0
    data_parallel: bool = False

    @property
    def name(self) -> str:
        return ("overlapped" if self.staleness else "serial") + (", data parallel" if self.data_parallel else "")

    def keys(self, config: Any) -> list[str]:
        """The overrides that select this mode (the importance correction that overlap needs, where it is off)."""
        keys = [f"run.max_staleness={self.staleness}"]
        if self.staleness and config.rl.importance_correction == "off":
            keys.append("rl.importance_correction=tis")
        return keys + [f"rl.data_parallel={str(self.data_parallel).lower()}"]

    def problem(self, layout: Layout) -> str | None:
        """Why this mode cannot run on ``layout`` (None: it can)."""
        if self.staleness and layout.colocated:
            return "not runnable: overlap needs engines and learners on separate GPUs (colocated runs them in turn)"
        if self.data_parallel and layout.learners < 2:
            return "not runnable: data parallel needs 2 or more learner GPUs"
        return None

    def apply(self, config: Any) -> Any:
        """``config`` running in this mode (not validated: a plan's what-if)."""
        rl = {"data_parallel": self.data_parallel}
        if self.staleness and config.rl.importance_correction == "off":
            rl["importance_correction"] = "tis"
        return config.model_copy(update={"rl": config.rl.model_copy(update=rl),
                                         "run": config.run.model_copy(update={"max_staleness": self.staleness})})


RUN_MODES = (RunMode(0, False), RunMode(1, False), RunMode(0, True), RunMode(1, True))

TABLE_BEST = 5
"""Candidates the dry run's table shows in full, fastest first (and the configured one); ``--all`` shows every one."""


def layout_keys(layout: Layout) -> list[str]:
    keys = [f"resources.inference_gpus={layout.inference}", f"resources.learner_gpus={layout.learners}"]
    if layout.tp > 1:
        keys.append(f"resources.tensor_parallel_size={layout.tp}")
    return keys + [f"resources.colocated={str(layout.colocated).lower()}"]


@dataclass
class LayoutChoice:
    """The configured layout's plan, every candidate's plan (a layout in a mode) with why it cannot run (None: it
    can), and the pick: the fastest runnable candidate."""

    current: TimePlan
    candidates: list[tuple[TimePlan, str | None]]
    recommended: TimePlan | None
    config: Any = None

    def is_current(self, plan: TimePlan) -> bool:
        return plan.layout == self.current.layout and plan.mode == self.current.mode

    def keys(self, plan: TimePlan) -> str:
        """The overrides that run ``plan`` (layout and mode)."""
        return " ".join(layout_keys(plan.layout) + plan.mode.keys(self.config))

    def verdict(self) -> str:
        """The dry run's one closing line of time."""
        cur = self.current
        if cur.missing:
            return (f"time: not fully planned: {'; '.join(cur.missing)}; set plan.constants (planning/time_constants.py); "
                    f"the phases planned so far: ~{cur.step_seconds:.0f} s")
        if not cur.cluster.gpus:
            return f"time: step ~{cur.wall_s:.0f} s on CPU, limited by {cur.critical().name}"
        line = f"time: {cur.summary()}"
        if cur.generation_lower_bound:
            line += " (generation a lower bound: the transformers engine at vLLM's rates, see the note)"
        rec = self.recommended
        if rec is None:
            return line + "; recommended: none (no other layout fits and runs)"
        if self.is_current(rec):
            return line + f"; recommended: {rec.name} (this configuration)"
        return (line + f"; recommended: {rec.name} (~{rec.wall_s:.0f} s, {rec.gpu_busy():.0%} busy, "
                f"{cur.wall_s / rec.wall_s:.2f}x the steps per hour): {self.keys(rec)}")

    def render(self, show_all: bool = False) -> str:
        """The configured plan, then the candidates: the fastest ``TABLE_BEST`` that run and the configured one in
        full, every other one with ``show_all`` (else counted)."""
        lines = [self.current.render()]
        if len(self.candidates) <= 1:
            return "\n".join(lines)
        ranked = sorted(self.candidates, key=lambda c: (c[1] is not None, c[0].wall_s))
        shown = ranked if show_all else [c for i, c in enumerate(ranked)
                                         if (i < TABLE_BEST and c[1] is None) or self.is_current(c[0])]
        lines.append(f"# ways to run {self.current.cluster}, fastest first (each with its time and memory plan)")
        for plan, why in shown:
            mark = "*" if self.is_current(plan) else " "
            lines.append(f"{mark}{plan.name:<42} step {plan.wall_s:7.1f} s  {plan.steps_per_hour:6.1f}/h  "
                         f"GPU busy {plan.gpu_busy():4.0%}  limited by {plan.critical().name:<9} {why or 'runs'}")
        hidden = len(ranked) - len(shown)
        if hidden:
            runnable = sum(1 for plan, why in ranked if why is None and (plan, why) not in shown)
            lines.append(f" ... {hidden} more ({runnable} runnable, slower; python launch.py --dry-run --all lists them)")
        lines.append(" (* this configuration)")
        return "\n".join(lines)


def candidate_problem(plan: TimePlan, unfit: Callable[[Layout, bool], str | None]) -> str | None:
    """Why the candidate ``plan`` (a layout in a mode) cannot be recommended; None when it runs."""
    layout, mode, cluster = plan.layout, plan.mode, plan.cluster
    if cluster.gpus and mode.problem(layout):
        return mode.problem(layout)
    if layout.colocated and layout.tp > 1:
        return "not runnable yet: a colocated replica with tensor parallelism is not built"
    if layout.engine_wider_than(cluster.gpus_per_node):
        return f"an engine's {layout.tp} tensor-parallel GPUs must be on one node"
    if plan.missing:
        return "constants missing: " + "; ".join(plan.missing)
    not_run = COLOCATED_NOT_RUN if engine_traits(plan.engine).sleep_mode else COLOCATED_HF_NOT_RUN
    return unfit(layout, mode.data_parallel) or (not_run if layout.colocated else None)


def choose_layout(config: Any, dims: ModelDims, cluster: Cluster, lengths: Lengths,
                  unfit: Callable[[Layout, bool], str | None], kinds: dict[str, DeviceKind] | None = None,
                  host: HostConstants | None = None, checkpointing: bool = True) -> LayoutChoice:
    """Plan the configured layout and every candidate of ``cluster`` in every :data:`RUN_MODES`; recommend the
    fastest (wall-clock step) that runs.

    ``unfit(layout, data_parallel)`` says why a layout does not fit memory (None when it fits: the memory plan's
    verdict, redone for the data-parallel setting). A layout wider than a node runs across the cluster's nodes
    (only an engine's tp GPUs must share one), and a colocated one that fits is not recommended while
    :data:`COLOCATED_NOT_RUN` stands (said so in the table). On CPU only the configured layout and mode exist."""
    current = plan_time(config, dims, config_layout(config) if cluster.gpus else Layout(0, 0), cluster, lengths,
                        kinds, host, checkpointing)
    candidates = []
    modes = RUN_MODES if cluster.gpus else (current.mode,)
    for layout in candidate_layouts(cluster, config.resources.tensor_parallel_size):
        for mode in modes:
            plan = plan_time(mode.apply(config), dims, layout, cluster, lengths, kinds, host, checkpointing)
            candidates.append((plan, candidate_problem(plan, unfit)))
    runnable = [plan for plan, why in candidates if why is None]
    recommended = min(runnable, key=lambda p: p.wall_s) if runnable else None
    return LayoutChoice(current, candidates, recommended, config)


__all__ = ["GENERATION_PHASES", "TRAINING_PHASES", "Cluster", "ClusterError", "Layout", "LayoutChoice", "Lengths",
           "Overlap", "Phase", "RUN_MODES", "ReplicaLoad", "RunMode", "RunRecordError", "Sourced", "TimePlan", "Workload", "candidate_layouts", "choose_layout",
           "cluster_of", "config_layout", "described_gpu_bytes", "drained_steps", "eval_problems", "lengths_from_config",
           "lengths_from_run", "replica_loads", "replica_sequences",
           "measured_phase_seconds", "plan_time", "planned_engine", "step_workload"]
