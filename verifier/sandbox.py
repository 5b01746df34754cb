"""Sandboxed execution of untrusted programs: the ``Verifier`` and its verdicts.

``Verifier.execute(program, args)`` runs ``f(*args)`` twice, each run in its own process forked
from a warm fork server (``verifier.forkserver``), and returns an ``ExecResult``: ``OK`` with the
repr of the value when both runs agree, ``NONDETERMINISTIC`` when their reprs differ, or the status
of the first failure. ``execute_many`` sends a whole batch to the server at once; it runs one child
per worker slot in parallel (one slot per core by default).

Defences (``Verifier.defences()`` says which are active on this machine): Python-level guards
(module allow-list, restricted builtins, an audit hook; ``verifier.guard``), a process per
execution in its own session, rlimits (CPU, address space, file size 0, no new processes, few
descriptors), a wall-clock deadline enforced from outside with ``killpg(SIGKILL)``, an empty
environment, a fresh empty directory (a chroot when root), privileges dropped to a per-slot
unprivileged uid when root, the network cut by a new network namespace where the kernel allows it,
``PR_SET_NO_NEW_PRIVS``, and a fixed hash seed so outputs are the same on every machine.
"""

from __future__ import annotations

import base64
import enum
import itertools
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from verifier import seccomp
from verifier.defences import WeakSandboxError, explain, missing
from verifier.forkserver import BOOTSTRAP, INTERPRETER_FLAGS, OS_LAYERS
from verifier.frames import MAX_PROBE_BYTES
from verifier.guard import ALLOWED_MODULES, BENCHMARK_MODULES
from verifier.outputs import output_problem
from verifier.preflight import Prepared, prepare_args, prepare_program

REPO_ROOT = str(Path(__file__).resolve().parent.parent)
HASH_SEED = "0"
DEFAULT_UID_BASE = 200_000
MAX_OUTPUT_CHARS = 1 << 25  # the fork server keeps at most ~4 bytes per character of one run's frame (evaluation asks for 20M)


class Status(str, enum.Enum):
    """Verdict of one execution. The value is the lower-case name (what the fork server sends)."""

    OK = "ok"
    SYNTAX_ERROR = "syntax_error"
    NO_ENTRY_FUNCTION = "no_entry_function"
    FORBIDDEN = "forbidden"
    BAD_INPUT = "bad_input"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    NONDETERMINISTIC = "nondeterministic"
    OUTPUT_TOO_LARGE = "output_too_large"
    BAD_OUTPUT = "bad_output"  # the value's repr is not a Python literal (ast.literal_eval fails)
    CRASHED = "crashed"


@dataclass(frozen=True)
class ExecResult:
    """``output`` is ``repr(f(*args))`` when ``status`` is OK, else None; ``error`` is a short reason."""

    status: Status
    output: str | None = None
    error: str = ""
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


def combine_runs(runs: Sequence[ExecResult]) -> ExecResult:
    """One verdict from repeated runs of the same call: OK only when every run is OK with the same
    repr; OK runs that disagree are NONDETERMINISTIC; otherwise the first failing run's verdict."""
    wall = max(r.wall_s for r in runs)
    failed = [r for r in runs if not r.ok]
    if failed:
        first = failed[0]
        note = "" if len(failed) == len(runs) else f" (in {len(failed)} of {len(runs)} runs)"
        return ExecResult(first.status, None, first.error + note, wall)
    outputs = {r.output for r in runs}
    if len(outputs) > 1:
        shown = " vs ".join(repr(o[:40]) for o in sorted(outputs))
        return ExecResult(Status.NONDETERMINISTIC, None, f"runs returned different values: {shown}", wall)
    return ExecResult(Status.OK, runs[0].output, "", wall)


def result_of(message: Any, max_output_chars: int) -> ExecResult:
    """The verdict one result line of a fork server stands for, checked again on this side of the
    pipe: a known status, an output (a string no longer than ``max_output_chars``) exactly when the
    status is OK. Anything else is CRASHED with the reason; never raises."""
    if not isinstance(message, dict):
        return ExecResult(Status.CRASHED, None, f"unreadable result from the fork server: {str(message)[:100]}")
    wall = message.get("wall_s", 0.0)
    wall = float(wall) if isinstance(wall, (int, float)) else 0.0
    try:
        status = Status(message.get("status"))
    except ValueError:
        return ExecResult(Status.CRASHED, None, f"unknown status from the fork server: {str(message.get('status'))[:40]!r}", wall)
    error = message.get("error")
    error = error[:1000] if isinstance(error, str) else ""
    if status is not Status.OK:
        return ExecResult(status, None, error, wall)
    output = message.get("output")
    if not isinstance(output, str):
        return ExecResult(Status.CRASHED, None, "an OK result without an output", wall)
    if len(output) > max_output_chars:
        return ExecResult(Status.OUTPUT_TOO_LARGE, None, f"output repr has {len(output)} characters, the bound is {max_output_chars}", wall)
    return ExecResult(Status.OK, output, "", wall)


def probe_report(message: Any) -> dict[str, Any]:
    """The probe run's report (a flat JSON object of at most ``frames.MAX_PROBE_BYTES``), or {}."""
    text = message.get("probe") if isinstance(message, dict) else None
    if not isinstance(text, str) or len(text) > MAX_PROBE_BYTES:
        return {}
    try:
        report = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(report, dict):
        return {}
    return {k: v for k, v in report.items() if isinstance(v, (bool, int, float, str, type(None)))}


_SECCOMP: tuple[str | None, str] | None = None


def seccomp_program() -> tuple[str | None, str]:
    """The seccomp filter as base64 BPF, built once per process (``verifier.seccomp``), and the
    reason when it cannot be built here."""
    global _SECCOMP
    if _SECCOMP is None:
        try:
            _SECCOMP = (base64.b64encode(seccomp.build()).decode("ascii"), "")
        except ImportError as exc:
            _SECCOMP = (None, f"the pyseccomp package is not installed ({exc})")
        except (OSError, ValueError, RuntimeError, AttributeError) as exc:
            _SECCOMP = (None, f"libseccomp could not build the filter: {exc}")
    return _SECCOMP


class ServerDied(RuntimeError):
    """The fork server exited; every execution in flight is reported as CRASHED."""


class _ForkServer:
    """Host side of one fork-server process: sends request lines, a reader thread resolves futures."""

    def __init__(self, workers: int, settings: dict[str, Any], on_result: Callable[["_ForkServer"], None] | None = None,
                 on_retired: Callable[["_ForkServer", list[tuple[dict, Future]]], None] | None = None):
        self.on_result = on_result
        self.on_retired = on_retired
        self.retired = False  # the server said it takes no more requests (its zygote died)
        blob = base64.b64encode(json.dumps({**settings, "workers": workers}).encode()).decode("ascii")
        argv = [sys.executable, *INTERPRETER_FLAGS, "-c", BOOTSTRAP, REPO_ROOT, "serve", blob]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PYTHONHASHSEED": HASH_SEED},
            cwd="/",
            close_fds=True,
            start_new_session=True,
        )
        hello_line = self.proc.stdout.readline()
        try:
            self.hello = json.loads(hello_line)["hello"]
        except (ValueError, KeyError, TypeError):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the verifier fork server failed to start (said {hello_line[:200]!r})") from None
        if not self.hello.get("zygote"):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("the verifier cannot start here: runs are cloned from a zygote that never holds a "
                               f"request, and this machine has none ({self.hello.get('zygote_error') or 'unknown cause'})")
        self.ids = itertools.count()
        self.futures: dict[int, tuple[dict, Future]] = {}  # by request id
        self.lock = threading.Lock()
        self.dead = False
        self.closing = False
        # No thread ever waits on a write to the server while it should be reading the server's results
        # (both pipes full: a deadlock). Requests are written without blocking by whichever thread submits
        # them (one system call, no hand-over); what the pipe does not take then waits here for the writer
        # thread, which alone waits for room, and later requests queue behind it in order.
        self.stdin_fd = self.proc.stdin.fileno()
        os.set_blocking(self.stdin_fd, False)
        self.outgoing: deque[memoryview] = deque()
        self.wake = threading.Condition(self.lock)
        self.reader = threading.Thread(target=self._read, name="verifier-forkserver-reader", daemon=True)
        self.writer = threading.Thread(target=self._write, name="verifier-forkserver-writer", daemon=True)
        self.reader.start()
        self.writer.start()

    def _write(self) -> None:
        """Send what ``submit`` could not, in order, waiting for room; at ``close``, once all is sent
        (or the server is gone), close the server's stdin: its end of file."""
        while True:
            with self.lock:
                while not self.outgoing and not self.closing:
                    self.wake.wait()
                if not self.outgoing:
                    break
                chunk = self.outgoing[0]  # only this thread takes from the queue; ``submit`` appends
            try:
                select.select([], [self.stdin_fd], [], 0.5)
                sent = os.write(self.stdin_fd, chunk)
            except BlockingIOError:
                sent = 0
            except (OSError, ValueError):  # the server is gone; the reader fails what is in flight
                with self.lock:
                    self.dead = True
                    self.outgoing.clear()
                break
            with self.lock:
                if sent == len(chunk):
                    self.outgoing.popleft()
                else:
                    self.outgoing[0] = chunk[sent:]
            if not sent and self.proc.poll() is not None:
                with self.lock:
                    self.dead = True
                    self.outgoing.clear()
                break
        try:
            self.proc.stdin.close()  # EOF: the server kills its children and exits
        except (OSError, ValueError):
            pass

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and "retired" in message:
                self.retired = True
                continue
            with self.lock:
                entry = self.futures.pop(message.get("id"), None) if isinstance(message, dict) else None
            if entry is not None:
                entry[1].set_result(message)
                if self.on_result is not None:
                    self.on_result(self)
        with self.lock:
            self.dead = True
            orphans, self.futures = list(self.futures.values()), {}
        if self.retired and self.on_retired is not None and orphans:
            self.on_retired(self, orphans)  # requests it never ran: they go to a fresh server
            return
        for _, future in orphans:
            future.set_exception(ServerDied("the verifier fork server exited"))
        if self.on_result is not None:
            self.on_result(self)

    def submit(self, requests: list[dict], futures: list[Future] | None = None) -> list[Future]:
        """Send ``requests``; their results resolve ``futures`` (new ones unless given), in order."""
        futures = [Future() for _ in requests] if futures is None else futures
        lines = []
        for request in requests:
            request["id"] = next(self.ids)
            lines.append(json.dumps(request).encode() + b"\n")
        data = b"".join(lines)
        with self.lock:
            if self.dead or self.closing:
                raise ServerDied("the verifier fork server exited")
            for request, future in zip(requests, futures):
                self.futures[request["id"]] = (request, future)
            sent = 0
            if not self.outgoing:
                try:
                    sent = os.write(self.stdin_fd, data)
                except BlockingIOError:
                    pass
                except OSError:  # the server is gone; the reader fails these with the others in flight
                    self.dead = True
                    return futures
            if sent < len(data):
                self.outgoing.append(memoryview(data)[sent:])
                self.wake.notify()
        return futures

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def close(self) -> None:
        with self.lock:
            self.closing = True
            self.wake.notify()
        self.writer.join(timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if threading.current_thread() is not self.reader:
            self.reader.join(timeout=5)
        scratch = str(self.hello.get("scratch", ""))
        if os.path.basename(scratch).startswith("verifier-"):  # left behind when the server was killed
            shutil.rmtree(scratch, ignore_errors=True)


class _ServerPool:
    """``size`` fork servers of one run slot each, fed from one host-side queue.

    One server per parallel run rather than one server with ``size`` slots: a server that forks again
    while earlier children live pays a copy-on-write fault for every page it then writes (~200 per run,
    measured), and its bookkeeping between forks is serial. ``bench/sandbox.py`` on two idle cores:
    365-413 tasks/s with two servers of one slot, 294-307 with one server of two slots.

    A request goes to an idle server, or is queued in a server behind its running request (``DEPTH``
    2: no round trip between runs, ~7% more throughput than 1) only while that run is younger than
    ``QUEUE_BEHIND_S``; so nothing waits behind a slow run while another server could take it.
    """

    DEPTH = 2
    QUEUE_BEHIND_S = 0.1  # typical runs take ~1-2 ms

    def __init__(self, size: int, settings: dict[str, Any]):
        self.settings = settings
        self.lock = threading.Lock()
        self.pending: deque[tuple[dict, Future]] = deque()
        # per server, the start (or, queued, dispatch) times of its outstanding requests, oldest first
        self.in_flight: dict[_ForkServer, deque[float]] = {}
        self.servers: list[_ForkServer] = []
        self.closed = False
        try:
            for _ in range(size):
                self.servers.append(self._start())
        except BaseException:
            self.close()
            raise

    def _start(self) -> _ForkServer:
        server = _ForkServer(1, self.settings, on_result=self._done, on_retired=self._retired)
        self.in_flight[server] = deque()
        return server

    def submit(self, requests: list[dict]) -> list[Future]:
        futures: list[Future] = [Future() for _ in requests]
        with self.lock:
            self.pending.extend(zip(requests, futures))
        self._pump()
        return futures

    def _done(self, server: _ForkServer) -> None:
        with self.lock:
            times = self.in_flight.get(server)
            if times:
                times.popleft()  # one slot: results come back in the order sent
                if times:
                    times[0] = time.monotonic()  # the queued request starts now
        self._pump()

    def _retired(self, server: _ForkServer, orphans: list[tuple[dict, Future]]) -> None:
        """``server`` lost its zygote and exited after its runs in flight: a fresh server (whose
        zygote never held a request) takes its place, and the requests it did not run wait for it."""
        try:
            if self.closed:
                raise RuntimeError("the verifier was closed")
            fresh = self._start()
        except Exception as exc:  # no server can start: those requests fail as if it had died
            for _, future in orphans:
                future.set_exception(ServerDied(f"the verifier fork server retired and none could replace it: {exc}"))
            self._pump()
            return
        with self.lock:
            if server in self.servers:
                self.servers[self.servers.index(server)] = fresh
            else:
                self.servers.append(fresh)
            self.in_flight.pop(server, None)
            self.pending.extendleft(reversed(orphans))
        server.close()
        self._pump()

    def _has_room(self, server: _ForkServer, now: float) -> bool:
        times = self.in_flight[server]
        return not times or (len(times) < self.DEPTH and now - times[0] < self.QUEUE_BEHIND_S)

    def _pump(self) -> None:
        """Hand queued requests to servers with room, least loaded first; with none alive, fail them."""
        sends: dict[_ForkServer, list[tuple[dict, Future]]] = {}
        orphans: list[tuple[dict, Future]] = []
        with self.lock:
            live = [s for s in self.servers if not s.dead]
            now = time.monotonic()
            while self.pending:
                room = [s for s in live if self._has_room(s, now)]
                if not room:
                    break
                server = min(room, key=lambda s: len(self.in_flight[s]))
                self.in_flight[server].append(now)
                sends.setdefault(server, []).append(self.pending.popleft())
            if not live:
                orphans, self.pending = list(self.pending), deque()
        for server, batch in sends.items():
            try:
                server.submit([request for request, _ in batch], [future for _, future in batch])
            except ServerDied:
                orphans.extend(batch)
        for _, future in orphans:
            if not future.done():
                future.set_exception(ServerDied("the verifier fork server exited"))

    def alive(self) -> bool:
        return all(server.alive() for server in self.servers)

    def replace_dead(self) -> None:
        """Start a new server in place of each dead one (its runs were failed with ServerDied)."""
        with self.lock:
            dead = [(i, s) for i, s in enumerate(self.servers) if not s.alive()]
        for i, server in dead:
            server.close()
            fresh = self._start()
            with self.lock:
                self.servers[i] = fresh
                self.in_flight.pop(server, None)
        self._pump()

    def close(self) -> None:
        self.closed = True
        for server in list(self.servers):
            server.close()


class Verifier:
    """Runs untrusted ``f(*args)`` calls in confined, forked processes.

    ``timeout_s``: wall-clock limit of one run (CPU is limited to ``ceil(timeout_s) + 1`` s).
    ``memory_mb``: address space a run may add to the warm interpreter it is forked from.
    ``max_output_chars``: longest accepted output repr (longer is OUTPUT_TOO_LARGE, never truncated).
    ``workers``: parallel runs (default: the CPUs this process may use).
    ``python_guards``: the Python-level layer (static check, restricted builtins, audit hook); off
    only to test that the operating-system layer contains programs on its own.
    ``uid_base``: as root, slot k of a server runs as uid ``uid_base + 64 * b + k``, with the block
    b picked by the server's pid (``nobody`` if the uid cannot be set), so concurrent runs, also of
    different verifiers, cannot signal each other.
    ``require``: defences this machine must provide (``verifier.defences``), else ``WeakSandboxError``
    at construction, naming what is missing and how to enable it. ``allow_weak``: start anyway,
    with a warning on every start (development only).
    ``disable``: operating-system layers to switch off (``OS_LAYERS``: namespaces, landlock,
    seccomp, credentials, process_limits), for tests and benchmarks that measure each layer alone.
    ``extra_modules``: modules of ``guard.BENCHMARK_MODULES`` to allow besides the allow-list (the
    benchmark profile of ``evaluation``; every layer stays on).
    ``server_user``: as root, the uid the fork server becomes once it has imported its modules (it
    then confines runs exactly as an ordinary user would); None keeps the caller's uid.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 10_000,
        workers: int | None = None,
        python_guards: bool = True,
        max_program_chars: int = 100_000,
        uid_base: int = DEFAULT_UID_BASE,
        require: Iterable[str] = (),
        allow_weak: bool = False,
        disable: Iterable[str] = (),
        server_user: int | None = None,
        extra_modules: Iterable[str] = (),
    ):
        if not 0 < float(timeout_s) <= 3600:
            raise ValueError(f"timeout_s must be in (0, 3600], got {timeout_s}")
        if not 16 <= int(memory_mb) <= 1 << 20:
            raise ValueError(f"memory_mb must be in [16, 1048576], got {memory_mb}")
        if not 1 <= int(max_output_chars) <= MAX_OUTPUT_CHARS:
            raise ValueError(f"max_output_chars must be in [1, {MAX_OUTPUT_CHARS}], got {max_output_chars}")
        if workers is not None and int(workers) < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if not 0 < int(uid_base) < 2**31:
            raise ValueError(f"uid_base must be a positive uid, got {uid_base}")
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_chars = int(max_output_chars)
        self.workers = int(workers) if workers else max(1, len(os.sched_getaffinity(0)))
        self.python_guards = bool(python_guards)
        self.max_program_chars = int(max_program_chars)
        self.uid_base = int(uid_base)
        self.require = tuple(require)
        self.allow_weak = bool(allow_weak)
        self.disable = tuple(sorted(set(disable)))
        unknown = [name for name in self.disable if name not in OS_LAYERS]
        if unknown:
            raise ValueError(f"unknown layers to disable {unknown}; known: {list(OS_LAYERS)}")
        self.server_user = None if server_user is None else int(server_user)
        self.extra_modules = tuple(sorted(set(extra_modules)))
        outside = [m for m in self.extra_modules if m not in BENCHMARK_MODULES]
        if outside:
            raise ValueError(f"extra_modules {outside} are not among the benchmark modules {sorted(BENCHMARK_MODULES)}")
        self._allowed = ALLOWED_MODULES | frozenset(self.extra_modules)
        self._lock = threading.Lock()
        self._pool: _ServerPool | None = None
        self._generation = 0  # counts ``close`` calls: runs lost to a close are not retried
        self._probe: dict[str, Any] = {}
        self._pool_for_use()
        self._check_required()

    def _check_required(self) -> None:
        """Refuse to run weaker than ``require`` (or warn, with ``allow_weak``)."""
        report = self.defences()
        absent = missing(report, self.require)
        if self.allow_weak:
            note = f"; missing here: {', '.join(absent)}" if absent else ""
            message = f"verifier: the sandbox requirements are switched off (allow_weak){note}. Development only."
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            print(message, file=sys.stderr)
        elif absent:
            self.close()
            raise WeakSandboxError(explain(absent, report))

    # --- lifecycle ------------------------------------------------------------------------------
    def _pool_for_use(self) -> _ServerPool:
        """The fork servers (one per worker), started on first use; dead ones are replaced."""
        with self._lock:
            if self._pool is None:
                program, self._seccomp_error = seccomp_program() if "seccomp" not in self.disable else (None, "switched off")
                settings = {
                    "uid_base": self.uid_base,
                    "layers": {name: name not in self.disable for name in OS_LAYERS},
                    "seccomp": program,
                    "server_user": self.server_user,
                    "python_guards": self.python_guards,
                    "extra_modules": list(self.extra_modules),
                }
                self._pool = _ServerPool(self.workers, settings)
                probe = self._pool.servers[0].submit([self._request("", "", probe=True)])[0].result()
                self._probe = probe_report(probe)
            elif not self._pool.alive():
                self._pool.replace_dead()
            return self._pool

    def close(self) -> None:
        """Stop the fork servers (and any run in flight). The verifier restarts them if used again."""
        with self._lock:
            self._generation += 1
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its settings (a Ray actor may ship it); the copy starts its own fork server."""
        keys = ("timeout_s", "memory_mb", "max_output_chars", "workers", "python_guards", "max_program_chars", "uid_base",
                "require", "allow_weak", "disable", "server_user", "extra_modules")
        return {k: getattr(self, k) for k in keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    # --- execution ------------------------------------------------------------------------------
    def _request(self, code: str, args: str, probe: bool = False) -> dict[str, Any]:
        request = {
            "code": code,
            "args": args,
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "max_output_chars": self.max_output_chars,
            "guards": self.python_guards,
        }
        if probe:
            request["probe"] = True
        return request

    def _precheck(self, item: Any) -> ExecResult | None:
        """A verdict for malformed calls, so they never reach the server."""
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            return ExecResult(Status.BAD_INPUT, None, f"expected a (program, args) pair, got {type(item).__name__}")
        program, args = item
        if not isinstance(program, str):
            return ExecResult(Status.BAD_INPUT, None, f"program must be str, got {type(program).__name__}")
        if not isinstance(args, str):
            return ExecResult(Status.BAD_INPUT, None, f"args must be str (argument-list text), got {type(args).__name__}")
        if len(program) > self.max_program_chars:
            return ExecResult(Status.BAD_INPUT, None, f"program has {len(program)} characters, the bound is {self.max_program_chars}")
        if len(args) > self.max_program_chars:
            return ExecResult(Status.BAD_INPUT, None, f"args have {len(args)} characters, the bound is {self.max_program_chars}")
        return None

    def execute(self, program: str, args: str, *, repeats: int = 2) -> ExecResult:
        """Run ``f(*args)`` ``repeats`` times (default twice, in separate processes) and return the verdict."""
        return self.execute_many([(program, args)], repeats=repeats)[0]

    def execute_many(self, items: Iterable[tuple[str, str]], *, repeats: int = 2) -> list[ExecResult]:
        """``execute`` for a batch, in the same order; all runs of the batch go to the server at once.

        Each distinct program is compiled and checked once (``verifier.preflight``); a call that
        cannot run (syntax error, forbidden construct, non-literal arguments) gets its verdict
        without a process. An OK output that is not a Python literal becomes BAD_OUTPUT.
        """
        if not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be a positive int, got {repeats!r}")
        items = list(items)
        results, payloads = self._prepare(items)
        todo = list(payloads)
        requests = [self._request(*payloads[i]) for i in todo for _ in range(repeats)]
        runs = self._run(requests) if requests else []
        checked: dict[str, str | None] = {}
        for k, run in enumerate(runs):
            if run.ok:
                if run.output not in checked:
                    checked[run.output] = output_problem(run.output)
                if checked[run.output]:
                    runs[k] = ExecResult(Status.BAD_OUTPUT, None, checked[run.output], run.wall_s)
        for k, i in enumerate(todo):
            results[i] = combine_runs(runs[k * repeats : (k + 1) * repeats])
        return results  # type: ignore[return-value]

    def _prepare(self, items: list[Any]) -> tuple[list[ExecResult | None], dict[int, tuple[str, str]]]:
        """A verdict for each call that cannot run, and the payloads of the others, by index."""
        results: list[ExecResult | None] = [self._precheck(item) for item in items]
        programs: dict[str, Prepared] = {}
        payloads: dict[int, tuple[str, str]] = {}
        for i, item in enumerate(items):
            if results[i] is not None:
                continue
            program, args = item
            if program not in programs:
                programs[program] = prepare_program(program, self.python_guards, self._allowed)
            code = programs[program]
            if code.payload is None:
                results[i] = ExecResult(Status(code.status), None, code.error)
                continue
            values = prepare_args(args)
            if values.payload is None:
                results[i] = ExecResult(Status(values.status), None, values.error)
                continue
            payloads[i] = (code.payload, values.payload)
        return results, payloads

    def _run(self, requests: list[dict]) -> list[ExecResult]:
        """Run ``requests`` on the fork servers: exactly one verdict per request, in order.

        A run lost because its server died (killed from outside, its host going away, or the run
        itself) is retried once, alone, on a fresh server, so an infrastructure failure never
        becomes a program's verdict and a program that kills its server takes no other run with
        it: only a run whose lone retry dies too is CRASHED, with that reason."""
        generation = self._generation
        out, died = self._submit(requests)
        for k in died:
            if self._generation != generation:  # closed meanwhile: no fresh server for a closed verifier
                out[k] = ExecResult(Status.CRASHED, None, "the verifier was closed while this run was in flight")
                continue
            again, died_again = self._submit([requests[k]])
            out[k] = again[0] if not died_again else ExecResult(
                Status.CRASHED, None, "the fork server died while this run was in flight, and again when it ran alone"
            )
        return out

    def _submit(self, requests: list[dict]) -> tuple[list[ExecResult], list[int]]:
        """The verdicts of one submission, and the indices of the runs lost to a server's death."""
        try:
            futures = self._pool_for_use().submit(requests)
        except ServerDied as exc:
            return [ExecResult(Status.CRASHED, None, str(exc))] * len(requests), list(range(len(requests)))
        out: list[ExecResult] = []
        died: list[int] = []
        for k, future in enumerate(futures):
            try:
                out.append(result_of(future.result(), self.max_output_chars))
            except ServerDied as exc:
                out.append(ExecResult(Status.CRASHED, None, str(exc)))
                died.append(k)
        return out, died

    # --- report ---------------------------------------------------------------------------------
    def defences(self) -> dict[str, Any]:
        """Which defences are active on this machine (asked of the running fork server and of a
        probe run, which confines itself like any run and reports what took effect)."""
        hello, probe = self._pool_for_use().servers[0].hello, self._probe
        root = bool(hello.get("root"))
        uid = probe.get("uid")
        ns = hello.get("namespaces") or {}
        isolated = bool(ns.get("isolated"))
        abi = int(hello.get("landlock_abi") or 0)
        landlock_on = bool(probe.get("landlock"))
        # No run can signal a process outside it by any route (kill, its process group, a
        # descriptor's signal owner): seccomp (kill of its own group only, no F_SETOWN/F_SETSIG,
        # no ioctl), Landlock's signal scope (ABI >= 6, which covers a descriptor's owner too), or
        # as root a uid of its own. A PID namespace alone is not enough without root: a run has
        # the zygote's uid there.
        signal_layers = [name for name, on in (
            ("seccomp", bool(probe.get("seccomp"))),
            ("landlock", landlock_on and abi >= 6),
            ("credentials", root and uid not in (None, 0)),
        ) if on]
        report = {
            "process_per_execution": True,
            "fork_server_warm_imports": True,
            "fork_zygote": bool(hello.get("zygote")),
            # on or off; a convenience layer either way (clear FORBIDDEN verdicts for ordinary
            # violations): a program with the whole of Python can disarm it, so no guarantee
            # below rests on it (``guarantees`` names the layers each one does rest on)
            "python_guards": self.python_guards,
            "python_layer": "convenience: a program can disarm it; no guarantee rests on it",
            "module_allow_list": self.python_guards,
            "audit_hook": self.python_guards,
            "rlimits": ["cpu", "address_space", "open_files", "no_core"]
            + (["file_size_0", "no_new_processes"] if probe.get("process_limits") else []),
            "resource_limits": bool(probe.get("process_limits")),
            "wall_clock_kill_process_group": True,
            "new_session": True,
            "empty_environment": True,
            "fresh_empty_directory": True,
            "user_namespace": isolated and bool(ns.get("user_namespace")),
            "mount_namespace": isolated,
            "empty_root": isolated,
            "network_namespace": isolated,
            "pid_namespace": isolated,
            "ipc_namespace": isolated,
            "namespace_error": ns.get("error", ""),
            "landlock": landlock_on,
            "landlock_abi": abi,
            "seccomp": bool(probe.get("seccomp")),
            "seccomp_error": "" if probe.get("seccomp") else (getattr(self, "_seccomp_error", "") or "not loaded"),
            "chroot": bool(probe.get("chroot")),
            "killed_with_fork_server": bool(probe.get("parent_death_signal")),
            "privileges_dropped": root and uid not in (None, 0),
            "sandbox_uid": uid,
            "no_new_privs": bool(hello.get("no_new_privs")),
            "host_files_invisible": isolated or bool(probe.get("chroot")) or landlock_on,
            "no_network": isolated or (landlock_on and abi >= 4),
            "signals_confined": bool(signal_layers),
            # SysV IPC, POSIX message queues, keyrings: no such call with seccomp; without it, a run's own
            "ipc_and_keyrings_confined": bool(probe.get("seccomp")) or (bool(probe.get("own_ipc")) and bool(probe.get("own_keyrings"))),
            "hash_seed": int(HASH_SEED),
            "running_as_root": root,
            "layers_switched_off": list(self.disable),
            "workers": self.workers,
            "result_channel": "one frame per run on a pipe of its own, bounded and checked by the server and the caller",
        }
        report["guarantees"] = {
            "host_files_invisible": [name for name, on in (("namespaces", isolated), ("chroot", report["chroot"]), ("landlock", landlock_on)) if on],
            "no_network": [name for name, on in (("namespaces", isolated), ("landlock", landlock_on and abi >= 4)) if on],
            "signals_confined": signal_layers,
            "ipc_and_keyrings_confined": [name for name, on in (
                ("seccomp", bool(probe.get("seccomp"))),
                ("per_run_namespaces", bool(probe.get("own_ipc")) and bool(probe.get("own_keyrings")))) if on],
            "resource_limits": ["rlimits", "wall_clock_kill"] if report["resource_limits"] else ["wall_clock_kill"],
            "one_verdict_per_run": ["fork_server"],
        }
        return report
