"""``train(config)``: resolve the model, start the actors, run the steps, checkpoint, summarise.

Progress: one line per step (valid and solve rates, rewards, ratings, evolution, seconds), under a
tqdm bar where stderr is a terminal (``step_bar``); a summary at the end, after which nothing prints. The actors' output goes to
``RUN_DIR/logs/<actor>.log`` and the driver's log records to ``RUN_DIR/logs/driver.log``
(``actors.cluster.connect``). ``output``: ``"quiet"`` prints errors and the summary only,
``"verbose"`` forwards the actors' output to the terminal (Ray's forwarding) and logs DEBUG. ``--resume`` restores the latest complete checkpoint of the run
directory (adapters, optimizer states, league and lineage, buffers, RNG states) and continues.

Recovery: when an actor dies (a learner, the engine, the league; a killed verifier is retried by the
pool), whether killed, crashed, killed by Ray's memory monitor (which the log names, with the largest memory users
Ray reported, and which is followed by a bounded wait for the node's memory) or lost with its node, the driver stops
every actor, starts a new set, restores the latest complete checkpoint into it
and continues from the step after it, at most ``run.max_recoveries`` times. The steps after the
checkpoint are recomputed identically; metrics.jsonl drops their first rows and gets one
``{"event": "recovery", ...}`` record. ``RUN_DIR/status.json`` says why the run stopped.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from actors.memory_kills import MemoryKill, memory_kill
from configs import Config
from checkpoints import CheckpointWriteError, checkpoint_step
from planning.model_files import resolve_model
from reporting.run_dir import LOG_FORMAT, RunDirectory, RunDirectoryError, config_run_dir, fresh_run_refusal
from reporting.tracking import check_tracking

log = logging.getLogger("populora")
progress_log = logging.getLogger("populora.progress")  # the lines the terminal shows: into driver.log, not twice on screen

OUTPUT_MODES = ("quiet", "default", "verbose")
TERMINAL_LOG_LEVEL = {"quiet": logging.ERROR, "default": logging.WARNING, "verbose": logging.DEBUG}


def format_step(row: dict[str, Any], total: int) -> str:
    ratings = " ".join(f"{m['id']}={m['mu']:.1f}" for m in row["members"])
    evo = "".join(f" | evolved {e['child']}<-{'+'.join(e['parents'])} ({e['operator']})" for e in row["evolution"])
    seconds = sum(row["phase_seconds"].values())
    return (
        f"step {row['step']:>4}/{total} | valid {row['valid_rate']:.2f} solve {row['solve_rate']:.2f} | "
        f"reward T {row['teacher_reward']:+.2f} S {row['student_reward']:+.2f} | depth {row['program_ast_depth']:.1f} "
        f"cov {row['coverage']} | idle {row.get('idle_student_share', 0.0):.2f} | mu {ratings}{evo} | {seconds:.0f}s"
    )


def summary(rows: list[dict[str, Any]], run: RunDirectory, wall: float) -> str:
    if not rows:
        return "no steps were run"
    first, last = rows[0], rows[-1]
    events = sum(len(r["evolution"]) for r in rows)
    best = max(last["members"], key=lambda m: m["mu"] - 3 * m["sigma"])
    solvers = [m for m in last["members"] if m.get("role") in ("student", "agent")] or last["members"]
    solver = max(solvers, key=lambda m: m["mu"] - 3 * m["sigma"])
    return "\n".join([
        f"run finished: steps {first['step']}..{last['step']} in {wall / 60:.1f} min -> {run.root}",
        f"  valid rate   {first['valid_rate']:.2f} -> {last['valid_rate']:.2f}",
        f"  solve rate   {first['solve_rate']:.2f} -> {last['solve_rate']:.2f}",
        f"  AST depth    {first['program_ast_depth']:.2f} -> {last['program_ast_depth']:.2f}; coverage {last['coverage']} n-grams",
        f"  evolution    {events} events; strongest member {best['id']} (mu {best['mu']:.2f}, sigma {best['sigma']:.2f})",
        f"  logs:        {run.logs} (driver.log, one file per actor)",
        f"  plots:       python -m reporting {run.root}",
        f"  export:      python -m evaluation.export {run.root} --member {solver['id']}   (its strongest solver; --merge for a full model)",
    ])


class Terminal:
    """What the driver tells the terminal: its progress lines unless ``quiet`` (errors and the summary are
    printed in every mode, by the callers). Every line also goes to the log (``RUN_DIR/logs/driver.log``)."""

    def __init__(self, output: str):
        if output not in OUTPUT_MODES:
            raise ValueError(f"output must be one of {OUTPUT_MODES}, got {output!r}")
        self.output = output
        self.quiet = output == "quiet"

    def say(self, line: str) -> None:
        progress_log.info(line)
        if not self.quiet:
            print(f"[populora] {line}", flush=True)


def step_bar(total: int, name: str, quiet: bool, stream: TextIO | None = None):
    """The run's progress bar on ``stream`` (stderr), drawn only where that is a terminal: redirected to a file or a
    pipe (``ray job submit``, ``> log``) it would add a redraw to every step's line, so there only the step lines
    show. Disabled with ``quiet`` too; ``bar.write`` prints a line either way."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    return tqdm(total=total, desc=name, unit="step", file=stream, dynamic_ncols=True,
                disable=quiet or not stream.isatty())


def attach_log_handlers(run: RunDirectory, output: str) -> list[logging.Handler]:
    """Route this process's log records: all of INFO and up (DEBUG when ``verbose``) to ``RUN_DIR/logs/driver.log``,
    to the terminal from ``TERMINAL_LOG_LEVEL[output]`` up. Returns the handlers (``detach_log_handlers``)."""
    run.logs.mkdir(parents=True, exist_ok=True)
    floor = logging.DEBUG if output == "verbose" else logging.INFO
    to_file = logging.FileHandler(run.logs / "driver.log")
    to_file.setLevel(floor)
    to_terminal = logging.StreamHandler(sys.stderr)
    to_terminal.setLevel(TERMINAL_LOG_LEVEL[output])
    to_terminal.addFilter(lambda record: record.name != progress_log.name)
    root = logging.getLogger()
    for handler in (to_file, to_terminal):
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(floor)
    return [to_file, to_terminal]


def detach_log_handlers(handlers: list[logging.Handler]) -> None:
    root = logging.getLogger()
    for handler in handlers:
        root.removeHandler(handler)
        handler.close()


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (Ray's ``cause``, then ``__cause__``), each once."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in out):
        out.append(current)
        current = getattr(current, "cause", None) or current.__cause__
    return out


def is_actor_fault(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) says an actor's process or node, or an object's owner, is gone: what
    recovery handles. Besides a dead actor (a kill, a crash) that is Ray's memory monitor killing one
    (``OutOfMemoryError``), a crashed worker and a lost node."""
    from ray.exceptions import NodeDiedError, ObjectLostError, OutOfMemoryError, RayActorError, WorkerCrashedError

    faults = (RayActorError, ObjectLostError, OutOfMemoryError, WorkerCrashedError, NodeDiedError)
    return any(isinstance(current, faults) for current in _chain(exc))


def memory_kill_of(exc: BaseException) -> MemoryKill | None:
    """What Ray's memory monitor reported, when ``exc`` (or what it wraps) is one of its kills."""
    for current in _chain(exc):
        found = memory_kill(str(current))
        if found is not None:
            return found
    return None


def wait_for_memory(kill: MemoryKill, bound_s: float, poll_s: float = 1.0) -> str:
    """Wait (at most ``bound_s``) before restarting actors that Ray's memory monitor killed: on this node until its
    use is below 90% of the monitor's threshold (so the restarted actors are not killed again at once); for another
    node, whose memory this process cannot read, a fixed pause of a tenth of the bound. Returns what it did."""
    import psutil

    began = time.monotonic()
    local = {a.address for addresses in psutil.net_if_addrs().values() for a in addresses}
    if kill.threshold_bytes and kill.node_ip in local | {""}:
        target = 0.9 * kill.threshold_bytes
        while True:
            memory = psutil.virtual_memory()
            used = memory.total - memory.available
            if used <= target:
                return f"memory on this node is {used / 2**30:.2f} GiB, below the threshold; restarting after " \
                       f"{time.monotonic() - began:.0f} s"
            if time.monotonic() - began >= bound_s:
                return f"memory on this node is still {used / 2**30:.2f} GiB after {bound_s:.0f} s " \
                       "(run.cluster_wait_s); restarting anyway"
            time.sleep(poll_s)
    pause = min(bound_s / 10, 30.0)
    time.sleep(pause)
    return f"paused {pause:.0f} s for node {kill.node_ip} to free memory; restarting"


class Terminated(BaseException):
    """SIGTERM while the steps run (``ray job stop``, ``kill``, a scheduler's pre-emption). Like Ctrl-C it stops the
    run as ``interrupted``, resumable; without it Ray's driver handler exits with ``SystemExit(15)`` and the run
    would be recorded as failed."""


def stop_on_sigterm() -> Any:
    """Make SIGTERM raise :class:`Terminated` in the main thread; returns the previous handler (``None`` where this
    is not the main thread, which cannot set handlers: SIGTERM then keeps its previous meaning)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    return signal.signal(signal.SIGTERM, raise_terminated)


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


class Recovery:
    """Replaces a system one of whose actors died by a new one restored from the latest complete checkpoint."""

    def __init__(self, config: Config, plan: Any, model_path: str, run: RunDirectory):
        self.config, self.plan, self.model_path, self.run = config, plan, model_path, run
        self.count = 0
        self.known_nodes: set[str] | None = None  # the nodes alive when the last system came up

    def start(self, checkpoint: Path | None, keep_shared_base: bool = False, wait: Any = None) -> tuple[Any, int]:
        """A new system restored from ``checkpoint`` (or fresh, publishing the initial adapters); the step restored.
        If restoring fails, the new system is stopped before the error is raised (``keep_shared_base``: keep
        the learners' shared base, as a recovery does). ``wait``: the bound on waiting for the cluster
        (``actors.cluster_wait.ClusterWait``; default a fresh one of ``run.cluster_wait_s``)."""
        from actors.cluster_wait import ClusterWait, alive_node_ids
        from actors.system import System

        system = System.start(self.config, self.plan, self.model_path,
                              wait or ClusterWait(self.config.run.cluster_wait_s, self.plan, self.known_nodes))
        self.known_nodes = alive_node_ids()
        try:
            if checkpoint is None:
                system.publish_adapters(all_members=True)
                return system, 0
            system.restore(checkpoint)
            return system, checkpoint_step(checkpoint)
        except BaseException:
            system.stop(release_shared_base=not keep_shared_base)
            raise

    def recover(self, system: Any, exc: BaseException, failed_step: int, since: float) -> tuple[Any, int]:
        """Stop ``system`` (one of its actors died with ``exc`` during ``failed_step``), start and restore a new
        one; print a line and append a recovery record. ``since``: when the work now lost began (the last
        checkpoint). Returns the new system and the step restored. Before it starts anything it waits (within
        ``run.cluster_wait_s``) until the live cluster can hold the plan again: a lost node is named at once, and one
        may still join; past the bound, ``ClusterWaitError``."""
        from actors.cluster_wait import ClusterWait

        dead = system.dead_actors()
        system.stop(release_shared_base=False)
        kill = memory_kill_of(exc)
        if kill is not None:
            print(f"[populora] {kill.describe()}", file=sys.stderr, flush=True)
            print(f"[populora] {wait_for_memory(kill, self.config.run.cluster_wait_s)}", file=sys.stderr, flush=True)
        checkpoint, notes = self.run.find_checkpoint()
        for note in notes:
            print(f"[populora] {note}", file=sys.stderr, flush=True)
        self.count += 1  # an attempt counts even when a second fault ends it: run.max_recoveries bounds attempts
        record = {"event": "recovery", "recovery": self.count, "actors": dead or ["unknown"], "error": _one_line(exc),
                  "failed_step": failed_step}
        if kill is not None:
            record["memory_kill"] = kill.describe()
        wait = ClusterWait(self.config.run.cluster_wait_s, self.plan, self.known_nodes, context=f"during step {failed_step}")
        try:
            if wait.short_resources():
                print(f"[populora] the cluster cannot hold the layout now: {wait.reason()}; waiting up to "
                      f"{wait.bound_s:.0f} s (run.cluster_wait_s) for a node to join", file=sys.stderr, flush=True)
                wait.until_fits()
            system, restored = self.start(checkpoint, keep_shared_base=True, wait=wait)
        except BaseException as again:
            self.run.append_event({**record, "restored_step": None, "attempt_error": _one_line(again)})
            print(f"[populora] recovery {self.count} failed: {_one_line(again)}", file=sys.stderr, flush=True)
            raise
        self.run.truncate_metrics(restored)
        record.update({"restored_step": restored, "seconds_lost": round(time.perf_counter() - since, 2)})
        self.run.append_event(record)
        print(f"[populora] recovered ({self.count} of at most {self.config.run.max_recoveries}): "
              f"{', '.join(record['actors'])} died in step {failed_step} ({type(exc).__name__}); "
              f"restored {'step-' + str(restored) if restored else 'the initial state'}, continuing at step "
              f"{restored + 1}; {record['seconds_lost']:.0f} s lost", file=sys.stderr, flush=True)
        return system, restored


def train(config: Config, resume: bool = False, output: str = "default", further_steps: int | None = None) -> int:
    """Run ``config`` (continuing its run directory when ``resume``); returns the exit code.

    A resumed run ends at its planned last step, ``run.steps`` of its saved config, or with ``further_steps`` N
    at N steps past its checkpoint (the saved config then records that new end). One that already reached its
    last step says so and returns 0. A fresh run (not ``resume``) into a directory that holds a run is refused
    (``reporting.run_dir.fresh_run_refusal``, exit 2) before anything is written.

    Attaches to the Ray session of this process when one is running (and leaves it running), else
    connects or starts one (``actors.cluster.connect``) and shuts it down at the end. ``output``: one of
    ``OUTPUT_MODES`` (``launch.py --quiet`` / default / ``--verbose``).
    """
    terminal = Terminal(output)
    try:
        run = RunDirectory(config_run_dir(config))
    except RunDirectoryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    refused = None if resume else fresh_run_refusal(run.root)
    if refused:  # nothing written: a fresh run never mixes its files with an earlier run's
        print(f"error: {refused}", file=sys.stderr)
        return 2
    unusable = check_tracking(config.logging.backends)
    if unusable:  # a missing package or W&B online without a key: before anything is written or started
        print(f"error: {unusable}", file=sys.stderr)
        return 2
    run.root.mkdir(parents=True, exist_ok=True)
    level = logging.getLogger().level
    handlers = attach_log_handlers(run, output)
    try:
        return _train(config, resume, terminal, run, further_steps)
    finally:
        detach_log_handlers(handlers)
        logging.getLogger().setLevel(level)


def _train(config: Config, resume: bool, terminal: Terminal, run: RunDirectory, further_steps: int | None = None) -> int:
    import ray

    from actors.cluster import SharedPathError, check_shared_paths, connect
    from actors.cluster_wait import ClusterWaitError
    from actors.loop import drains_after, run_step
    from planning.placement import plan_placement
    from rollouts import StepPrompts

    start_step = 1
    checkpoint, notes = run.find_checkpoint() if resume else (None, [])
    if resume and checkpoint is None:
        print(f"error: {run.root} has no complete checkpoint to resume from", file=sys.stderr)
        return 2
    if checkpoint is not None:
        start_step = checkpoint_step(checkpoint) + 1
    last_step = start_step - 1 + further_steps if resume and further_steps is not None else config.run.steps
    if resume:
        if start_step > last_step:
            print(f"{run.root} already reached its planned last step {last_step} (run.steps; its latest checkpoint is "
                  f"step {start_step - 1}): nothing to run. --steps N runs N further steps.", flush=True)
            return 0
        terminal.say(f"resuming {run.root} at step {start_step}, ending at step {last_step}: "
                     f"{run.describe_status(run.read_status())}")
        for note in notes:
            print(f"[populora] {note}", file=sys.stderr, flush=True)
    try:  # before the run's files: a model that cannot be used leaves no run behind (a fresh run may retry here)
        model_path = resolve_model(config, progress=not terminal.quiet)
        prompts = StepPrompts.from_config(config, model_path)  # a chat style on a model without a chat template stops here
    except (ValueError, SystemExit) as err:
        print(str(err) if str(err).startswith("error:") else f"error: {err}", file=sys.stderr)
        return 2
    run.create(config.model_copy(update={"run": config.run.model_copy(update={"run_dir": run.root, "steps": last_step})}))
    terminal.say(f"prompts: style {config.tasks.prompt_style}, at most {prompts.budget} prompt tokens "
                 f"(max_seq_len {config.model.max_seq_len} - max_tokens {config.inference.max_tokens})")
    evaluator = None
    if config.eval.every:  # benchmark files are read before any actor starts: a bad file stops here
        from evaluation.datasets import BenchmarkFileError
        from evaluation.training import TrainingEvaluator

        try:
            evaluator = TrainingEvaluator(config, model_path)
        except BenchmarkFileError as err:
            print(f"error: eval: {err}", file=sys.stderr)
            return 2
    plan = plan_placement(config)
    log.debug("model %s; placement needs %s", model_path, plan.totals(verifier_on_workers=False))
    owns_ray = not ray.is_initialized()
    forward = terminal.output == "verbose"
    connection = connect(plan.totals(verifier_on_workers=False)["CPU"], log_dir=None if forward else run.logs,
                         forward_output=forward, dashboard=config.run.dashboard)
    terminal.say(f"connecting: {connection.description}")
    for line in connection.dashboard:
        terminal.say(line)
    if owns_ray:
        terminal.say("actor output: forwarded to this terminal (--verbose)" if forward
                     else f"actor output: {run.logs}/<actor>.log")
    try:  # before any actor starts and before the metrics of a resumed run are cut back to its checkpoint
        checked = check_shared_paths(run.root, model_path, timeout_s=config.run.cluster_wait_s)
    except SharedPathError as err:
        print(f"error: {err}", file=sys.stderr)
        if owns_ray:
            ray.shutdown()
        return 2
    if checked:
        terminal.say(f"run directory and model visible from all {len(checked)} nodes")
    if checkpoint is not None:
        run.truncate_metrics(start_step - 1)
    recovery = Recovery(config, plan, model_path, run)
    try:
        system, _ = recovery.start(checkpoint)
    except ClusterWaitError as exc:  # the actors were closed and their placement groups removed by System.start
        cause = str(exc)
        print(f"error: {cause}; resume with: python launch.py --resume {run.root}", file=sys.stderr)
        run.close()
        run.write_status("failed", start_step - 1, 0, cause)
        if owns_ray:
            ray.shutdown()
        return 1
    terminal.say(f"actors up: {', '.join(a.name for a in plan.actors if a.role != 'verifier')} "
                 f"+ {config.verifier.actors} verifiers; inference backend: {system.backend} ({system.runtime})"
                 + (f"; colocated, engine sleep mode {system.sleep_mode}" if config.resources.colocated else ""))
    if checkpoint is not None:
        terminal.say(f"resumed from {checkpoint}: league state equal to the saved one; continuing at step {start_step}")

    tracked = run.open_tracking(config.logging, config, start_step if checkpoint is not None else None)
    if config.logging.backends != ["tensorboard"]:
        terminal.say(f"tracking: {', '.join(tracked) or 'none'} ({run.root / 'tracking.json'})")
        for line in run.tracking.views() if run.tracking is not None else []:
            terminal.say(line)
    rows: list[dict[str, Any]] = []
    began = since = time.perf_counter()
    step, fault, ahead = start_step, None, None  # ahead: the next step's rollouts, generated while this one trained
    bar = step_bar(last_step - start_step + 1, config.run.name, terminal.quiet)
    state, cause, code = "failed", None, 1
    previous_sigterm = stop_on_sigterm()
    try:
        run.write_status("running", start_step - 1, 0)  # after the handler: a run that says it runs stops cleanly
        while step <= last_step:
            try:
                if fault is not None:
                    system, restored = recovery.recover(system, fault, step, since)
                    fault, since, step, ahead = None, time.perf_counter(), restored + 1, None
                    rows = [r for r in rows if r["step"] <= restored]
                    bar.n = max(0, restored - start_step + 1)
                    bar.refresh()
                row, ahead = run_step(system, step, prompts, ahead, overlap=not drains_after(config, step, last_step),
                                      last_step=last_step)
                if evaluator is not None and evaluator.due(step):  # eval/<benchmark>/<member> in metrics and TensorBoard
                    started = time.perf_counter()
                    row.update(evaluator(system.generate, sorted(system.owners)))
                    row["phase_seconds"]["evaluate"] = round(time.perf_counter() - started, 4)
                run.append_metrics(row)
                progress_log.info(format_step(row, last_step))
                system.publish_metrics(row)
                rows.append(row)
                if not terminal.quiet:
                    bar.write(format_step(row, last_step))
                bar.update(1)
                if step % config.run.checkpoint_every == 0 or step == last_step:
                    started = time.perf_counter()
                    run.save_checkpoint(step, lambda d, s=step: system.checkpoint(d, s), keep=config.run.keep_checkpoints)
                    since = time.perf_counter()
                    run.append_event({"event": "checkpoint", "checkpoint_step": step, "seconds": round(since - started, 4)})
                run.write_status("running", step, recovery.count)
                step += 1
            except Exception as exc:
                if not is_actor_fault(exc):
                    raise
                if recovery.count >= config.run.max_recoveries:
                    cause = (f"an actor died in step {step} ({type(exc).__name__}) after {recovery.count} recoveries "
                             f"(run.max_recoveries={config.run.max_recoveries})")
                    print(f"error: {cause}; resume with: python launch.py --resume {run.root}", file=sys.stderr)
                    return 1
                fault = exc
        state, code = "finished", 0
    except (KeyboardInterrupt, Terminated) as exc:
        terminated = isinstance(exc, Terminated)
        state, cause = "interrupted", "stopped by SIGTERM" if terminated else None
        code = 128 + signal.SIGTERM if terminated else 130
        # after the state: a parent that is gone leaves a closed stderr, and the print then raises
        print(f"\n[populora] {'terminated (SIGTERM)' if terminated else 'interrupted'}; resume with: "
              f"python launch.py --resume {run.root}", file=sys.stderr)
        return code
    except CheckpointWriteError as exc:
        cause = str(exc)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ClusterWaitError as exc:  # a recovery found no room: the last system is stopped, its checkpoint complete
        cause = str(exc)
        print(f"error: {cause}; resume with: python launch.py --resume {run.root}", file=sys.stderr)
        return 1
    except BaseException as exc:
        cause = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if previous_sigterm is not None:  # a second SIGTERM during the clean-up has its old meaning again
            signal.signal(signal.SIGTERM, previous_sigterm)
        bar.close()
        run.close()
        run.write_status(state, (rows[-1]["step"] if rows else start_step - 1), recovery.count, cause)
        system.stop()
        if evaluator is not None:
            evaluator.close()
        if owns_ray:
            ray.shutdown()
    recovered = f" (recovered {recovery.count} time(s))" if recovery.count else ""
    print(summary(rows, run, time.perf_counter() - began) + recovered, flush=True)
    return code
