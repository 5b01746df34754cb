"""The time plan: expected seconds of every phase of a step on each device group, for a described cluster.

Pure arithmetic beside the memory plan (no Ray, no torch): from the config, the model's widths
(``planning.memory_plan.ModelDims``), the expected lengths (``plan.*`` config keys or a finished run's
``metrics.jsonl``) and the rates of ``planning.time_constants``. The cluster is described, not probed: the
dry run on a laptop plans the 8-GPU node the config names (``--cluster 2x8xH100`` plans others).

Per step, with T teachers of ``tasks_per_teacher`` proposals each, a valid fraction v and k rollouts:

    proposals  n_p = T x tasks_per_teacher            rollouts  n_s = n_p x v x k
    teacher tokens  n_p (prompt_p + proposal)         student tokens  n_s (prompt_s + answer)

- **generation** on R = inference GPUs / tp replicas, the requests split evenly (``System.generate``):
  prefill ``2 N x prompt tokens / (peak x prefill_mfu)`` (a student prompt prefilled once for its k rollouts
  on vLLM, whose prefix cache shares it; once per row on the transformers engine), decode
  ``2 N x new tokens / (peak x decode_mfu x (1 - lora_overhead))`` plus the tail: the longest row decodes
  ``max_tokens`` steps, each reading every weight once (``weight bytes / memory bandwidth``);
- **verification**: executions (a proposal runs twice, a code_f one per input; an answer once per hidden
  input) / (tasks per core-second x the verifiers' cores);
- **training** on the learner GPUs: each GPU trains the members placed on it (member i on shard i mod shards,
  the teacher and student learners of a GPU sharing its compute; on CPU each learner is its own process), ``tokens x F / (peak x
  train_mfu)`` with ``F = (4 + 2 [checkpointing]) N x epochs + 2 N [KL] + 2 N [epochs > 1] + 6 N_lora``;
  the step waits for the busiest GPU;
- **hand-over**: each updated adapter (serving dtype) to every replica, the replicas loading in parallel from
  one object-store copy: members x (bytes / bandwidth + one swap);
- **league** (constant), **evolution** (two children every E steps, seconds per child proportional to its
  parameters), **checkpoint** (adapters + AdamW state every ``checkpoint_every`` steps), **evaluation**
  (every ``eval.every`` steps: each benchmark problem decoded by every member and the base).

The phases run in turn (``actors/loop.py``), so the step is their sum and a group's busy fraction is its
phases' seconds over the step; the critical phase is the longest. Colocated layouts add a sleep/wake of the
engines per step and give every GPU to each phase.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from planning.memory_plan import DTYPE_BYTES, ModelDims, lora_params
from planning.time_constants import DEVICE_KINDS, HOST, DeviceKind, HostConstants, Sourced

GENERATION_NEEDS = ("peak_flops", "memory_bandwidth", "prefill_mfu", "decode_mfu", "lora_decode_overhead")
TRAINING_NEEDS = ("peak_flops", "train_mfu")
EVAL_PROBLEMS_DEFAULT = 164  # HumanEval's size, when eval.limit does not bound a benchmark


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
class Lengths:
    """Expected tokens per sequence and the expected valid fraction of proposals."""

    propose_prompt: int
    proposal: int
    solve_prompt: int
    answer: int
    valid_fraction: float
    source: str = "config (plan.*)"


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


@dataclass(frozen=True)
class Phase:
    name: str
    group: str  # "inference", "learners", "verifiers", "host"
    seconds: float
    detail: str = ""


@dataclass
class TimePlan:
    cluster: Cluster
    layout: Layout
    phases: list[Phase]
    lengths: Lengths
    tokens: dict[str, float]
    missing: list[str] = field(default_factory=list)

    @property
    def step_seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def group_seconds(self, group: str) -> float:
        return sum(p.seconds for p in self.phases if p.group == group)

    def busy(self) -> dict[str, float]:
        """Fraction of the step each GPU group computes (colocated: one group does both)."""
        step = self.step_seconds or 1.0
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
        return 3600.0 / self.step_seconds if self.step_seconds else math.inf

    def summary(self) -> str:
        busy = ", ".join(f"{g} {f:.0%}" for g, f in self.busy().items())
        return (f"step ~{self.step_seconds:.0f} s, GPU busy {self.gpu_busy():.0%} ({busy}), "
                f"limited by {self.critical().name}")

    def render(self) -> str:
        lines = [f"# time plan ({self.cluster}, layout {self.layout.name}; lengths from {self.lengths.source})",
                 f"{'phase':<12}{'group':<11}{'seconds':>9}  what"]
        for p in self.phases:
            lines.append(f"{p.name:<12}{p.group:<11}{p.seconds:9.2f}  {p.detail}")
        busy = ", ".join(f"{g} busy {f:.0%}" for g, f in self.busy().items())
        lines.append(f"{'step':<23}{self.step_seconds:9.2f}  {self.steps_per_hour:.1f} steps/hour" + (f"; {busy}" if busy else ""))
        if self.missing:
            lines.append("constants missing: " + "; ".join(self.missing) + " (set plan.constants to plan those phases)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": str(self.cluster), "layout": self.layout.name, "step_s": round(self.step_seconds, 3),
            "steps_per_hour": round(self.steps_per_hour, 2), "gpu_busy": round(self.gpu_busy(), 4),
            "busy": {g: round(f, 4) for g, f in self.busy().items()}, "critical": self.critical().name,
            "phases": {p.name: round(p.seconds, 4) for p in self.phases}, "tokens": self.tokens,
            "lengths": self.lengths.__dict__, "missing": self.missing,
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


def _learner_tokens(work: Workload, shards: int, on_gpus: bool) -> list[float]:
    """Tokens of each learner device: member i on shard i mod shards. On a GPU the shard's teacher and student
    learners share its compute, so their tokens add; on CPU each learner is its own process on its own cores."""
    per = [0.0] * (shards if on_gpus else 2)
    for role, members in enumerate((work.teacher_tokens, work.student_tokens)):
        for i, tokens in members.items():
            per[i % shards if on_gpus else role] += tokens
    return per


def plan_time(config: Any, dims: ModelDims, layout: Layout, cluster: Cluster, lengths: Lengths,
              kinds: dict[str, DeviceKind] | None = None, host: HostConstants | None = None,
              checkpointing: bool = True) -> TimePlan:
    """The time plan of ``config`` under ``layout`` on ``cluster`` (module docstring for every term)."""
    kinds = kinds or DEVICE_KINDS
    host = host or HOST
    kind = kinds.get(cluster.kind if cluster.gpus else "cpu")
    missing: list[str] = []
    if kind is None:
        kind = DeviceKind(name=cluster.kind, memory_gib=80.0)
    vllm = config.inference.backend == "vllm" or (config.inference.backend == "auto" and cluster.gpus > 0)
    work = step_workload(config, lengths, prefix_sharing=vllm)
    n = dims.base_params()
    b = DTYPE_BYTES[config.model.dtype]
    phases: list[Phase] = []

    def rate(name: str, need: tuple[str, ...]) -> DeviceKind | None:
        absent = kind.missing(need)
        if absent:
            missing.append(f"{kind.name}: {', '.join(absent)} ({name} not planned)")
            return None
        return kind

    # generation: the step's requests split evenly over the replicas
    gen = rate("generation", GENERATION_NEEDS)
    replicas = layout.replicas
    tp = layout.tp if cluster.gpus else 1
    propose_s = solve_s = 0.0
    if gen is not None:
        peak = gen.peak_flops.value * tp
        prefill_rate = peak * gen.prefill_mfu.value / (2 * n)
        decode_rate = peak * gen.decode_mfu.value * (1 - gen.lora_decode_overhead.value) / (2 * n)
        step_latency = n * b / (gen.memory_bandwidth.value * tp)
        max_new = config.inference.max_tokens

        def generation(prefill: float, decode: float) -> float:
            if not decode:
                return 0.0
            return prefill / replicas / prefill_rate + decode / replicas / decode_rate + max_new * step_latency

        propose_s = generation(*work.propose_tokens)
        solve_s = generation(*work.solve_tokens)
    phases.append(Phase("propose", "inference", propose_s,
                        f"{work.proposals:.0f} proposals x ({lengths.propose_prompt} prompt + {lengths.proposal} new) "
                        f"tokens on {replicas} replica(s)"))
    cores = config.verifier.actors * config.verifier.cpus_per_actor
    exec_rate = host.verifier_tasks_per_core_s.value * cores
    phases.append(Phase("validate", "verifiers", work.validate_runs / exec_rate,
                        f"{work.validate_runs:.0f} sandbox runs on {cores:g} cores"))
    phases.append(Phase("solve", "inference", solve_s,
                        f"{work.rollouts:.0f} rollouts x ({lengths.solve_prompt} prompt + {lengths.answer} new) tokens"))
    phases.append(Phase("judge", "verifiers", work.judge_runs / exec_rate, f"{work.judge_runs:.0f} sandbox runs"))

    # training: the busiest learner GPU sets the time
    train = rate("training", TRAINING_NEEDS)
    shards = max(1, layout.learners if cluster.gpus else 1)
    per_shard = _learner_tokens(work, shards, cluster.gpus > 0)
    flops = _flops_per_trained_token(config, dims, checkpointing)
    train_s = 0.0
    if train is not None:
        train_s = max(per_shard) * flops / (train.peak_flops.value * train.train_mfu.value)
    where = f"{shards} learner GPU(s)" if cluster.gpus else "the teacher and student learner processes"
    phases.append(Phase("train", "learners", train_s,
                        f"{work.trained_tokens:,.0f} tokens over {where}, busiest {max(per_shard):,.0f}"))

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
        problems = (config.eval.limit or EVAL_PROBLEMS_DEFAULT) * max(1, len(config.eval.benchmarks))
        decode = problems * (members + 1) * config.eval.max_tokens
        eval_s = decode / replicas / decode_rate + config.eval.max_tokens * step_latency
        phases.append(Phase("evaluate", "inference", eval_s / config.eval.every,
                            f"{problems} problems x {members + 1} models every {config.eval.every} steps"))
    if layout.colocated:
        wake = kind.sleep_wake_s
        if wake is None:
            missing.append(f"{kind.name}: sleep_wake_s (colocated switch not planned)")
        phases.append(Phase("switch", "host", wake.value if wake else 0.0, "engines sleep for training and wake after"))
    tokens = {"teacher": sum(work.teacher_tokens.values()), "student": sum(work.student_tokens.values()),
              "prefill": work.propose_tokens[0] + work.solve_tokens[0], "decode": work.propose_tokens[1] + work.solve_tokens[1]}
    return TimePlan(cluster, layout, phases, lengths, {k: round(v) for k, v in tokens.items()}, missing)


def candidate_layouts(cluster: Cluster, tp: int) -> list[Layout]:
    """Every split of the cluster's GPUs into engines (multiples of tp) and learners, and the colocated layout."""
    if not cluster.gpus:
        return [Layout(0, 0)]
    out = [Layout(i, cluster.gpus - i, tp) for i in range(tp, cluster.gpus, tp)]
    if cluster.gpus % tp == 0:
        out.append(Layout(cluster.gpus, cluster.gpus, tp, colocated=True))
    return out


# --------------------------------------------------------------------------------------- inputs and choice


def lengths_from_config(config: Any) -> Lengths:
    """The ``plan.*`` expected lengths (sane defaults for a 7B model with r1 prompts; the tiny presets set theirs)."""
    p = config.plan
    return Lengths(p.propose_prompt_tokens, min(p.proposal_tokens, config.inference.max_tokens), p.solve_prompt_tokens,
                   min(p.answer_tokens, config.inference.max_tokens), p.valid_fraction)


class RunRecordError(ValueError):
    """A run directory whose ``metrics.jsonl`` cannot give the plan its lengths."""


def lengths_from_run(rows: list[dict[str, Any]], source: str) -> Lengths:
    """Mean tokens per sequence of each role and the mean valid rate over a run's step rows (``tokens`` records)."""
    steps = [r for r in rows if "tokens" in r and "step" in r]
    if not steps:
        raise RunRecordError(f"{source}: no step row records token counts ('tokens'); runs record them from this "
                             "version on, so replan from a run made with it")

    def mean(role: str, part: str) -> float:
        seqs = sum(r["tokens"][role]["sequences"] for r in steps)
        return sum(r["tokens"][role][part] for r in steps) / seqs if seqs else 0.0

    valid = sum(r.get("valid_rate", 0.0) for r in steps) / len(steps)
    return Lengths(max(1, round(mean("teacher", "prompt"))), max(1, round(mean("teacher", "completion"))),
                   max(1, round(mean("student", "prompt"))), max(1, round(mean("student", "completion"))),
                   max(valid, 1e-3), f"{source} ({len(steps)} steps)")


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
    res, plan = config.resources, config.plan
    gpus = plan.gpus_per_node or res.inference_gpus + res.learner_gpus
    return Cluster(plan.nodes, gpus, plan.gpu_kind)


def config_layout(config: Any) -> Layout:
    res = config.resources
    return Layout(res.inference_gpus, res.learner_gpus, res.tensor_parallel_size)


@dataclass
class LayoutChoice:
    """The configured layout's plan, every candidate's plan with why it cannot run (None: it can), and the pick."""

    current: TimePlan
    candidates: list[tuple[TimePlan, str | None]]
    recommended: TimePlan | None

    def verdict(self) -> str:
        """The dry run's one closing line of time."""
        cur = self.current
        if cur.missing:
            return (f"time: not fully planned: {'; '.join(cur.missing)}; set plan.constants (planning/time_constants.py); "
                    f"the phases planned so far: ~{cur.step_seconds:.0f} s")
        if not cur.cluster.gpus:
            line = f"time: step ~{cur.step_seconds:.0f} s on CPU, limited by {cur.critical().name}"
        else:
            line = f"time: {cur.summary()}"
        rec = self.recommended
        if rec is None:
            return line + "; recommended: none (no other layout fits and runs)"
        if rec.layout == cur.layout:
            return line + f"; recommended: {rec.layout.name} (this layout)"
        return line + f"; recommended: {rec.layout.name} (~{rec.step_seconds:.0f} s, {rec.gpu_busy():.0%} busy)"

    def render(self) -> str:
        lines = [self.current.render()]
        if len(self.candidates) > 1:
            lines.append(f"# layouts of {self.current.cluster} (the time plan of each; memory and runnability checked)")
            for plan, why in self.candidates:
                lines.append(f"{plan.layout.name:<24} step {plan.step_seconds:8.1f} s  {plan.steps_per_hour:6.1f}/h  "
                             f"GPU busy {plan.gpu_busy():4.0%}  limited by {plan.critical().name:<9} {why or 'runs'}")
        return "\n".join(lines)


def choose_layout(config: Any, dims: ModelDims, cluster: Cluster, lengths: Lengths,
                  unfit: Callable[[Layout], str | None], kinds: dict[str, DeviceKind] | None = None,
                  host: HostConstants | None = None, checkpointing: bool = True) -> LayoutChoice:
    """Plan the configured layout and every candidate of ``cluster``; recommend the fastest that runs.

    ``unfit(layout)`` says why a layout does not fit memory (None when it fits: the memory plan's verdict). A
    colocated layout is planned but not runnable yet (said so in the table); a layout wider than a node runs
    across the cluster's nodes."""
    current = plan_time(config, dims, config_layout(config) if cluster.gpus else Layout(0, 0), cluster, lengths,
                        kinds, host, checkpointing)
    candidates = []
    for layout in candidate_layouts(cluster, config.resources.tensor_parallel_size):
        plan = plan_time(config, dims, layout, cluster, lengths, kinds, host, checkpointing)
        why = None
        if layout.colocated:
            why = "not runnable yet: engines and learners on one GPU are not built"
        elif layout.tp > cluster.gpus_per_node:
            why = f"an engine's {layout.tp} tensor-parallel GPUs must be on one node"
        elif plan.missing:
            why = "constants missing: " + "; ".join(plan.missing)
        else:
            why = unfit(layout)
        candidates.append((plan, why))
    runnable = [plan for plan, why in candidates if why is None]
    recommended = min(runnable, key=lambda p: p.step_seconds) if runnable else None
    return LayoutChoice(current, candidates, recommended)


__all__ = ["Cluster", "ClusterError", "Layout", "LayoutChoice", "Lengths", "Phase", "RunRecordError", "Sourced", "TimePlan",
           "Workload", "candidate_layouts", "choose_layout", "cluster_of", "config_layout", "lengths_from_config",
           "lengths_from_run", "measured_phase_seconds", "plan_time", "step_workload"]
