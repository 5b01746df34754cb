"""The fork server: a warm interpreter that forks one confined child per execution.

``verifier.sandbox.Verifier`` starts it as ``python -S -s -B -c BOOTSTRAP <root> confine ...`` with an
environment holding only ``PYTHONHASHSEED=0``, so every execution, on every machine, hashes strings
the same way. Two stages:

1. ``confine``: cut the network (``unshare(CLONE_NEWNET)``, a new empty network namespace; without
   root inside a new user namespace where the kernel allows one) and set ``PR_SET_NO_NEW_PRIVS``
   through ctypes, then ``execv`` a fresh interpreter for stage 2.
2. ``serve``: import every allowed module once, fork a zygote (``_Zygote``), then loop: read
   requests (JSON lines on stdin), have the zygote clone a child per request (the server's own child,
   through ``CLONE_PARENT``; the server forks itself where that is unavailable or the zygote died),
   enforce the wall-clock deadline with ``killpg(SIGKILL)``, reap the child through a pidfd, write
   one JSON result line per request on stdout. It exits on EOF.

A child (``_child``) confines itself before it touches the program: a parent-death signal (no
run outlives the server), new session and process
group, stdin/stdout/stderr on /dev/null and every other descriptor closed except its result pipe,
an empty environment, rlimits (CPU seconds, address space, file size 0, no new processes, few
descriptors, no core), a fresh empty directory as chroot (as root) or working directory, and
privileges dropped to an unprivileged uid of its own (as root). Then it runs the program with the
Python-level guards of ``verifier.guard`` and writes ``status NUL error NUL output`` to the pipe.
"""

from __future__ import annotations

import binascii
import gc
import json
import marshal
import math
import os
import resource
import selectors
import shutil
import signal
import sys
import tempfile
import time
from collections import deque

from verifier import guard

# Bootstrap run by ``python -S -c``: import this module without running ``verifier/__init__``.
# ``-E``/``-I`` would also ignore PYTHONHASHSEED, so the host passes an environment holding nothing else.
INTERPRETER_FLAGS = ("-S", "-s", "-B")
BOOTSTRAP = (
    "import sys, types\n"
    "sys.path[:] = [p for p in sys.path if p]\n"
    "pkg = types.ModuleType('verifier'); pkg.__path__ = [sys.argv[1] + '/verifier']\n"
    "sys.modules['verifier'] = pkg\n"
    "import verifier.forkserver as server\n"
    "server.main(sys.argv[1:])\n"
)
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
NOBODY = 65534
UIDS_PER_SERVER = 64
UID_BLOCKS = 4096
RESULT_FD = 3
CHILD_FDS = 8
BAD_EXIT = 70
PREPARED: tuple[dict, list[str]] = ({}, [])  # guarded builtins and the violations list, set by the server
PR_SET_PDEATHSIG = 1
CHILD_STATUSES = frozenset(
    {"ok", "no_entry_function", "forbidden", "runtime_error", "memory_limit", "output_too_large", "bad_output", "crashed"}
)
PRCTL = None  # libc prctl, set by the server
CLONE_PARENT = 0x00008000
SYS_CLONE = {"x86_64": 56, "aarch64": 220}  # clone(2) by machine; elsewhere the server forks itself


def _confine_and_exec(root: str, uid_base: int, workers: int) -> None:
    """Stage 1: new network namespace and no_new_privs, then exec the serving interpreter."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    netns = libc.unshare(CLONE_NEWNET) == 0
    if not netns and os.getuid() != 0:
        netns = _unprivileged_netns(libc, root)
    nnp = libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    argv = [sys.executable, *INTERPRETER_FLAGS, "-c", BOOTSTRAP, root, "serve", str(uid_base), str(workers), str(int(netns)), str(int(nnp))]
    os.execv(sys.executable, argv)


def _enter_user_and_net_namespace(libc, root: str) -> bool:
    """unshare(CLONE_NEWUSER | CLONE_NEWNET) mapping only our own uid/gid; True when stage 2 can
    still be started from inside (files of unmapped owners may become unreachable)."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False
    try:
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"), ("/proc/self/gid_map", f"{gid} {gid} 1")):
            with open(path, "w") as fh:
                fh.write(text)
    except OSError:
        pass  # the namespaces exist either way; without a map our uid reads as the overflow uid
    return os.access(sys.executable, os.X_OK) and os.access(os.path.join(root, "verifier", "forkserver.py"), os.R_OK)


def _unprivileged_netns(libc, root: str) -> bool:
    """Without root: a new user namespace that owns a new network namespace. Tried first in a
    throwaway child, because entering it cannot be undone. The capabilities the user namespace
    grants are dropped again by the ``execv`` into stage 2 (our uid is not 0 in it)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _enter_user_and_net_namespace(libc, root) else 1)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return _enter_user_and_net_namespace(libc, root)
    return False


def _load_libc() -> tuple:
    """``prctl`` (for ``PR_SET_PDEATHSIG``, so no run outlives the server) and a raw
    ``clone(CLONE_PARENT)`` for the zygote, from libc; each None where unavailable.

    ctypes is dropped from ``sys.modules`` right after: a program cannot import it again (the
    static check and the audit hook refuse, and a chrooted child has no files to load it from).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        clone = None
        number = SYS_CLONE.get(os.uname().machine)
        if number is not None:
            syscall = libc.syscall
            syscall.restype = ctypes.c_long
            syscall.argtypes = [ctypes.c_long] * 6
            get_errno = ctypes.get_errno
            flags = CLONE_PARENT | int(signal.SIGCHLD)

            def clone() -> int:
                """A child of our parent (the server) that shares nothing with us; -errno on failure."""
                pid = syscall(number, flags, 0, 0, 0, 0)
                return pid if pid >= 0 else -get_errno()

    except (ImportError, OSError, AttributeError):
        return None, None
    finally:
        for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
            del sys.modules[name]
    return prctl, clone


def _import_allowed_modules() -> None:
    for name in sorted(guard.ALLOWED_MODULES):
        __import__(name)


def _address_space_in_use() -> int:
    """Current virtual memory size of this process in bytes (from /proc/self/statm)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _set_limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def _confine_child(workdir: str, uid: int, cpu_s: int, address_space: int, server: int) -> dict:
    """Everything the child does to itself before running untrusted code; returns what succeeded."""
    report = {"chroot": False, "uid": os.getuid(), "parent_death_signal": False}
    os.setsid()
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(RESULT_FD + 1, 1 << 20)
    # the environment was emptied and the signal dispositions set once in the server (``main``)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    _set_limit(resource.RLIMIT_AS, address_space)
    _set_limit(resource.RLIMIT_FSIZE, 0)
    _set_limit(resource.RLIMIT_NPROC, 0)
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_NOFILE, CHILD_FDS)
    _set_limit(resource.RLIMIT_MEMLOCK, 0)
    _set_limit(resource.RLIMIT_MSGQUEUE, 0)
    if os.getuid() == 0:
        os.chroot(workdir)
        os.chdir("/")
        report["chroot"] = True
        os.setgroups([])
        for candidate in (uid, NOBODY):
            try:
                os.setresgid(candidate, candidate, candidate)
                os.setresuid(candidate, candidate, candidate)
                break
            except OSError:
                continue
        report["uid"] = os.getuid()
        if os.getuid() == 0:
            raise PermissionError("could not drop root privileges")
    else:
        os.chdir(workdir)
    # armed last: a change of credentials clears the parent-death signal
    if PRCTL is not None and PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
        report["parent_death_signal"] = True
        if os.getppid() != server:  # the server died before the signal was armed (even before we ran)
            os._exit(BAD_EXIT)
    return report


class _Pad:
    """An instance the size of a small user object, for ``_perturb_allocator``."""


def _perturb_allocator() -> None:
    """Shift the heap by an amount that differs from run to run, so that a program whose value depends
    on object addresses (``hash(object())``, iterating a set of instances) gives different results in
    its two runs: forked children otherwise share the server's heap layout.

    The amounts come from the pid (two live runs never share one; two pids give equal amounts only
    when they differ by a multiple of 251 * 241), not from ``random``: reseeding it and drawing cost
    each child ~40 page faults, about 15% of an execution (measured).
    """
    pid = os.getpid()
    _perturb_allocator.pad = [object() for _ in range(pid % 251)] + [_Pad() for _ in range(pid % 241)]


def _run_program(code_b64: str, args_b64: str, max_output_chars: int, guards: bool) -> tuple[str, str | None, str]:
    """Load the compiled program and the literal arguments (prepared by ``verifier.preflight``), run
    ``f(*args, **kwargs)``; returns (status, output repr or None, error)."""
    try:
        code = marshal.loads(binascii.a2b_base64(code_b64))
        positional, keywords = marshal.loads(binascii.a2b_base64(args_b64))
        if type(code) is not type(_run_program.__code__) or not isinstance(positional, list) or not isinstance(keywords, dict):
            raise TypeError("unexpected payload types")
    except Exception as exc:
        return "crashed", None, f"undecodable request: {type(exc).__name__}"
    module = type(sys)("__main__")
    table, violations = PREPARED
    if guards:
        module.__dict__["__builtins__"] = table
    sys.modules["__main__"] = module
    _perturb_allocator()
    if guards:
        guard.install_audit_hook(violations)
    try:
        exec(code, module.__dict__)
        entry = module.__dict__.get("f")
        if not callable(entry):
            return "no_entry_function", None, "the program defines no callable f"
        value = entry(*positional, **keywords)
        output = repr(value)
    except MemoryError:
        return "memory_limit", None, "MemoryError: the program ran out of its memory limit"
    except BaseException as exc:  # SystemExit, KeyboardInterrupt and the like are program errors too
        if violations:
            return "forbidden", None, violations[0]
        return "runtime_error", None, f"{type(exc).__name__}: {exc}"[:300]
    if violations:
        return "forbidden", None, violations[0]
    if not isinstance(output, str):
        return "bad_output", None, "repr() did not return a string"
    if len(output) > max_output_chars:
        return "output_too_large", None, f"output repr has {len(output)} characters, the bound is {max_output_chars}"
    return "ok", output, ""


def _child(request: dict, result_fd: int, workdir: str, uid: int, address_space: int, server: int) -> None:
    """Body of a forked child of ``server`` (its pid); never returns."""
    try:
        os.dup2(result_fd, RESULT_FD)
        cpu_s = int(math.ceil(request["timeout_s"])) + 1
        report = _confine_child(workdir, uid, cpu_s, address_space, server)
        if request.get("probe"):
            data = b"probe\0" + json.dumps(report).encode() + b"\0"
        else:
            status, output, error = _run_program(
                request["code"], request["args"], request["max_output_chars"], request["guards"]
            )
            data = b"\0".join(
                [status.encode(), error.replace("\0", " ").encode("utf-8", "backslashreplace"), (output or "").encode("utf-8", "surrogatepass")]
            )
        view = memoryview(data)
        while view:
            view = view[os.write(RESULT_FD, view) :]
        os._exit(0)
    except BaseException:
        os._exit(BAD_EXIT)


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from a blocking descriptor, or None at end of file."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _zygote_main(requests: int, replies: int, clone, slot_writers: list[int], server: int) -> None:
    """The zygote's loop: read ``size slot payload``, clone a child that runs it, answer its pid."""
    if PRCTL is None or PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != server:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    low = 3  # hold no descriptor of the server's (its stdin and stdout are the host's pipes)
    for fd in sorted({requests, replies, *slot_writers}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
    while True:
        head = _read_exactly(requests, 8)
        payload = _read_exactly(requests, int.from_bytes(head[:4], "little")) if head else None
        if payload is None:  # the server is gone or closed us
            return
        pid = clone()
        if pid == 0:
            request, workdir, uid, address_space = marshal.loads(payload)
            _child(request, slot_writers[int.from_bytes(head[4:], "little")], workdir, uid, address_space, server)
        os.write(replies, pid.to_bytes(8, "little", signed=True))


class _Zygote:
    """A process forked from the warm server that does nothing but clone children for it.

    A process that forks pays a copy-on-write fault for every page it writes while its child lives:
    ~200 per run for the server's own bookkeeping (measured). The zygote writes a few pages between
    clones, and its children are the server's (``clone(CLONE_PARENT)``), so the server still reaps
    them (exit status, rusage), signals them and is the parent their death signal watches.
    Protocol on two pipes: ``size`` and ``slot`` (4 bytes each, little-endian) and a marshalled
    ``(request, workdir, uid, address_space)``; the answer is the pid (or -errno), 8 bytes.
    """

    def __init__(self, clone, slot_writers: list[int]):
        server = os.getpid()
        req_r, self.requests = os.pipe()
        self.replies, rep_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                _zygote_main(req_r, rep_w, clone, slot_writers, server)
            finally:
                os._exit(0)
        os.close(req_r)
        os.close(rep_w)

    def clone(self, slot: int, payload: bytes) -> int | None:
        """The pid of a new child of ours running ``payload``; None (and the zygote closed) on failure."""
        view = memoryview(len(payload).to_bytes(4, "little") + slot.to_bytes(4, "little") + payload)
        try:
            while view:
                view = view[os.write(self.requests, view) :]
            reply = os.read(self.replies, 8)
        except OSError:
            reply = b""
        pid = int.from_bytes(reply, "little", signed=True) if len(reply) == 8 else -1
        if pid <= 0:
            self.close()
            return None
        return pid

    def close(self) -> None:
        if self.pid is None:
            return
        for fd in (self.requests, self.replies):
            os.close(fd)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self.pid = None


class _Running:
    """A child in flight: its pid, pidfd, result pipe, deadline and slot."""

    __slots__ = ("request", "pid", "pidfd", "read_fd", "workdir", "slot", "started", "deadline", "chunks", "size", "killed")

    def __init__(self, request, pid, pidfd, read_fd, workdir, slot, started, deadline):
        self.request, self.pid, self.pidfd, self.read_fd = request, pid, pidfd, read_fd
        self.workdir, self.slot, self.started, self.deadline = workdir, slot, started, deadline
        self.chunks: list[bytes] = []
        self.size = 0
        self.killed = False


class Server:
    """The serving loop (stage 2)."""

    def __init__(self, uid_base: int, workers: int, netns: bool, no_new_privs: bool):
        self.netns, self.no_new_privs = netns, no_new_privs
        # a block of UIDS_PER_SERVER uids per server, picked by pid, so that runs of different
        # servers on one machine (several verifier actors) do not share a uid either
        self.pid = os.getpid()
        self.uid_base = uid_base + (self.pid % UID_BLOCKS) * UIDS_PER_SERVER
        self.root = os.getuid() == 0
        # tmpfs when there is one: a directory per execution costs microseconds there, milliseconds on disk
        scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.base = tempfile.mkdtemp(prefix="verifier-", dir=scratch)
        os.chmod(self.base, 0o711)
        self.selector = selectors.DefaultSelector()
        self.pending: deque[dict] = deque()
        self.running: dict[int, _Running] = {}  # by pidfd
        self.free_slots = list(range(max(1, workers) - 1, -1, -1))
        # one result pipe per slot, reused run after run: the zygote must hold every write end
        # before it is forked. A pipe is empty again once its run's child is reaped and drained.
        self.slot_pipes = [os.pipe() for _ in range(max(1, workers))]
        for read_fd, _ in self.slot_pipes:
            os.set_blocking(read_fd, False)
        self.zygote: _Zygote | None = None
        self.counter = 0
        self.inbuf = b""
        self.outbox: list[bytes] = []
        self.closing = False
        _import_allowed_modules()
        global PREPARED, PRCTL
        PREPARED = guard.prepare()
        PRCTL, self.clone = _load_libc()
        self.baseline_as = _address_space_in_use()

    def send(self, message: dict) -> None:
        """Queue one JSON line; ``flush`` writes the queue once per turn of the loop (one syscall)."""
        self.outbox.append(json.dumps(message).encode() + b"\n")

    def flush(self) -> None:
        if not self.outbox:
            return
        view = memoryview(b"".join(self.outbox))
        self.outbox.clear()
        try:
            while view:
                view = view[os.write(1, view) :]
        except OSError:  # the host is gone: nobody wants the results
            self.stop()

    def stop(self) -> None:
        """Stop reading requests and kill every run in flight."""
        if not self.closing:
            self.closing = True
            self.selector.unregister(0)
        self.pending.clear()
        for run in self.running.values():
            run.killed = True
            self.kill(run)

    # --- children -----------------------------------------------------------------------------
    def spawn(self, request: dict) -> None:
        slot = self.free_slots.pop()
        self.counter += 1
        workdir = os.path.join(self.base, str(self.counter))
        os.mkdir(workdir, 0o555)
        read_fd, write_fd = self.slot_pipes[slot]
        address_space = self.baseline_as + int(request["memory_mb"]) * 1024 * 1024
        uid = self.uid_base + slot % UIDS_PER_SERVER
        started = time.monotonic()
        pid = None
        if self.zygote is not None:
            pid = self.zygote.clone(slot, marshal.dumps((request, workdir, uid, address_space)))
            if pid is None:  # it died or cannot clone here: fork ourselves from now on
                self.zygote = None
        if pid is None:
            pid = os.fork()
            if pid == 0:
                _child(request, write_fd, workdir, uid, address_space, self.pid)
        pidfd = os.pidfd_open(pid)
        run = _Running(request, pid, pidfd, read_fd, workdir, slot, started, started + float(request["timeout_s"]))
        self.running[pidfd] = run
        self.selector.register(pidfd, selectors.EVENT_READ, ("exit", run))
        self.selector.register(read_fd, selectors.EVENT_READ, ("pipe", run))

    def drain(self, run: _Running) -> None:
        """Read what the child wrote so far (kept up to a bound). The slot's pipe never reaches end of
        file (the server holds its write end for later runs); the child's exit ends the run."""
        limit = 12 * int(run.request["max_output_chars"]) + 4096
        while True:
            try:
                chunk = os.read(run.read_fd, 65536)
            except BlockingIOError:
                return
            if run.size < limit:
                run.chunks.append(chunk)
                run.size += len(chunk)

    @staticmethod
    def kill(run: _Running) -> None:
        """SIGKILL the child's process group (and the child, in case it died before ``setsid``)."""
        for target, pid in ((os.killpg, run.pid), (os.kill, run.pid)):
            try:
                target(pid, signal.SIGKILL)
            except OSError:
                pass

    def finish(self, run: _Running) -> None:
        self.kill(run)  # a zombie leader keeps its process-group id reserved, so this hits nothing else
        _, wait_status, usage = os.wait4(run.pid, 0)
        self.selector.unregister(run.read_fd)
        self.drain(run)  # the child is gone: this empties the slot's pipe for the next run
        self.selector.unregister(run.pidfd)
        os.close(run.pidfd)
        del self.running[run.pidfd]
        self.free_slots.append(run.slot)
        try:
            os.rmdir(run.workdir)
        except OSError:
            shutil.rmtree(run.workdir, ignore_errors=True)
        result = self.verdict(run, wait_status, usage.ru_utime + usage.ru_stime)
        result["id"] = run.request.get("id")
        result["wall_s"] = round(time.monotonic() - run.started, 6)
        self.send(result)

    @staticmethod
    def verdict(run: _Running, wait_status: int, cpu_s: float) -> dict:
        """The result of a reaped child; a result it wrote counts only after a clean exit."""
        if run.killed:
            return {"status": "timeout", "output": None, "error": f"wall-clock limit of {float(run.request['timeout_s']):g} s exceeded"}
        if os.WIFSIGNALED(wait_status):
            sig = os.WTERMSIG(wait_status)
            name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
            cpu_limit = int(math.ceil(float(run.request["timeout_s"]))) + 1
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= cpu_limit - 0.05):
                return {"status": "timeout", "output": None, "error": f"CPU time limit of {cpu_limit} s exceeded ({name})"}
            return {"status": "crashed", "output": None, "error": f"killed by {name}"}
        code = os.WEXITSTATUS(wait_status)
        if code != 0:
            return {"status": "crashed", "output": None, "error": f"exited with code {code} and no result"}
        try:  # the frame is status NUL error NUL output
            status, error, output = b"".join(run.chunks).split(b"\0", 2)
            status = status.decode("ascii")
            if status == "probe":
                return {"status": "ok", "output": None, "error": "", "probe": json.loads(error)}
            if status not in CHILD_STATUSES:
                raise ValueError(f"unknown status {status[:20]!r}")
            return {
                "status": status,
                "output": output.decode("utf-8", "surrogatepass") if status == "ok" else None,
                "error": error.decode("utf-8", "replace"),
            }
        except Exception:
            return {"status": "crashed", "output": None, "error": "the execution exited without a valid result"}

    # --- requests -----------------------------------------------------------------------------
    def read_requests(self) -> None:
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:  # the host is gone or closed us: stop every run now
            self.stop()
            return
        *lines, self.inbuf = (self.inbuf + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                self.accept(line)

    def accept(self, line: bytes) -> None:
        request: dict = {}
        try:
            request = json.loads(line)
            for key in ("timeout_s", "memory_mb", "max_output_chars"):
                float(request[key])
            if not request.get("probe") and not (isinstance(request["code"], str) and isinstance(request["args"], str)):
                raise ValueError("code and args must be strings")
        except Exception as exc:
            rid = request.get("id") if isinstance(request, dict) else None
            self.send({"id": rid, "status": "crashed", "output": None, "error": f"malformed request: {exc}"})
            return
        self.pending.append(request)

    def serve(self) -> None:
        os.set_blocking(0, False)
        self.selector.register(0, selectors.EVENT_READ, ("stdin", None))
        gc.freeze()  # keep the collector from touching (and so copying) the server's objects in children
        if self.clone is not None and PRCTL is not None:
            self.zygote = _Zygote(self.clone, [write_fd for _, write_fd in self.slot_pipes])
        hello = {"netns": self.netns, "no_new_privs": self.no_new_privs, "root": self.root, "pid": os.getpid(), "scratch": self.base,
                 "zygote": self.zygote.pid if self.zygote is not None else None}
        self.send({"hello": hello})
        while not (self.closing and not self.running):
            self.flush()
            while self.pending and self.free_slots and not self.closing:
                self.spawn(self.pending.popleft())
            now = time.monotonic()
            wait = min((run.deadline for run in self.running.values() if not run.killed), default=now + 3600.0) - now
            for key, _ in self.selector.select(max(0.0, wait)):
                kind, run = key.data
                if kind == "stdin":
                    self.read_requests()
                elif kind == "pipe" and run.pidfd in self.running:
                    self.drain(run)
                elif kind == "exit" and run.pidfd in self.running:
                    self.finish(run)
            now = time.monotonic()
            for run in list(self.running.values()):
                if now >= run.deadline and not run.killed:
                    run.killed = True
                    self.kill(run)

    def shutdown(self) -> None:
        """Kill and reap every child still running, remove the scratch directories."""
        for run in list(self.running.values()):
            self.kill(run)
            try:
                os.waitpid(run.pid, 0)
            except OSError:
                pass
        if self.zygote is not None:
            self.zygote.close()
        shutil.rmtree(self.base, ignore_errors=True)


def main(argv: list[str]) -> None:
    """Bootstrap entry: ``<root> confine <uid_base> <workers>`` or ``<root> serve <uid_base> <workers> <netns> <nnp>``."""
    root, stage, uid_base, workers = argv[0], argv[1], int(argv[2]), int(argv[3])
    if stage == "confine":
        _confine_and_exec(root, uid_base, workers)
        return
    # Set once here, inherited by every child: PYTHONHASHSEED has been read at startup and nothing
    # else is in the environment; SIGINT is the terminal's (the host ends us by closing stdin);
    # a write past RLIMIT_FSIZE fails with EFBIG instead of killing; SIGPIPE is already ignored.
    os.environ.clear()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    server = Server(uid_base, workers, netns=argv[4] == "1", no_new_privs=argv[5] == "1")
    try:
        server.serve()
        server.flush()
    finally:
        server.shutdown()
