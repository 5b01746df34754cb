"""The running system: every actor handle, and the driver-side calls the loop makes on them.

``System.start`` creates the actors of the placement plan (named, in namespace ``populora``): the
inference engine, one learner per role (per learner GPU), the verifier pool and the league.
Members are LoRA adapters named by id (``t0``, ``s0``, ...; ``a0`` for the single agent); the
league owns the registry, each learner owns the trainable copies of its role's members, the engine
serves the published versions.

Colocated (``resources.colocated``): every GPU holds an engine replica and a learner pair, which take it in
turn. The engines start alone on their GPUs (vLLM sizes its KV cache from the memory free at start-up) and go
to sleep before the learners start; ``sleep_engines`` frees their memory before every update and
``wake_engines`` (after the learners return their cached blocks) takes it back before the engines are used
again; every engine call wakes them first. Where an engine has no sleep mode (CPU) these calls change nothing.

No silent state: the driver keeps the member -> learner table (``owners``, read from the learners at
start and after a restore, moved on evolution); a sample of a member no learner owns is an error.
With ``rl.data_parallel`` every learner of a role holds a replica of each of the role's members (same slot
table, same seed): a step is split across them (:func:`train_replicas`), evolution and restores go to
every replica, and one replica (the role's first learner) exports and checkpoints them. After
every publish each engine replica's adapter versions must equal the learners' (``check_versions``).
Stateful actors are never restarted by Ray (``max_restarts=0``): when one dies the driver stops them all
and starts a new ``System`` from the latest checkpoint (``actors.driver``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.cluster import actor_options, reserve_gpus
from actors.cluster_wait import ClusterWait, actor_record
from actors.node_cleanup import clean_node
from planning.dispatch import Policy, expected_cost, pieces, replica_batch_rows
from inference.requests import GenerationRequest
from actors.inference_actor import InferenceActor
from actors.league_actor import LeagueActor
from actors.learner_actor import LearnerActor
from learners.settings import LearnerSettings
from planning.model_files import base_model_name
from planning.placement import PlacementPlan
from checkpoints import file_digest, mark_checkpoint_dir, read_checkpoint_token
from rollouts import Sample
from actors.verifier_pool import VerifierActor, VerifierPool
from configs import Config
from verifier.metrics import Coverage


def wait_names_free(names: list[str], timeout_s: float = 60.0) -> None:
    """Wait until no live actor holds any of ``names`` in namespace ``populora`` (``ray.kill`` is asynchronous;
    a new system reuses the names)."""
    from actors.cluster import NAMESPACE

    deadline = time.monotonic() + timeout_s
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.1)


def close_and_kill(actors: list[Any], closing: list[Any], groups: dict[int, Any], names: list[str],
                   timeout_s: float = 60.0) -> None:
    """Tear actors down: wait (at most ``timeout_s``, the run's ``run.cluster_wait_s``) for the ``closing`` calls that release what they hold outside
    their processes, kill them, remove the learners' placement groups and wait until their names are free.
    Dead actors among them are fine. ``System.stop`` and a start that failed half-way both end this way."""
    if closing:
        ray.wait(closing, num_returns=len(closing), timeout=timeout_s)
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass
    for group in groups.values():
        remove_placement_group(group)
    wait_names_free(names, timeout_s)


def in_plan_order(plan: PlacementPlan, inference: list[Any], learners: dict[str, list[Any]], verifiers: list[Any],
                  league: Any) -> list[Any]:
    """The actor handles in the order of ``plan.actors``."""
    it = {"inference": iter(inference), "verifier": iter(verifiers), "league": iter([league])}
    shards = {role: iter(handles) for role, handles in learners.items()}
    return [next(shards[a.role.removeprefix("learner-")]) if a.role.startswith("learner") else next(it[a.role])
            for a in plan.actors]


def initial_members(config: Config) -> list[tuple[str, str]]:
    """(id, role) of the starting population; the single agent is one member playing both roles."""
    if config.population.single_agent:
        return [("a0", "agent")]
    return [(f"t{i}", "teacher") for i in range(config.population.teachers)] + [
        (f"s{i}", "student") for i in range(config.population.students)
    ]


@dataclass
class System:
    config: Config
    plan: PlacementPlan
    inference: list[Any]  # one engine replica per entry; requests are split between them
    learners: dict[str, list[Any]]  # role -> learner shards
    verifiers: "VerifierCalls"
    league: Any
    backend: str
    coverage: Coverage = field(default_factory=Coverage)
    versions: dict[str, int] = field(default_factory=dict)
    # member -> indices into ``flat_learners`` of the learners holding it: one, or with rl.data_parallel every
    # learner of its role (identical replicas); the first exports it and writes it into checkpoints
    owners: dict[str, list[int]] = field(default_factory=dict)
    model_path: str | None = None  # the learners' shared base of it is released on every node by ``stop``
    _learner_groups: dict[int, Any] = field(default_factory=dict)
    _scratch: list[tuple[str, list[str]]] = field(default_factory=list)  # (node, RAM-backed dirs and shm segments) of the engines
    sleep_mode: str = ""  # colocated: how the engines sleep while the learners train, or why they do not
    asleep: bool = False  # colocated: the engines sleep (the learners have their GPUs)
    runtime: str = ""  # what the engines run: vLLM's version, model runner and CUDA graphs, or transformers'

    # start / stop ------------------------------------------------------------------------------
    @classmethod
    def start(cls, config: Config, plan: PlacementPlan, model_path: str, wait: ClusterWait | None = None) -> "System":
        """Create every planned actor and wait until they answer. If one dies or fails while the system starts
        (a second fault during a recovery, say), the ones already made are closed and killed and their names
        freed before the error is raised: a half-started system would hold the names and resources the next
        attempt needs. Every wait for the cluster is bounded by ``wait`` (default: ``run.cluster_wait_s``):
        past it, ``ClusterWaitError`` after the same clean-up."""
        wait = wait or ClusterWait(config.run.cluster_wait_s, plan)
        groups: dict[int, Any] = {}
        members = initial_members(config)
        cfg = config
        made: dict[str, list[Any]] = {"inference": [], "learners": [], "verifiers": [], "league": []}
        try:
            pinned = reserve_gpus(plan, groups, wait)  # every GPU actor's node, before any of them starts
            inference = [
                InferenceActor.options(**actor_options(plan, replica, groups, pinned)).remote(
                    cfg.inference.backend, model_path, max_adapters=len(members), max_lora_rank=cfg.lora.rank,
                    dtype=cfg.model.dtype, max_model_len=cfg.model.max_seq_len, engine_args=cfg.vllm_engine_args(),
                    seed=cfg.run.seed, target_modules=tuple(cfg.lora.target_modules),
                    sleep_mode=cfg.resources.colocated, allow_untested_vllm=cfg.inference.allow_untested_vllm,
                )
                for replica in plan.by_role("inference")
            ]
            made["inference"] = inference
            engines = dict(zip((a.name for a in plan.by_role("inference")), inference))
            sleep_mode, asleep = "", False
            if cfg.resources.colocated:  # the engines start alone on their GPUs, then sleep before the learners start
                sleep_mode = wait.get([inference[0].sleep_mode.remote()], engines, "the engine replicas")[0]
                asleep = any(wait.get([replica.sleep.remote() for replica in inference], engines, "the engine replicas"))
            learners: dict[str, list[Any]] = {}
            handles: dict[int, Any] = {}  # learner GPU -> CUDA IPC handle of its base copy
            for actor in plan.actors:
                if not actor.role.startswith("learner"):
                    continue
                role = actor.role.removeprefix("learner-")
                shard = len(learners.get(role, []))
                owned = [m for i, (m, r) in enumerate(x for x in members if x[1] == role)
                         if cfg.rl.data_parallel or i % plan.learner_shards == shard]  # replicas hold every member
                learner = LearnerActor.options(**actor_options(plan, actor, groups)).remote(
                    model_path, owned, LearnerSettings.from_config(cfg, role),
                    cfg.run.seed + (0 if cfg.rl.data_parallel else shard),  # replicas start identical
                    cuda_base=handles.get(actor.gpu_ids[0]) if actor.gpu_ids else None,
                    base_name=base_model_name(cfg, model_path),
                )
                made["learners"].append(learner)
                if actor.gpu_ids and actor.gpu_ids[0] not in handles:
                    handles[actor.gpu_ids[0]] = wait.get([learner.cuda_base_handle.remote()], {actor.name: learner},
                                                         f"learner {actor.name}")[0]
                learners.setdefault(role, []).append(learner)
            verifier_actors = [
                VerifierActor.options(**actor_options(plan, a, groups)).remote(
                    cfg.verifier.timeout_s, cfg.verifier.memory_mb, cfg.verifier.max_output_chars,
                    max(1, int(a.num_cpus)), require=list(cfg.verifier.require),
                    allow_weak_sandbox=cfg.verifier.allow_weak_sandbox,
                )
                for a in plan.by_role("verifier")
            ]
            made["verifiers"] = verifier_actors
            seed_file = cfg.tasks.seed_file or (Path(model_path) / "tasks.jsonl" if (Path(model_path) / "tasks.jsonl").is_file() else None)
            league = LeagueActor.options(**actor_options(plan, plan.by_role("league")[0], groups)).remote(
                cfg.model_dump(mode="json"), members, str(seed_file) if seed_file else None
            )
            made["league"] = [league]
            named = {a.name: h for a, h in zip(plan.actors, in_plan_order(plan, inference, learners, verifier_actors, league))
                     if a.role != "verifier"}
            backend, runtime = wait.get([inference[0].backend.remote(), inference[0].runtime.remote()], engines,
                                        "the engine replicas")
            wait.get([l.ready.remote() for shards in learners.values() for l in shards] + [league.ready.remote()],
                     named, "the learners and the league")
            system = cls(cfg, plan, inference, learners, VerifierCalls(VerifierPool(verifier_actors)), league, backend,
                         model_path=model_path, _learner_groups=groups,
                         _scratch=wait.get([r.scratch.remote() for r in inference], engines, "the engine replicas"),
                         sleep_mode=sleep_mode, asleep=asleep, runtime=runtime)
            system.read_owners()
            return system
        except BaseException:  # close the engines and verifiers that still answer (their RAM-backed files)
            close_and_kill([h for handles in made.values() for h in handles],
                           [h.close.remote() for h in made["inference"] + made["verifiers"]], groups,
                           [a.name for a in plan.actors], cfg.run.cluster_wait_s)
            raise

    @property
    def flat_learners(self) -> list[Any]:
        """Every learner shard, in a fixed order (role, then shard): the index of ``owners`` and of ``learners/<i>``."""
        return [l for shards in self.learners.values() for l in shards]

    def _planned_handles(self) -> list[Any]:
        """Handles in the order of ``plan.actors``."""
        return in_plan_order(self.plan, self.inference, self.learners, self.verifiers.pool.actors, self.league)

    def dead_actors(self, settle_s: float = 10.0) -> list[str]:
        """Names of the stateful actors Ray records as dead (its GCS actor table; verifiers restart by themselves).
        Read from Ray's state, never from a call: a busy learner answers a call only after its running work, and
        would look dead. An actor's death reaches the table shortly after the driver sees its error (a lost
        node's actors once Ray notices the node is gone), so while none is recorded dead this looks again for
        up to ``settle_s``."""
        deadline = time.monotonic() + settle_s
        while True:
            dead = [actor.name for actor, handle in zip(self.plan.actors, self._planned_handles())
                    if actor.role != "verifier" and actor_record(handle).get("State", "DEAD") == "DEAD"]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.2)

    def stop(self, release_shared_base: bool = True) -> list[str]:
        """Release what the actors hold outside their processes (/dev/shm copies, sandbox scratch), then kill
        them and wait until their names are free. Works with dead actors among them (a recovery stops a
        system one of whose actors was killed): what a dead engine left in RAM-backed storage is removed on
        its node. The learners' shared base is released on every alive node (learners may have run on any;
        a recovered system's on others than this one's); ``release_shared_base=False`` keeps it for the next
        system. Returns the ids of the nodes cleaned."""
        cleanups = [r.close.remote() for r in self.inference] + [v.close.remote() for v in self.verifiers.pool.actors]
        bound = self.config.run.cluster_wait_s
        close_and_kill(self._planned_handles(), cleanups, self._learner_groups, [a.name for a in self.plan.actors], bound)
        alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        scratch: dict[str, list[str]] = {}
        for node, paths in self._scratch:
            if node in alive:
                scratch.setdefault(node, []).extend(paths)
        nodes = alive if release_shared_base and self.model_path else list(scratch)
        calls = [clean_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                     scratch.get(node, []), self.model_path if release_shared_base else None, self.config.model.dtype)
                 for node in nodes]
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=bound) if calls else ([], [])
        self._learner_groups, self._scratch = {}, []  # stopping twice (a failed recovery, then the end) is harmless
        cleaned = []
        for ref in done:
            try:
                cleaned.append(ray.get(ref))
            except Exception:  # the node went away meanwhile, and its /dev/shm with it
                pass
        return cleaned

    # generation --------------------------------------------------------------------------------
    def request(self, member: str, prompt: str, n: int = 1, seed: int | None = None) -> GenerationRequest:
        inf = self.config.inference
        return GenerationRequest(adapter=member, prompt=prompt, temperature=inf.temperature, top_p=inf.top_p,
                                 max_tokens=inf.max_tokens, n=n, seed=seed)

    def seed(self, step: int, phase: str, index: int) -> int:
        """A per-request seed derived from (run seed, step, phase, index), spaced so n samples never collide."""
        digest = hashlib.sha256(f"{self.config.run.seed}/{step}/{phase}/{index}".encode()).digest()
        return int.from_bytes(digest[:4], "little") * 64 % (2**31 - 64)

    def sleep_engines(self) -> None:
        """Colocated: the engines free their GPU memory for the learners' update (no-op otherwise, or where the
        engines have no sleep mode)."""
        if self.config.resources.colocated and not self.asleep:
            self.asleep = any(ray.get([replica.sleep.remote() for replica in self.inference]))

    def wake_engines(self) -> None:
        """Colocated: the learners return their cached blocks, then the engines take their memory back."""
        if self.asleep:
            ray.get([l.release_memory.remote() for l in self.flat_learners])
            ray.get([replica.wake_up.remote() for replica in self.inference])
            self.asleep = False

    def generate(self, requests: list[GenerationRequest], policy: Policy = "queue",
                 min_rows: int | None = None) -> list[list[Any]]:
        """Generations per request, in order. The batch is cut into pieces (``planning.dispatch.pieces``, none
        below a replica's full batch; one replica: one piece); each replica gets one piece to run and one queued
        behind it, and whichever returns first gets the next. ``policy="even"``: one piece per replica, the split
        of old; ``min_rows`` (default: a replica's batch, ``replica_batch_rows``) the fewest rows of a piece
        (``bench/replica_balance.py`` compares the policies with 0)."""
        if not requests:
            return []
        self.wake_engines()
        waiting = deque(pieces([expected_cost(r) for r in requests], len(self.inference), policy,
                               rows=[r.n for r in requests],
                               min_rows=replica_batch_rows(self.config) if min_rows is None else min_rows))
        running: dict[ray.ObjectRef, tuple[Any, list[int]]] = {}

        def hand(replica: Any) -> None:
            piece = waiting.popleft()
            running[replica.generate.remote([requests[i] for i in piece])] = (replica, piece)

        for replica in self.inference * 2:  # one running, one queued
            if waiting:
                hand(replica)
        results: list[list[Any]] = [[] for _ in requests]
        while running:
            (done,), _ = ray.wait(list(running), num_returns=1)
            replica, piece = running.pop(done)
            for i, out in zip(piece, ray.get(done)):
                results[i] = out
            if waiting:
                hand(replica)
        return results

    # learners ----------------------------------------------------------------------------------
    def read_owners(self) -> None:
        """Ask every learner which members it owns (at start and after a restore)."""
        self.owners = {}
        for i, mine in enumerate(ray.get([l.members.remote() for l in self.flat_learners])):
            for member in mine:
                self.owners.setdefault(member, []).append(i)

    def learner_of(self, member: str) -> Any:
        """The learner that exports ``member`` (its only one, or its first replica)."""
        return self.replicas_of(member)[0]

    def replicas_of(self, member: str) -> list[Any]:
        """Every learner holding ``member``: one, or with ``rl.data_parallel`` every learner of its role."""
        if member not in self.owners:
            raise KeyError(f"no learner owns member {member!r} (owned: {sorted(self.owners)})")
        flat = self.flat_learners
        return [flat[i] for i in self.owners[member]]

    def train(self, samples: list[Sample]) -> dict[str, Any]:
        """Every learner trains all its members present in ``samples`` in one pass; returns per-member stats.

        A sample of a member no learner owns is an error (never dropped)."""
        return self.finish_training(self.start_training(samples))

    def start_training(self, samples: list[Sample]) -> list[ray.ObjectRef]:
        """Send the samples to the learners holding their members and return at once (the update runs in the
        learners): each learner its own members', or with ``rl.data_parallel`` each role's replicas the role's
        (:func:`train_replicas`)."""
        unowned = sorted({s.member for s in samples} - set(self.owners))
        if unowned:
            raise RuntimeError(f"samples of {unowned}, members no learner owns (learners own {sorted(self.owners)})")
        by_holders: dict[tuple[int, ...], list[Sample]] = {}
        for s in samples:
            by_holders.setdefault(tuple(self.owners[s.member]), []).append(s)
        flat, calls = self.flat_learners, []
        for holders, mine in by_holders.items():
            if len(holders) == 1:
                calls.append(flat[holders[0]].train.remote(mine))
            else:
                calls += train_replicas([flat[i] for i in holders], mine, self.config.rl.epochs)
        return calls

    def finish_training(self, calls: list[ray.ObjectRef]) -> dict[str, Any]:
        """Wait for the learners' updates of :meth:`start_training`; per-member stats.

        With ``rl.data_parallel`` every ``apply_gradients`` of every epoch is among ``calls``: each reports what
        its replica holds of the members it stepped (``learners.data_parallel.AppliedGradients``), and
        ``check_replicas`` compares the replicas of each member, apply by apply (weights' and AdamW moments'
        sums, step counts, exactly) and their statistics (NaN equal to NaN: a skipped non-finite step reports
        nan on every replica). A difference raises ``RuntimeError``: the replicas have diverged. Compared here,
        once every result is fetched, so nothing waits between the epochs' calls (``train_replicas``)."""
        from learners.data_parallel import AppliedGradients, check_replicas

        stats: dict[str, Any] = {}
        applied = []
        for result in ray.get(calls):
            if isinstance(result, AppliedGradients):
                applied.append(result)
                result = result.stats
            for member, values in result.items():
                stats.setdefault(member, values)  # a member's replicas report the same: check_replicas
        check_replicas(applied)
        return stats

    def publish_adapters(self, all_members: bool = False, members: list[str] | None = None) -> None:
        """Export each learner's members as new versions and make them live in every engine replica.

        Each version crosses the object store once: its learner puts the PEFT files (in the serving dtype)
        and returns a reference; the driver hands that same reference to every replica, which maps it
        (zero-copy on the learner's node). No adapter bytes pass through the driver. Then every replica's
        versions are checked against the learners' (``check_versions``).
        """
        flat = self.flat_learners
        self.wake_engines()
        exporting: dict[int, list[str]] = {}  # each member from the first learner holding it
        for member, holders in self.owners.items():
            if members is None or member in members:
                exporting.setdefault(holders[0], []).append(member)
        exports = ray.get([flat[i].export.remote(mine, self.config.model.dtype) for i, mine in exporting.items()])
        loads = []
        for exported in exports:
            for member, (version, (ref,)) in exported.items():
                self.versions[member] = version
                loads += [replica.load_adapter_files.remote(member, ref, version) for replica in self.inference]
        ray.get(loads)
        self.check_versions()

    def check_versions(self) -> None:
        """Raise unless every engine replica serves exactly the members the learners own, at the versions
        they exported (one cheap call per replica)."""
        expected = {m: self.versions.get(m) for m in self.owners}
        for i, served in enumerate(ray.get([replica.adapters.remote() for replica in self.inference])):
            if dict(served) != expected:
                raise RuntimeError(f"inference replica {i} serves adapter versions {dict(sorted(served.items()))}, "
                                   f"the learners hold {dict(sorted(expected.items()))}")

    # evolution ---------------------------------------------------------------------------------
    def evolve(self, step: int, last_step: int | None = None) -> list[dict[str, Any]]:
        """The league picks victims and parents; the child is made from the parents' adapters and takes
        the victim's learner slot (fresh optimizer state; in every replica) and engine adapter. Nothing at the
        run's last step ``last_step`` (``ReplacementPolicy.due``: a child made there would never train).

        The weights move by reference: the parents' state dicts go from their learners to the league
        (top-level arguments, resolved by Ray in the league), the child's from the league to the learner;
        the driver fetches only the lineage event."""
        events = []
        for selection in ray.get(self.league.plan_replacements.remote(step, last_step)):
            parents = [self.learner_of(p).state_dict.remote(p) for p in selection.parents]
            event_ref, child_state = self.league.make_child.remote(selection, *parents)
            event = ray.get(event_ref)
            ray.get([l.replace.remote(selection.victim, event["child"], child_state)
                     for l in self.replicas_of(selection.victim)])
            self.owners[event["child"]] = self.owners.pop(selection.victim)
            self.versions.pop(selection.victim, None)
            self.wake_engines()
            ray.get([replica.remove_adapter.remote(selection.victim) for replica in self.inference])
            self.publish_adapters(members=[event["child"]])
            events.append(event)
        return events

    # metrics and checkpoints -------------------------------------------------------------------
    def publish_metrics(self, row: dict[str, Any]) -> None:
        ray.get(self.league.publish_metrics.remote(row))

    def checkpoint(self, directory: Path, step: int) -> dict[str, dict[str, Any]]:
        """Fill the (temporary) checkpoint ``directory``: each learner writes its own files under
        ``learners/<i>/`` (nothing passes through the driver; of identical replicas only the first,
        :meth:`checkpoint_sources`); the driver writes the league's and its own. Returns the manifest entries
        of every file (each learner hashes its own)."""
        token = mark_checkpoint_dir(directory)
        flat, writers = self.flat_learners, sorted(set(self.checkpoint_sources()))
        written = ray.get([flat[i].checkpoint.remote(str(directory), token, f"learners/{i}") for i in writers])
        entries = {f"learners/{i}/{name}": entry for i, files in zip(writers, written) for name, entry in files.items()}
        (directory / "league.json").write_text(json.dumps(ray.get(self.league.state_dict.remote())))
        (directory / "driver.json").write_text(json.dumps({
            "step": step, "coverage": self.coverage.state_dict(), "versions": self.versions,
        }))
        for name in (".checkpoint-id", "league.json", "driver.json"):
            entries[name] = file_digest(directory / name)
        return entries

    def checkpoint_sources(self) -> list[int]:
        """Per learner (index into ``flat_learners``), whose ``learners/<i>`` files hold its state: its own, or
        with ``rl.data_parallel`` its role's first learner's (the replicas are identical: one writes, all read)."""
        sources, offset = [], 0
        for shards in self.learners.values():
            sources += [offset if self.config.rl.data_parallel else offset + k for k in range(len(shards))]
            offset += len(shards)
        return sources

    def restore(self, directory: Path) -> None:
        """Load a checkpoint written by ``checkpoint``: each learner reads its own files from ``directory``
        (every replica its first replica's); the engines then serve exactly the saved versions (checked)."""
        flat = self.flat_learners
        token = read_checkpoint_token(directory)
        ray.get([l.restore.remote(str(directory), token, f"learners/{source}")
                 for l, source in zip(flat, self.checkpoint_sources())])
        self.read_owners()
        saved = json.loads((directory / "league.json").read_text())
        ray.get(self.league.load_state_dict.remote(saved))
        restored = ray.get(self.league.state_dict.remote())
        if json.dumps(restored, sort_keys=True) != json.dumps(saved, sort_keys=True):
            raise RuntimeError(f"the league state restored from {directory} differs from the saved one")
        if set(self.owners) != set(saved["roles"]):
            raise RuntimeError(f"{directory}: the learners own {sorted(self.owners)}, the league lists {sorted(saved['roles'])}")
        driver = json.loads((directory / "driver.json").read_text())
        self.coverage.load_state_dict(driver["coverage"])
        self.versions = {}
        self.publish_adapters(all_members=True)
        if self.versions != driver["versions"]:
            raise RuntimeError(f"{directory}: the restored learners export versions {self.versions}, the checkpoint "
                               f"recorded {driver['versions']}")


def train_replicas(replicas: list[Any], samples: list[Sample], epochs: int) -> list[ray.ObjectRef]:
    """Submit one data-parallel update of the members every learner of ``replicas`` holds (``rl.data_parallel``,
    ``learners.data_parallel``) and return its calls without waiting.

    ``samples`` are put into the object store once; replica k takes share k of their split by tokens
    (``LearnerActor.share``). Per epoch each replica's gradients are one object (what ``share_gradients``
    returns) and every replica fetches all of them itself (top-level arguments, never through the driver) and
    applies their sum in replica order. No ``ray.get`` is needed between the calls: one caller's calls on an
    actor run in the order submitted, so the driver stays free (an overlapped step generates meanwhile).
    The last epoch's ``apply_gradients`` calls return the statistics, the same on every replica."""
    ref = ray.put(samples)
    calls = [replica.share.remote(ref, k, len(replicas)) for k, replica in enumerate(replicas)]
    for _ in range(epochs):
        parts = [replica.share_gradients.remote() for replica in replicas]
        calls += [replica.apply_gradients.remote(*parts) for replica in replicas]
    return calls


class VerifierCalls:
    """The two verifier calls of a step, spread over the pool (chunked, retried when an actor dies)."""

    def __init__(self, pool: VerifierPool):
        self.pool = pool

    def validate(self, jobs: list[Any], proposals: list[Any], n_inputs: int) -> list[Any]:
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].family)
        out: list[Any] = [None] * len(jobs)
        for family in sorted({j.family for j in jobs}):
            idx = [i for i in order if jobs[i].family == family]
            results = self.pool.map(lambda a, chunk, f=family: a.validate.remote(f, chunk, n_inputs), [proposals[i] for i in idx])
            for i, r in zip(idx, results):
                out[i] = r
        return out

    def judge(self, items: list[tuple[Any, str]]) -> list[Any]:
        return self.pool.map(lambda a, chunk: a.judge.remote(chunk), items) if items else []
