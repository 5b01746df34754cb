"""The run configuration: one pydantic model per section, every field described and bounded.

A YAML preset in this folder plus ``dotted.key=value`` overrides is validated into :class:`Config`
before any actor starts. Unknown keys are rejected (``extra="forbid"``); the loader turns that
error into a message that lists the valid keys of the section (see ``configs.loading``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from configs.defences import REQUIRABLE
from configs.engines import ENGINES, engine_traits
from configs.operators import SPECS, check_strength, names

FAMILIES = ("code_o", "code_i", "code_f")
MUTATION_NAMES = names("mutation")
CROSSOVER_NAMES = names("crossover")
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Qwen2 / Llama projection names (attention and MLP), PEFT's usual "all linear" set for them: ``lora.target_modules``'s
default and ``learners.multi_lora.LoRASpec``'s."""
TINY_MODEL = "tiny"


class Section(BaseModel):
    """Base of every section: unknown keys are an error, assignment is validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field(
        TINY_MODEL,
        description="Local Hugging Face model directory; a Hugging Face id such as Qwen/Qwen2.5-7B, read from the local "
        "Hugging Face cache only (HF_HUB_CACHE / HF_HOME; never downloaded: `hf download ID` first; a local directory "
        "of the same name wins); or 'tiny' for the built-in tiny code model that the project bootstraps and caches "
        "itself. '${VAR}' is read from the environment.",
        min_length=1,
    )
    tiny_variant: Literal["default", "test", "stronger", "stronger-large", "stronger-long", "stronger-large-plus",
                          "stronger-large-traced", "stronger-large-live-traced", "larger"] = Field(
        "default", description="Which built-in tiny model to build when path is 'tiny' ('test' is smaller and quicker; "
        "'stronger' and 'larger' are the dynamics study's: students trained on always-right examples, and a model of "
        "about four times the parameters; 'stronger-large' is 'stronger' on ten times the corpus for 8,000 steps "
        "(for the paper's regime), 'stronger-long' the same for 16,000 steps, 'stronger-large-plus' 'stronger-large' trained for its 8,000 "
        "steps again from where it ended; each a longer one-time build, the last three hours, resumed where it stopped; "
        "'stronger-large-traced' 'stronger-large-plus' trained further on students that write a per-line execution "
        "trace before a code_o answer, for the structural-difficulty gate, and 'stronger-large-live-traced' the same on "
        "programs without dead code)."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Dtype of the frozen base weights (adapters train in float32)."
    )
    max_seq_len: int = Field(1024, ge=64, le=131072, description="Longest prompt + completion, in tokens.")


class LoRAConfig(Section):
    rank: int = Field(8, ge=1, le=512, description="LoRA rank r of every adapter.")
    alpha: float = Field(16.0, gt=0, le=4096, description="LoRA alpha; scaling s = alpha / r (alpha / sqrt(r) with rsLoRA).")
    target_modules: list[str] = Field(
        list(TARGET_MODULES), min_length=1, description="Names of the linear layers that carry adapters."
    )
    rslora: bool = Field(False, description="Use rank-stabilised scaling alpha / sqrt(r).")
    init_std: float = Field(
        0.0, ge=0, le=1, description="Std of the initial B factor (0 = PEFT's default: Delta W starts at zero)."
    )

    @property
    def scaling(self) -> float:
        """s = alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.alpha / (self.rank**0.5 if self.rslora else self.rank)


class PopulationConfig(Section):
    teachers: int = Field(2, ge=1, le=64, description="Number of teacher adapters T.")
    students: int = Field(2, ge=1, le=64, description="Number of student adapters S.")
    single_agent: bool = Field(
        False, description="AZR baseline: one adapter proposes and solves (teachers and students must be 1)."
    )

    @model_validator(mode="after")
    def _single_agent_is_one_adapter(self) -> "PopulationConfig":
        if self.single_agent and (self.teachers != 1 or self.students != 1):
            raise ValueError("single_agent mode runs one adapter: set population.teachers=1 and population.students=1")
        return self

    @property
    def adapters(self) -> int:
        return 1 if self.single_agent else self.teachers + self.students


class TasksConfig(Section):
    families: list[Literal["code_o", "code_i", "code_f"]] = Field(
        list(FAMILIES), min_length=1, description="Task families the teachers propose (AZR: deduction, abduction, induction)."
    )
    tasks_per_teacher: int = Field(4, ge=1, le=1024, description="Proposals per teacher per step, spread over the families.")
    family_rotation: Literal["task", "step"] = Field(
        "task",
        description="Which family each of a teacher's tasks of a step is (rollouts/jobs.py, teacher_families): 'task' "
        "round-robin over its tasks (6 tasks over 3 families: two of each, so an advantage group (member, role, family) "
        "holds two proposals); 'step' all of them one family, families[(step + i) % len(families)] for the step's i-th "
        "matched teacher, so a group holds tasks_per_teacher proposals, teachers of one step cover different families "
        "and every teacher sees every family over the steps (with one family the same as 'task').",
    )
    references_k: int = Field(2, ge=0, le=16, description="Reference tasks from the buffers shown in a proposal prompt (AZR: 6).")
    rollouts_k: int = Field(4, ge=1, le=64, description="Student rollouts per valid task (AZR: 8); rho is their solve fraction.")
    code_f_inputs: int = Field(4, ge=2, le=32, description="Inputs a code_f proposal gives (AZR: 10); half are shown to the student.")
    buffer_capacity: int = Field(16384, ge=1, le=1_000_000, description="FIFO cap of each family's task buffer (AZR: 16384).")
    seed_file: Path | None = Field(None, description="Optional JSONL of seed tasks; default seeds with the identity program.")
    prompt_style: Literal["compact", "r1", "chat"] = Field(
        "compact",
        description="Prompt layout (docs/prompts.md): 'compact' for the built-in tiny model (trained on it), 'r1' for base "
        "models (AZR-style dialogue with every rule a task must meet), 'chat' for instruct models (the r1 content through "
        "the tokenizer's chat template; a model without one is refused at start-up).",
    )
    max_program_chars: int = Field(4000, ge=16, le=1_000_000, description="Longest program a valid task may have, in characters.")
    max_program_tokens: int = Field(1024, ge=4, le=262_144, description="Longest program a valid task may have, in model tokens.")
    max_input_chars: int = Field(1000, ge=4, le=1_000_000, description="Longest input (argument list) of a valid task, in characters.")
    max_input_tokens: int = Field(256, ge=1, le=262_144, description="Longest input of a valid task, in model tokens.")
    max_output_chars: int = Field(
        1000, ge=4, le=1_000_000,
        description="Longest output repr of a valid task, in characters (verifier.max_output_chars caps it further).",
    )
    max_output_tokens: int = Field(256, ge=1, le=262_144, description="Longest output repr of a valid task, in model tokens.")
    max_message_chars: int = Field(1000, ge=4, le=1_000_000, description="Longest code_f hint message, in characters.")
    max_message_tokens: int = Field(256, ge=1, le=262_144, description="Longest code_f hint message, in model tokens.")

    @model_validator(mode="after")
    def _unique_families(self) -> "TasksConfig":
        if len(set(self.families)) != len(self.families):
            raise ValueError(f"families must not repeat: {self.families}")
        return self


class RewardsConfig(Section):
    student_correct: float = Field(1.0, ge=-10, le=10, description="Student reward for a correct, well-formed answer.")
    student_wrong: float = Field(-0.5, ge=-10, le=10, description="Student reward for a well-formed wrong answer (AZR: -0.5).")
    student_malformed: float = Field(-1.0, ge=-10, le=10, description="Student reward for an unparsable answer (AZR: -1).")
    teacher_invalid: float = Field(-1.0, ge=-10, le=10, description="Teacher reward for an invalid proposal.")
    teacher_unsolved: float = Field(
        0.0, ge=-10, le=10,
        description="Teacher reward for a valid task its student never solves (rho = 0): the paper's floor, 0.",
    )


class RLConfig(Section):
    learning_rate: float = Field(1e-4, gt=0, le=1.0, description="AdamW learning rate of every adapter.")
    teacher_learning_rate: float | None = Field(
        None, gt=0, le=1.0,
        description="AdamW learning rate of the teachers when set (the students keep learning_rate); "
        "the single agent's one adapter uses learning_rate.",
    )
    weight_decay: float = Field(0.0, ge=0, le=1.0, description="AdamW weight decay.")
    clip_epsilon: float = Field(0.2, gt=0, le=1.0, description="PPO ratio clip, used when epochs > 1.")
    importance_correction: Literal["off", "tis"] = Field(
        "off",
        description="'tis': truncated importance sampling, each token's loss weighted by min(pi_old / mu, "
        "rl.is_truncation) with mu the engine's sampling distribution (veRL's rollout_is_threshold; docs/learners.md); "
        "samples without aligned behaviour log-probs are dropped and counted. 'off': no weight (pi_old / mu taken as 1).",
    )
    is_truncation: float = Field(
        2.0, ge=1.0, le=1000.0, description="C of rl.importance_correction 'tis': importance weights above C are cut to C."
    )
    advantage_baseline: Literal["family", "task"] = Field(
        "family",
        description="Whitening groups of the rewards: 'family' per (member, role, task family), AZR's Task-Relative "
        "REINFORCE++; 'task' also per task for the students' rollouts (GRPO's per-prompt baseline; teachers keep 'family').",
    )
    advantage_norm: Literal["whiten", "center"] = Field(
        "whiten",
        description="Per group: 'whiten' (r - mean) / std (AZR); 'center' r - mean (Dr. GRPO), which keeps the size of "
        "a reward gap in small groups (a group of two whitens to +-1 whatever the gap; docs/dynamics.md).",
    )
    advantage_weighting: Literal["token", "sequence"] = Field(
        "token",
        description="The weight of each completion in its group's mean and variance: 'token' its completion tokens "
        "(veRL's masked whitening, which AZR runs; per token the shorter completion of a pair carries the larger "
        "advantage), 'sequence' one each (GRPO; with advantage_norm 'center' and loss_normaliser 'constant', Dr. GRPO). "
        "learners/pg_loss.py names the papers.",
    )
    loss_normaliser: Literal["tokens", "constant"] = Field(
        "tokens",
        description="N_a, what adapter a's summed token losses are divided by: 'tokens' its completion tokens in the "
        "step (a token-level mean), 'constant' its sequences times inference.max_tokens (Dr. GRPO's constant).",
    )
    train: bool = Field(
        True,
        description="false: no update at all (the adapters stay as initialised; a control in which nothing learns: "
        "the buffers, matching and sampling run as usual). Needs evolution.enabled=false. Keep learning_rate > 0.",
    )
    hindsight_coef: float = Field(
        0.0, ge=0, le=10,
        description="Hindsight supervision of the students (not the paper's; 0 = off): for a valid task no rollout "
        "solved, the verifier's known answer (code_o's output, the teacher's code_i input, code_f's program) is a "
        "supervised target of the student with this fixed advantage (rollouts/hindsight.py). Needs "
        "importance_correction 'off'.",
    )
    kl_coef: float = Field(0.0, ge=0, le=10, description="Coefficient of the KL to the frozen base (adapter-off rows).")
    kl_readout_every: int = Field(
        5, ge=0, le=100_000,
        description="Every this many steps (0: never) each member's KL to the frozen base is measured on a few of its "
                    "own sampled completions, before its update, whatever kl_coef: the exact KL over the vocabulary at each "
                    "completion token, the reference the same forward pass with the adapter off (train.<member>.kl_to_base "
                    "and kl_to_base/<member> in metrics.jsonl; learners/policy_learner.py, kl_to_base_sums).",
    )
    kl_readout_samples: int = Field(
        4, ge=1, le=10_000, description="Completions per member and role in each KL readout, spread over its tasks."
    )
    entropy_coef: float = Field(0.0, ge=0, le=1.0, description="Entropy bonus coefficient (AZR: 0.001).")
    log_entropy: bool = Field(
        True,
        description="Compute each member's mean token entropy of its sampled completions at every update (the "
        "'entropy' of its train stats in metrics.jsonl), off the autograd graph when entropy_coef is 0.",
    )
    grad_clip: float = Field(1.0, gt=0, le=1000, description="Per-adapter gradient-norm clip.")
    epochs: int = Field(1, ge=1, le=16, description="Optimizer passes over each step's samples.")
    micro_batch_tokens: int = Field(8192, ge=256, le=1_000_000, description="Token budget of one forward/backward.")
    activation_checkpointing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Checkpoint every decoder layer of the learners' policy pass (keep layer inputs, recompute in "
        "backward): 'on', 'off', or 'auto' (decided by the memory plan; on for GPU learners until it exists).",
    )
    data_parallel: bool = Field(
        False,
        description="Split each member's samples across all the learner GPUs by tokens, every GPU holding a replica of "
        "every member of its role; the replicas' gradients are summed before each optimizer step, so the step equals "
        "one GPU's and the GPUs share the step's tokens evenly whatever the members draw (docs/learners.md). Needs "
        "resources.learner_gpus >= 2. Off: member i trains on learner GPU i mod learner_gpus.",
    )
    logit_chunk_tokens: int = Field(
        1024, ge=0, le=1_000_000,
        description="Loss tokens per chunk of the LM head and log-softmax in the learners (at most one chunk of "
        "vocabulary-wide logits alive, forward and backward); 0 computes all loss tokens of a micro-batch at once.",
    )


class LeagueConfig(Section):
    mu: float = Field(25.0, ge=-1000, le=1000, description="TrueSkill initial mean.")
    sigma: float = Field(25.0 / 3, gt=0, le=1000, description="TrueSkill initial standard deviation.")
    beta: float = Field(25.0 / 6, gt=0, le=1000, description="TrueSkill performance noise beta.")
    tau: float = Field(0.5, ge=0, le=100, description="TrueSkill dynamics tau; 0.3-1.0 keeps ratings tracking members that train.")
    draw_probability: float = Field(0.0, ge=0, lt=1, description="TrueSkill draw probability.")
    solve_threshold: float = Field(0.5, gt=0, le=1, description="The student wins a task when rho >= this.")
    pfsp_weighting: Literal["variance", "hard"] = Field(
        "variance", description="PFSP f: 'variance' x(1-x) prefers balanced pairs, 'hard' (1-x)^p prefers strong opponents."
    )
    pfsp_exponent: float = Field(2.0, gt=0, le=16, description="p of the 'hard' weighting.")
    epsilon: float = Field(0.1, ge=0, le=1, description="Epsilon-uniform floor mixed into the PFSP distribution.")
    winrate_decay: float = Field(0.95, gt=0, le=1, description="Decay of the empirical win-rate matrix per update.")
    unsolved_is_teacher_win: bool = Field(
        True, description="A valid task no rollout solves (rho = 0) counts as a teacher win (the paper's rule). false: a "
                          "teacher loss, as its reward is the floor; with weak students the paper's rule rates teachers by validity.",
    )
    matching: Literal["independent", "cover_students"] = Field(
        "independent",
        description="How teachers draw students: 'independent', each by PFSP on its own (a student may sit a step out: "
                    "(3/4)^4 = 0.32 of steps with 4 + 4 uniform draws); 'cover_students', every student plays each step "
                    "when teachers >= students (teachers in an order the league's generator shuffles each step, the first "
                    "min(T, S) drawing by PFSP without replacement, the rest as 'independent'; evolution/league.py).",
    )


class OperatorConfig(Section):
    weight: float = Field(1.0, ge=0, le=1000, description="Relative probability of drawing this operator.")
    strength: float = Field(
        0.1, ge=0, le=10,
        description="Operator strength (docs/evolution.md): noise scale, angle, drop probability (mask_components, dare), "
                    "blend weight (blend_svd), fraction from parent b (splice_svd), eta in [1, 2.5] (extrapolate: 1 is the stronger parent, the paper draws from [1, 1.5]).",
    )


def _default_operators() -> dict[str, OperatorConfig]:
    """Every operator at its spec's default weight and strength (``configs.operators.SPECS``)."""
    return {name: OperatorConfig(weight=spec.weight, strength=spec.strength) for name, spec in SPECS.items()}


class EvolutionConfig(Section):
    enabled: bool = Field(True, description="Replace the weakest members by evolved children.")
    period: int = Field(10, ge=1, le=100_000, description="E: evolve every E steps (longer than the 10-20 step recovery).")
    operators: dict[str, OperatorConfig] = Field(
        default_factory=_default_operators,
        description="Operator name -> weight and strength; operators not named keep their defaults (weight 0 disables).",
    )
    protection_steps: int = Field(10, ge=0, le=100_000, description="Steps a new child is protected from culling.")
    tournament_size: int = Field(2, ge=1, le=64, description="Parents are the best of this many members drawn at random.")
    max_relative_change: float = Field(0.5, gt=0, le=10, description="Reject a child whose Delta W moved more than this (relative).")
    sigma_reset: float = Field(25.0 / 6, gt=0, le=1000, description="TrueSkill sigma a child starts with (its mu is the parent's).")
    rating_entry: Literal["mean_preserving", "parents"] = Field(
        "mean_preserving",
        description="How a child's mu enters: 'mean_preserving' = its parents' mean mu, then its whole sub-population "
                    "shifted so the sub-population's mean mu is unchanged (replacement cannot inflate ratings); "
                    "'parents' = its parents' mean mu, no shift.",
    )

    @field_validator("operators", mode="before")
    @classmethod
    def _merge_with_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        merged: dict[str, Any] = {name: op.model_dump() for name, op in _default_operators().items()}
        for name, given in value.items():
            given = given.model_dump() if isinstance(given, OperatorConfig) else given
            merged[name] = {**merged[name], **given} if name in merged and isinstance(given, dict) else given
        return merged

    @model_validator(mode="after")
    def _known_operators(self) -> "EvolutionConfig":
        known = tuple(SPECS)
        unknown = sorted(set(self.operators) - set(known))
        if unknown:
            raise ValueError(f"unknown evolution operators {unknown}; valid: {list(known)}")
        if self.enabled and not any(op.weight > 0 for op in self.operators.values()):
            raise ValueError("evolution is enabled but every operator weight is 0")
        for name, op in self.operators.items():
            check_strength(name, op.strength)  # e.g. "extrapolate: strength 0.5 is outside [1.0, 2.5]"
        return self


class InferenceConfig(Section):
    backend: str = Field(
        "auto", description="An engine of configs/engines.py ('vllm', 'hf': transformers) or 'auto': vLLM on GPUs, "
        "transformers on CPU (faster there; docs/inference.md).")
    max_tokens: int = Field(256, ge=1, le=65536, description="Most new tokens per generation.")
    temperature: float = Field(
        1.0, ge=0, le=10,
        description="Sampling temperature (0 = greedy); the learners train the tempered policy softmax(z / T) (T = 1 when greedy).",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    vllm_engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for vllm.LLM (e.g. gpu_memory_utilization, enforce_eager)."
    )
    allow_untested_vllm: bool = Field(
        False, description="Run on a vLLM outside the tested minor version (inference/vllm_version.py); without it such an "
        "engine stops at start, naming both versions and how to install the tested one.",
    )

    @field_validator("backend")
    @classmethod
    def _registered_backend(cls, value: str) -> str:
        if value != "auto":
            engine_traits(value)  # ValueError listing the registered engines (configs/engines.py)
        return value


class VerifierConfig(Section):
    actors: int = Field(2, ge=1, le=4096, description="Number of verifier actors.")
    cpus_per_actor: float = Field(1.0, gt=0, le=256, description="CPUs each verifier actor reserves (its parallel executions).")
    timeout_s: float = Field(5.0, gt=0, le=600, description="Wall-clock limit of one execution.")
    memory_mb: int = Field(512, ge=32, le=65536, description="Address-space limit of one execution.")
    max_output_chars: int = Field(10_000, ge=16, le=10_000_000, description="Longest accepted output repr (longer is OUTPUT_TOO_LARGE).")
    resource: str = Field(
        "verifier", min_length=1, description="Custom Ray resource that marks CPU worker nodes for verifiers (fallback: head CPUs)."
    )
    require: list[str] = Field(
        default_factory=lambda: ["host_files_invisible", "no_network", "seccomp", "resource_limits"],
        description="Sandbox defences a verifier actor's machine must provide, else it does not start (names: "
        "`python -m verifier defences`; docs/verifier.md).",
    )
    allow_weak_sandbox: bool = Field(
        False, description="Start verifier actors even where a required defence is missing (development only; warned on every start)."
    )

    @field_validator("require")
    @classmethod
    def _known_defences(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in REQUIRABLE]
        if unknown:
            raise ValueError(f"unknown defence(s) {unknown}; known: {', '.join(REQUIRABLE)}")
        return value


class ResourcesConfig(Section):
    inference_gpus: int = Field(0, ge=0, le=1024, description="GPUs of the inference engine (0 = CPU).")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM tensor parallelism; inference_gpus / tp engine replicas.")
    learner_gpus: int = Field(0, ge=0, le=1024, description="GPUs shared by the teacher and student learners (0 = CPU).")
    learner_cpus: float = Field(1.0, gt=0, le=256, description="CPUs each learner actor reserves.")
    inference_cpus: float = Field(1.0, gt=0, le=256, description="CPUs the inference actor reserves.")
    gpu_memory_gib: float | None = Field(
        None, gt=0, le=4096,
        description="Memory of each GPU for the memory plan, in GiB (an 80 GB A100/H100 has ~80). Unset: what the "
        "cluster's GPUs report (nvidia-smi), else 80.",
    )
    colocated: bool = Field(
        False,
        description="Every GPU holds an inference replica and a learner pair, the phases taking the GPUs in turn: the "
        "engines sleep while the learners train (vLLM's sleep mode, CUDA only; docs/memory.md). Needs "
        "resources.inference_gpus == resources.learner_gpus and resources.tensor_parallel_size 1. On CPU the engine "
        "and the learners share the cores in turn anyway (no sleep mode there).",
    )

    @model_validator(mode="after")
    def _tp_divides(self) -> "ResourcesConfig":
        if self.inference_gpus and self.inference_gpus % self.tensor_parallel_size:
            raise ValueError(
                f"resources.inference_gpus={self.inference_gpus} is not a multiple of "
                f"resources.tensor_parallel_size={self.tensor_parallel_size}"
            )
        if self.colocated and self.inference_gpus != self.learner_gpus:
            raise ValueError(
                f"resources.colocated=true puts an inference replica and a learner pair on every GPU: "
                f"resources.inference_gpus={self.inference_gpus} and resources.learner_gpus={self.learner_gpus} "
                "must be equal"
            )
        if self.colocated and self.tensor_parallel_size != 1:
            raise ValueError(
                f"resources.colocated=true with resources.tensor_parallel_size={self.tensor_parallel_size}: a colocated "
                "replica lives on its one GPU beside that GPU's learners (tensor parallelism across them is not built)"
            )
        return self


class EvalConfig(Section):
    every: int = Field(
        0, ge=0, le=1_000_000,
        description="Evaluate every member and the base on eval.benchmarks every N steps (0 = never); greedy pass@1 goes to "
        "metrics.jsonl and TensorBoard as eval/<benchmark>/<member> (docs/evaluation.md).",
    )
    benchmarks: list[str] = Field(
        default_factory=list, description="Benchmark names of python -m evaluation (NAME=PATH names a file), e.g. ['humaneval+', 'gsm8k']."
    )
    data: Path | None = Field(None, description="Directory holding the benchmark files (as python -m evaluation --data).")
    limit: int = Field(0, ge=0, le=1_000_000, description="Evaluate the first N problems of each benchmark (0 = all).")
    max_tokens: int = Field(512, ge=1, le=65536, description="New tokens per benchmark answer (greedy).")


class RunConfig(Section):
    steps: int = Field(20, ge=1, le=10_000_000, description="Training steps.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of every random choice of the run.")
    checkpoint_every: int = Field(5, ge=1, le=1_000_000, description="Write a checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(
        2, ge=1, le=1_000_000,
        description="Checkpoints of the run kept on disk, the newest by step (the one checkpoints/latest names is "
        "never deleted).",
    )
    run_dir: Path | None = Field(
        None,
        description="Output directory (--run-dir). Default: run.root/<name>-<timestamp>. A relative one is relative to "
        "the current directory, except under `ray job submit`, where it goes under run.root. A directory that holds a "
        "run (config.yaml, metrics.jsonl or checkpoints/) takes only --resume.",
    )
    root: Path | None = Field(
        None,
        description="Where run directories go: the default run directory is run.root/<name>-<timestamp>, and under "
        "`ray job submit` a relative run.run_dir resolves under it (the job's current directory is Ray's temporary "
        "copy of --working-dir). Default: runs/ in the current directory; under `ray job submit`, ~/populora-runs on "
        "the node the driver runs on (the head). On several nodes it must be on a file system every node mounts at the "
        "same path (checked before any actor starts).",
    )
    name: str = Field("populora", min_length=1, max_length=128, description="Run name in logs and the dashboard.")
    dashboard: bool = Field(
        True,
        description="Start Ray's dashboard with the local cluster launch.py starts (false: no dashboard process, ~3 s "
        "less start-up on two cores; progress stays in the terminal, metrics.jsonl and TensorBoard). A cluster the run "
        "attaches to (RAY_ADDRESS, ray job submit) keeps its own.",
    )
    max_recoveries: int = Field(
        3, ge=0, le=1000,
        description="Times the driver may recover by itself from a dead actor (recreate the actors, restore the latest "
                    "checkpoint, continue) before the run fails, failed attempts included; 0 fails at the first dead actor.",
    )
    cluster_wait_s: float = Field(
        300.0, ge=5, le=86_400,
        description="Longest the driver waits for the cluster (placement groups, actors without a node, a recovery's "
        "new set, the cluster to hold the layout again after a node left; closing actors and the path check too); a "
        "line every ~30 s names what is missing, then the run stops cleanly (status failed, --resume to continue).",
    )
    max_staleness: int = Field(
        0, ge=0, le=1,
        description="0: serial steps. 1: the engines generate step t+1 with the adapters one update behind while the "
        "learners train on step t (needs rl.importance_correction 'tis'; the pipeline drains after checkpoint, "
        "evolution and last steps; actors/loop.py).",
    )


TrackingBackend = Literal["tensorboard", "wandb", "mlflow"]
TRACKING_BACKENDS: tuple[str, ...] = get_args(TrackingBackend)
"""Where ``logging.backends`` can send a run's scalars and sample tables (``reporting.tracking``)."""


class LoggingConfig(Section):
    """Experiment tracking (``reporting.tracking``; docs/tracking.md): metrics.jsonl is always written."""

    backends: list[TrackingBackend] = Field(
        ["tensorboard"],
        description="Trackers that get every step's scalars (the same keys in each) and a table of sample proposals "
        "and answers every logging.samples_every steps: tensorboard (RUN_DIR/tensorboard/), wandb and mlflow (the "
        "`tracking` extra: pip install -e '.[tracking]'). A tracker that fails mid-run is dropped with one warning; "
        "metrics.jsonl keeps every step.",
    )
    samples_every: int = Field(
        10, ge=0, le=1_000_000,
        description="Log the step's sample proposals and answers (samples.jsonl's records) as a table every N steps "
        "(0: never).",
    )
    project: str = Field(
        "populora", min_length=1, max_length=128,
        description="The W&B project and the MLflow experiment the run is tracked in (its name there: run.name).",
    )
    wandb_entity: str | None = Field(None, min_length=1, description="W&B entity (team or user; default: yours).")
    mlflow_tracking_uri: str | None = Field(
        None, min_length=1,
        description="MLflow tracking URI (http://host:5000, databricks, file:/path). Default: MLFLOW_TRACKING_URI, "
        "else a SQLite store in the run directory (sqlite:///RUN_DIR/mlflow.db).",
    )

    @field_validator("backends")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"logging.backends names a backend twice: {value}")
        return value


class PlanConfig(Section):
    """What the time plan assumes (``planning.time_plan``); none of it changes a run."""

    gpu_kind: str = Field(
        "H100", min_length=1, max_length=32,
        description="GPU kind of the node the config describes (planning/time_constants.py: H100, H200, A100; others need "
        "plan.constants).",
    )
    nodes: int = Field(1, ge=1, le=1024, description="Nodes of the described cluster (the dry run's --cluster overrides).")
    gpus_per_node: int = Field(
        0, ge=0, le=64, description="GPUs per node (0: resources.inference_gpus + resources.learner_gpus on one node; "
        "colocated: resources.inference_gpus)."
    )
    propose_prompt_tokens: int = Field(1024, ge=1, le=262_144, description="Expected tokens of a teacher's prompt.")
    proposal_tokens: int = Field(512, ge=1, le=262_144, description="Expected new tokens of a proposal.")
    solve_prompt_tokens: int = Field(512, ge=1, le=262_144, description="Expected tokens of a student's prompt.")
    answer_tokens: int = Field(1024, ge=1, le=262_144, description="Expected new tokens of an answer.")
    valid_fraction: float = Field(0.7, gt=0, le=1, description="Expected fraction of proposals that are valid.")
    kv_headroom: float = Field(
        0.5, ge=0, le=0.9,
        description="Fraction of each vLLM replica's paged KV cache the planned max_num_seqs leaves free for sequences "
        "longer than expected (up to model.max_seq_len), so that they run without preemption: the plan's max_num_seqs "
        "fills the rest with sequences of the expected lengths (planning/memory_plan.py).",
    )
    constants: dict[str, float] = Field(
        default_factory=dict,
        description="Overrides of the time plan's constants, '<kind>.<name>' or 'host.<name>' (planning/time_constants.py), "
        "e.g. {'H100.train_mfu': 0.3} after measuring with bench/learner.py.",
    )
    constants_file: str | None = Field(
        None, min_length=1,
        description="A node's measured constants (python -m planning.calibrate --out node.yaml; launch.py --constants): "
        "those that describe this plan's device kind, model, engine and versions are used, the others ignored with "
        "why; plan.constants still win.",
    )


class Config(Section):
    """The whole run configuration (sections in the order of the design)."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="The frozen base model.")
    lora: LoRAConfig = Field(default_factory=LoRAConfig, description="Adapter shape.")
    population: PopulationConfig = Field(default_factory=PopulationConfig, description="Teachers and students.")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="Task families and sampling.")
    rewards: RewardsConfig = Field(default_factory=RewardsConfig, description="Reward values.")
    rl: RLConfig = Field(default_factory=RLConfig, description="Policy-gradient update.")
    league: LeagueConfig = Field(default_factory=LeagueConfig, description="Ratings and matching.")
    evolution: EvolutionConfig = Field(default_factory=EvolutionConfig, description="Weight-space evolution.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Generation.")
    verifier: VerifierConfig = Field(default_factory=VerifierConfig, description="Sandboxed execution pool.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="GPUs and CPUs per actor.")
    run: RunConfig = Field(default_factory=RunConfig, description="Length, seed, checkpoints, outputs.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Benchmark evaluation during training.")
    plan: PlanConfig = Field(default_factory=PlanConfig, description="What the dry run's time plan assumes.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Experiment tracking.")

    @model_validator(mode="after")
    def _hindsight_targets_have_no_behaviour_policy(self) -> "Config":
        if self.rl.hindsight_coef > 0 and self.rl.importance_correction != "off":
            raise ValueError(
                f"rl.hindsight_coef={self.rl.hindsight_coef:g} adds supervised targets that no engine sampled, so they have "
                f"no behaviour log-probs to weigh by rl.importance_correction='{self.rl.importance_correction}': set "
                "rl.importance_correction=off (and run.max_staleness=0) or rl.hindsight_coef=0"
            )
        return self

    @model_validator(mode="after")
    def _no_evolution_without_learning(self) -> "Config":
        if not self.rl.train and self.evolution.enabled:
            raise ValueError(
                "rl.train=false is the control in which nothing learns, but evolution.enabled=true would still change "
                "the members: set evolution.enabled=false as well"
            )
        return self

    @model_validator(mode="after")
    def _data_parallel_has_learners_to_split_over(self) -> "Config":
        if self.rl.data_parallel and self.resources.learner_gpus < 2:
            raise ValueError(
                f"rl.data_parallel=true splits each member's samples across the learner GPUs, but "
                f"resources.learner_gpus={self.resources.learner_gpus} gives each role one learner: set "
                "resources.learner_gpus >= 2 or rl.data_parallel=false"
            )
        return self

    def vllm_engine_args(self) -> dict[str, Any]:
        """The keyword arguments each vLLM engine replica gets: ``inference.vllm_engine_args`` plus, with
        ``resources.tensor_parallel_size`` > 1, that size and the multiprocessing executor (the replica's actor
        already holds its tp GPUs; vLLM's Ray executor would ask Ray for tp more, vllm-project/vllm#30016), unless
        the user chose an executor."""
        args = dict(self.inference.vllm_engine_args)
        tp = self.resources.tensor_parallel_size
        if tp > 1:
            args["tensor_parallel_size"] = tp
            args.setdefault("distributed_executor_backend", "mp")
        return args

    @model_validator(mode="after")
    def _parallelism_set_once(self) -> "Config":
        if "tensor_parallel_size" in self.inference.vllm_engine_args:
            raise ValueError(
                "inference.vllm_engine_args.tensor_parallel_size: set resources.tensor_parallel_size instead (the "
                "placement gives each engine replica that many GPUs and passes the size to vLLM)"
            )
        return self

    @model_validator(mode="after")
    def _tensor_parallelism_is_vllms(self) -> "Config":
        """An engine without tensor parallelism (``configs.engines``: the transformers engine) runs each replica on one
        device: with ``resources.tensor_parallel_size`` > 1 a replica would hold that many GPUs and use one."""
        backend = self.inference.backend
        if backend != "auto" and not engine_traits(backend).tensor_parallel and self.resources.tensor_parallel_size > 1:
            able = ", ".join(name for name, t in ENGINES.items() if t.tensor_parallel)
            raise ValueError(
                f"resources.tensor_parallel_size={self.resources.tensor_parallel_size} splits each engine replica over "
                f"that many GPUs, which only {able} does; inference.backend='{backend}' "
                f"({engine_traits(backend).label}) runs a replica on one GPU: set resources.tensor_parallel_size=1 "
                f"(more replicas instead) or inference.backend={able.split(', ')[0]}"
            )
        return self

    def overlap_drains_after(self, step: int, last_step: int) -> bool:
        """Whether an overlapped run (``run.max_staleness: 1``) lets its pipeline drain after ``step``: after a
        checkpoint step, an evolution step and the last step, step + 1 is generated only after update ``step``
        is published. The one rule of the loop (``actors.loop.drains_after``) and the time plan
        (``planning.time_plan.drained_steps``)."""
        evolves = self.evolution.enabled and step % self.evolution.period == 0
        return step >= last_step or step % self.run.checkpoint_every == 0 or evolves

    @model_validator(mode="after")
    def _overlap_is_possible(self) -> "Config":
        """``run.max_staleness: 1`` needs the importance correction and generation and training on separate devices
        (so not the colocated layout)."""
        if not self.run.max_staleness:
            return self
        if self.resources.colocated:
            raise ValueError(
                "run.max_staleness=1 generates while the learners train; resources.colocated=true runs the two in turn "
                "on the same GPUs (the engines sleep while the learners train): set run.max_staleness=0 or "
                "resources.colocated=false"
            )
        if self.rl.importance_correction == "off":
            raise ValueError(
                "run.max_staleness=1 trains on samples drawn one update behind: it needs rl.importance_correction='tis' "
                "(rl.importance_correction is 'off')"
            )
        res = self.resources
        if not res.inference_gpus and not res.learner_gpus and (res.inference_cpus < 1 or res.learner_cpus < 1):
            raise ValueError(
                f"run.max_staleness=1 runs generation and training at once, on separate devices; on this CPU-only layout "
                f"(resources.inference_gpus=0, resources.learner_gpus=0) resources.inference_cpus={res.inference_cpus:g} "
                f"and resources.learner_cpus={res.learner_cpus:g} reserve fractions of a core, so the engine and the "
                "learners would share cores: reserve whole cores (both >= 1) or put either on GPUs"
            )
        return self
