"""The sandbox against hostile programs (each attack really runs), ordinary programs, and the
execution contract. Two layers are tested: the full verifier, and the operating-system layer on
its own (``python_guards=False``), which must contain programs that got past the Python layer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import psutil
import pytest

from verifier import ExecResult, Status, Verifier
from verifier.sandbox import DEFAULT_UID_BASE, combine_runs
from fork_servers import children, in_namespace, real_servers, zygotes
from tcp_listener import tcp_listener

TIMEOUT_S = 1.5
IDENTITY = "def f(a):\n    return a"
IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def verifier():
    v = Verifier(timeout_s=TIMEOUT_S, memory_mb=256, workers=2)
    yield v
    v.close()


@pytest.fixture(scope="module")
def os_layer():
    """A verifier with only the operating-system layer: programs may import os, signal, resource..."""
    v = Verifier(timeout_s=TIMEOUT_S, memory_mb=256, workers=2, python_guards=False)
    yield v
    v.close()


def assert_serving(v: Verifier) -> None:
    r = v.execute(IDENTITY, "'still here'")
    assert r.status is Status.OK and r.output == "'still here'", r


def run(v: Verifier, program: str, args: str = "0") -> ExecResult:
    result = v.execute(program, args)
    assert_serving(v)
    return result


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A file outside the sandbox that must survive every attack."""
    path = tmp_path / "canary.txt"
    path.write_text("precious")
    path.chmod(0o666)
    tmp_path.chmod(0o777)
    return path


@pytest.fixture
def listener():
    """A real TCP listener of the test on 127.0.0.1; ``received`` collects whatever reaches it."""
    with tcp_listener() as port_and_received:
        yield port_and_received


# --- ordinary programs ------------------------------------------------------------------------

ORDINARY = [
    ("def f(a):\n    return a", "'Hello world'"),
    ("def f(xs, k):\n    return sorted(xs, reverse=True)[:k]", "[3, 1, 2, 5], 2"),
    ("def f(n):\n    if n < 2:\n        return n\n    return f(n - 1) + f(n - 2)", "15"),
    ("def f(s):\n    def helper(t):\n        return t[::-1]\n    def inner(u):\n        return helper(u).upper()\n    return inner(s)", "'abc'"),
    ("class Node:\n    def __init__(self, v, nxt=None):\n        self.v = v\n        self.nxt = nxt\n\n"
     "def f(xs):\n    head = None\n    for x in xs:\n        head = Node(x, head)\n    out = []\n    while head:\n"
     "        out.append(head.v)\n        head = head.nxt\n    return out", "[1, 2, 3]"),
    ("from dataclasses import dataclass, field\nfrom typing import List\n\n@dataclass\nclass Bag:\n    items: List[int] = field(default_factory=list)\n\n"
     "    def total(self) -> int:\n        return sum(self.items)\n\ndef f(xs):\n    b = Bag(list(xs))\n    return (b.total(), repr(b))", "(1, 2, 3)"),
    ("from collections import Counter, defaultdict, deque, namedtuple, OrderedDict\nP = namedtuple('P', 'x y')\n\n"
     "def f(s):\n    c = Counter(s)\n    d = defaultdict(list)\n    for i, ch in enumerate(s):\n        d[ch].append(i)\n"
     "    q = deque(s, maxlen=3)\n    return (c.most_common(2), dict(d), list(q), P(1, 2)._asdict() == OrderedDict(x=1, y=2))", "'banana'"),
    ("import itertools, functools, operator\n\ndef f(xs):\n    return (list(itertools.accumulate(xs, operator.mul)), functools.reduce(operator.add, xs),"
     " list(itertools.permutations(xs[:3], 2))[:4])", "[1, 2, 3, 4]"),
    ("import heapq, bisect\n\ndef f(xs):\n    h = list(xs)\n    heapq.heapify(h)\n    smallest = [heapq.heappop(h) for _ in range(3)]\n"
     "    s = sorted(xs)\n    return smallest, bisect.bisect_left(s, 5), heapq.nlargest(2, xs)", "[9, 4, 7, 1, 5, 3]"),
    ("import re, string\n\ndef f(text):\n    words = re.findall(r'[a-z]+', text.lower())\n    table = str.maketrans(string.ascii_lowercase, string.ascii_lowercase[::-1])\n"
     "    return [w.translate(table) for w in words], re.sub(r'\\d', '#', text)", "'Hi there 42'"),
    ("import math, statistics\nfrom fractions import Fraction\nfrom decimal import Decimal\n\ndef f(xs):\n"
     "    return (math.gcd(*xs), statistics.median(xs), str(Fraction(xs[0], xs[1])), str(Decimal('0.1') * 3), round(math.pi, 5))", "[12, 18, 30]"),
    ("import enum, copy\n\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n\ndef f(grid):\n    g = copy.deepcopy(grid)\n    g[0][0] = Color.GREEN.value\n"
     "    return grid, g, [c.name for c in Color]", "[[0, 1], [2, 3]]"),
    ("from functools import lru_cache\n\ndef f(n):\n    @lru_cache(maxsize=None)\n    def ways(k):\n        return 1 if k <= 1 else ways(k - 1) + ways(k - 2)\n    return ways(n)", "80"),
    ("def f(a, b=10, *, scale=2):\n    return {'sum': (a + b) * scale, 'pair': (a, b), 'none': None, 'neg': -1.5, 'set': {3, 1, 2}}", "1, scale=3"),
    ("class Matrix:\n    def __init__(self, rows):\n        self.rows = rows\n    def __matmul__(self, other):\n"
     "        cols = list(zip(*other.rows))\n        return Matrix([[sum(a * b for a, b in zip(r, c)) for c in cols] for r in self.rows])\n\n"
     "def f(a, b):\n    return (Matrix(a) @ Matrix(b)).rows", "[[1, 2], [3, 4]], [[5, 6], [7, 8]]"),
    ("def f(s):\n    try:\n        return int(s)\n    except ValueError as exc:\n        return 'bad: ' + str(exc)[:20]", "'x1'"),
    ("def f(n):\n    gen = (i * i for i in range(n) if i % 2)\n    return sum(gen), [x for x in range(n) if x % 3 == 0], {i: chr(97 + i) for i in range(3)}", "10"),
    ("from typing import Dict, List, Optional, Tuple\n\ndef f(pairs: List[Tuple[str, int]]) -> Dict[str, Optional[int]]:\n"
     "    out: Dict[str, Optional[int]] = {}\n    for k, v in pairs:\n        out[k] = v if v > 0 else None\n    return out", "[('a', 1), ('b', -2)]"),
]


def expected_repr(program: str, args: str) -> str:
    """The value computed directly in this (trusted) process."""
    module = types.ModuleType("verifier_expected")
    sys.modules[module.__name__] = module  # dataclasses looks its class's module up
    try:
        exec(compile(program, "<expected>", "exec", dont_inherit=True), module.__dict__)
        return repr(eval(f"f({args})", module.__dict__))
    finally:
        del sys.modules[module.__name__]


def test_ordinary_programs_give_the_exact_repr(verifier):
    results = verifier.execute_many(ORDINARY)
    for (program, args), result in zip(ORDINARY, results):
        assert result.status is Status.OK, (program, result)
        assert result.output == expected_repr(program, args)


def test_string_sets_use_the_fixed_hash_seed_on_every_verifier(verifier):
    program = "def f(words):\n    return {w.upper() for w in words}"
    args = "['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']"
    first = verifier.execute(program, args)
    with Verifier(timeout_s=TIMEOUT_S, workers=1) as other:
        second = other.execute(program, args)
    reference = subprocess.run(
        [sys.executable, "-c", f"{program}\nprint(repr(f({args})))"],
        env={"PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert first.output == second.output == reference


def test_execute_many_keeps_order_and_mixes_verdicts(verifier):
    items = [(IDENTITY, str(i)) for i in range(30)] + [("def f(:", "1"), (IDENTITY, "x"), ("g = 1", "1"), (5, "1")]
    results = verifier.execute_many(items)
    assert [r.output for r in results[:30]] == [str(i) for i in range(30)]
    assert [r.status for r in results[30:]] == [Status.SYNTAX_ERROR, Status.BAD_INPUT, Status.NO_ENTRY_FUNCTION, Status.BAD_INPUT]
    assert "program must be str" in results[-1].error


def test_runtime_errors_and_outputs(verifier):
    assert verifier.execute("def f(a):\n    return 1 // a", "0").status is Status.RUNTIME_ERROR
    r = verifier.execute("def f(a):\n    raise StopIteration('quirk')", "0")
    assert r.status is Status.RUNTIME_ERROR and "StopIteration" in r.error  # AZR accepted this as valid
    r = verifier.execute("def f(a):\n    raise SystemExit(0)", "0")
    assert r.status is Status.RUNTIME_ERROR and "SystemExit" in r.error
    r = verifier.execute("def f(a):\n    return {frozenset({1})}", "0")
    assert r.status is Status.BAD_OUTPUT and "literal" in r.error
    assert verifier.execute("def f(a):\n    return float('nan')", "0").status is Status.BAD_OUTPUT


def test_output_bound_is_enforced_never_truncated():
    with Verifier(timeout_s=TIMEOUT_S, max_output_chars=20, workers=1) as v:
        assert v.execute("def f(n):\n    return 'x' * n", "18").output == "'" + "x" * 18 + "'"
        r = v.execute("def f(n):\n    return 'x' * n", "19")
        assert r.status is Status.OUTPUT_TOO_LARGE and r.output is None and "21 characters" in r.error


def test_nondeterministic_programs_are_caught(verifier):
    # state the fork server's modules hold (statistics imports random) differs in the two processes
    r = verifier.execute("import statistics\ndef f(a):\n    return statistics.random.random()", "0")
    assert r.status is Status.NONDETERMINISTIC
    # values that depend on object addresses: the heap is shifted by a random amount in every run
    address = "class N:\n    pass\ndef f(n):\n    return [hash(N()) % 9973 for _ in range(n)]"
    assert any(verifier.execute(address, "5").status is Status.NONDETERMINISTIC for _ in range(3))


def test_combine_runs():
    ok = ExecResult(Status.OK, "1", "", 0.1)
    assert combine_runs([ok, ok]) == ok
    assert combine_runs([ok, ExecResult(Status.OK, "2")]).status is Status.NONDETERMINISTIC
    mixed = combine_runs([ok, ExecResult(Status.TIMEOUT, None, "slow", 2.0)])
    assert mixed.status is Status.TIMEOUT and "1 of 2 runs" in mixed.error and mixed.wall_s == 2.0


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="timeout_s"):
        Verifier(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Verifier(memory_mb=1)
    with pytest.raises(ValueError, match="repeats"):
        Verifier(workers=1).execute(IDENTITY, "1", repeats=0)


# --- hostile programs, full verifier ----------------------------------------------------------


def test_infinite_loop_times_out(verifier):
    start = time.monotonic()
    r = run(verifier, "def f(a):\n    while True:\n        a += 1")
    assert r.status is Status.TIMEOUT and TIMEOUT_S <= r.wall_s < TIMEOUT_S + 1.5
    assert time.monotonic() - start < 2 * TIMEOUT_S + 3  # both runs in parallel


@pytest.mark.parametrize(
    "program",
    [
        "def f(a):\n    return len([0] * 10 ** 9)",
        "def f(a):\n    s = 'x'\n    while True:\n        s += s",
        "def f(a):\n    return len(bytearray(2 ** 40))",
    ],
)
def test_memory_bombs_hit_the_memory_limit(program):
    with Verifier(timeout_s=10.0, memory_mb=128, workers=2) as v:  # generous time: filling memory takes a while on a busy machine
        assert run(v, program).status is Status.MEMORY_LIMIT


@pytest.mark.parametrize(
    "program",
    [
        "import os\ndef f(a):\n    return os.fork()",
        "import subprocess\ndef f(a):\n    return subprocess.run(['id']).returncode",
        "import ctypes\ndef f(a):\n    return ctypes.string_at(0)",
        "import socket\ndef f(a):\n    return socket.socket()",
        "import time\ndef f(a):\n    return time.time()",
        "import random\ndef f(a):\n    return random.random()",
        "import sys\ndef f(a):\n    sys.exit(3)",
        "import signal\ndef f(a):\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)",
        "import resource\ndef f(a):\n    resource.setrlimit(resource.RLIMIT_CPU, (-1, -1))",
        "from os import system\ndef f(a):\n    return system('id')",
        "def f(a):\n    return open('/etc/passwd').read()",
        "def f(a):\n    return eval('1 + 1')",
        "def f(a):\n    return __import__('os').getpid()",
        "def f(a):\n    exit(0)",
        "def f(a):\n    return ().__class__.__base__.__subclasses__()",
        "def f(a):\n    return [c for c in object.__subclasses__()]",
        "def f(a):\n    return (x for x in ()).gi_frame.f_back.f_globals",
        "def f(a):\n    return getattr(object, '__subcla' + 'sses__')()",
        "import operator\ndef f(a):\n    return operator.attrgetter('__class__.__base__')(())",
    ],
)
def test_forbidden_constructs(verifier, program):
    r = run(verifier, program)
    assert r.status is Status.FORBIDDEN, r
    assert r.error


ESCAPE_TO_OS = (
    # allowed modules hold references to os; the audit hook blocks what os would do
    "import dataclasses\ndef f(a):\n    os = dataclasses.inspect.os\n    return {op}"
)


@pytest.mark.parametrize(
    "operation, effect",
    [
        ("os.remove({canary!r})", "deletes the canary"),
        ("os.write(os.open({canary!r}, os.O_WRONLY | os.O_TRUNC), b'pwned')", "overwrites the canary"),
        ("os.listdir('/')", "lists files"),
        ("os.system('touch {canary}.new')", "runs a shell"),
        ("os.kill(os.getppid(), 9)", "kills the fork server"),
        ("os.killpg(0, 9)", "kills its process group"),
        ("os.fork()", "forks"),
        ("os.execv('/bin/sh', ['sh'])", "replaces itself"),
    ],
)
def test_escapes_through_module_attributes_are_blocked(verifier, canary, operation, effect):
    program = ESCAPE_TO_OS.format(op=operation.format(canary=str(canary)))
    r = run(verifier, program)
    assert r.status is Status.FORBIDDEN and "blocked operation" in r.error, (effect, r)
    assert canary.read_text() == "precious" and not Path(f"{canary}.new").exists()


def test_format_string_escape_reaches_os_system_and_is_blocked(verifier, canary):
    # string.Formatter.get_field does attribute lookups from a string, past the static check
    program = (
        "import string\n"
        "def f(a):\n"
        "    get = string.Formatter().get_field\n"
        "    subclasses = get('0.__class__.__base__.__subclasses__', [()], {})[0]()\n"
        "    wrap = [c for c in subclasses if c.__name__ == '_wrap_close'][0]\n"
        "    system = get('0.__init__.__globals__[system]', [wrap], {})[0]\n"
        f"    return system('rm {canary}')\n"
    )
    r = run(verifier, program)
    assert r.status is Status.FORBIDDEN and "os.system" in r.error
    assert canary.read_text() == "precious"


def test_swallowed_violation_is_still_forbidden(verifier, canary):
    program = ESCAPE_TO_OS.replace("return {op}", "try:\n        os.remove({op!r})\n    except Exception:\n        pass\n    return 1")
    r = run(verifier, program.format(op=str(canary)))
    assert r.status is Status.FORBIDDEN and canary.exists()


def test_network_connections_never_reach_the_listener(verifier, os_layer, listener):
    port, received = listener
    attacks = [
        f"import socket\ndef f(a):\n    s = socket.create_connection(('127.0.0.1', {port}))\n    s.sendall(b'leak')",
        "import dataclasses\ndef f(a):\n    os = dataclasses.inspect.os\n"
        f"    return os.system('python3 -c \"import socket; socket.create_connection((\\'127.0.0.1\\', {port})).sendall(b\\'leak\\')\"')",
    ]
    for program in attacks:
        assert run(verifier, program).status is Status.FORBIDDEN
        run(os_layer, program)  # no socket module in the chroot, no shell, no new process, no network
    time.sleep(0.3)
    assert received == []


def test_stdout_flood_goes_nowhere(verifier, os_layer, capfd):
    assert run(verifier, "def f(a):\n    for _ in range(20000):\n        print('x' * 1000)\n    return 7").output == "7"
    # without the Python layer a run reaches the real streams, but its 0-2 are closed (its own, not a
    # description shared with other runs): the writes fail in that run alone
    flood = "import sys\ndef f(a):\n    for _ in range(20000):\n        sys.stdout.write('y' * 1000)\n        sys.stderr.write('z' * 1000)\n    return 8"
    result = run(os_layer, flood)
    assert result.status is Status.RUNTIME_ERROR and "Bad file descriptor" in result.error
    assert run(os_layer, "def f(a):\n    return 8").output == "8"
    out, err = capfd.readouterr()
    assert "xxxx" not in out + err and "yyyy" not in out + err and "zzzz" not in out + err


def test_huge_outputs_are_refused(verifier):
    assert run(verifier, "def f(a):\n    return list(range(10 ** 6))").status is Status.OUTPUT_TOO_LARGE
    assert run(verifier, "def f(a):\n    return 'x' * 10 ** 7").status is Status.OUTPUT_TOO_LARGE


def test_runaway_recursion_is_a_runtime_error(verifier):
    r = run(verifier, "def f(a):\n    return f(a + 1)")
    assert r.status is Status.RUNTIME_ERROR and "RecursionError" in r.error


# --- the operating-system layer on its own ----------------------------------------------------


def test_defences_report(verifier):
    d = verifier.defences()
    for key in ("process_per_execution", "wall_clock_kill_process_group", "empty_environment", "new_session", "module_allow_list", "audit_hook"):
        assert d[key] is True
    assert d["hash_seed"] == 0 and d["workers"] == 2
    if IS_ROOT:
        assert d["chroot"] and d["privileges_dropped"] and d["sandbox_uid"] >= DEFAULT_UID_BASE
        assert d["network_namespace"]


@pytest.mark.skipif(not IS_ROOT, reason="the network namespace of the server is inspected through /proc as root")
def test_fork_server_lives_in_another_network_namespace(verifier):
    for server in verifier._pool_for_use().servers:
        assert os.readlink(f"/proc/{server.proc.pid}/ns/net") != os.readlink("/proc/self/ns/net")


def test_os_layer_children_run_confined(os_layer):
    program = (
        "import os, resource\n"
        "def f(a):\n"
        "    try:\n"
        "        listing = os.listdir('.')\n"
        "    except PermissionError:\n"
        "        listing = []  # Landlock refuses even to list the empty directory\n"
        "    return (os.getuid(), os.getcwd(), listing, dict(os.environ), os.getsid(0) == os.getpid(),"
        " resource.getrlimit(resource.RLIMIT_FSIZE), resource.getrlimit(resource.RLIMIT_NPROC))"
    )
    r = os_layer.execute(program, "0", repeats=1)  # the uid differs between worker slots
    assert r.status is Status.OK, r
    uid, cwd, listing, env, own_session, fsize, nproc = eval(r.output)  # our own literal output
    assert listing == [] and env == {} and own_session and fsize == (0, 0) and nproc == (0, 0)
    if IS_ROOT:
        assert uid >= DEFAULT_UID_BASE and cwd == "/"


def test_os_layer_keeps_environment_secrets(monkeypatch):
    monkeypatch.setenv("VERIFIER_TEST_SECRET", "s3cret-value")
    with Verifier(timeout_s=TIMEOUT_S, workers=1, python_guards=False) as v:
        r = v.execute("import os\ndef f(a):\n    return sorted(os.environ.items())", "0")
    assert r.output == "[]"
    with Verifier(timeout_s=TIMEOUT_S, workers=1) as v:
        r = v.execute("import dataclasses\ndef f(a):\n    return dict(dataclasses.inspect.os.environ)", "0")
    assert r.output == "{}"


def test_os_layer_contains_files(os_layer, canary):
    attacks = [
        f"import os\ndef f(a):\n    os.remove({str(canary)!r})",
        f"def f(a):\n    open({str(canary)!r}, 'w').write('pwned')",
        f"def f(a):\n    return open({str(canary)!r}).read()",
        "def f(a):\n    return open('/etc/passwd').read()",
        "def f(a):\n    open('escape.txt', 'w').write('x')",
        "import os\ndef f(a):\n    os.mkdir('sub')",
    ]
    for program in attacks:
        r = run(os_layer, program)
        assert r.status is Status.RUNTIME_ERROR and ("Error" in r.error), (program, r)
    assert canary.read_text() == "precious"


def test_os_layer_contains_processes_and_signals(os_layer, canary):
    server_pids = [server.hello["server_pid"] for server in os_layer._pool_for_use().servers]
    checks = [
        ("import os\ndef f(a):\n    return os.fork()", {Status.RUNTIME_ERROR}),
        (f"import os\ndef f(a):\n    return os.system('touch {canary}.new')", {Status.OK}),  # fork fails: -1
        ("import os\ndef f(a):\n    os.kill(os.getppid(), 9)", {Status.RUNTIME_ERROR} if IS_ROOT else {Status.RUNTIME_ERROR, Status.CRASHED}),
        ("import os\ndef f(a):\n    os.killpg(0, 9)", {Status.CRASHED}),
        ("import os\ndef f(a):\n    os._exit(0)", {Status.CRASHED}),
        ("import os\ndef f(a):\n    os._exit(3)", {Status.CRASHED}),
        ("import faulthandler\ndef f(a):\n    faulthandler._sigsegv()", {Status.CRASHED}),
        ("import ctypes\ndef f(a):\n    return ctypes.string_at(0)", {Status.RUNTIME_ERROR, Status.CRASHED}),
    ]
    for program, allowed in checks:
        r = os_layer.execute(program, "0")
        assert r.status in allowed, (program, r)
        assert_serving(os_layer)
    if IS_ROOT:  # signal every process the sandbox uid may signal: there is none but itself (seccomp refuses the call)
        r = run(os_layer, "import os\ndef f(a):\n    os.kill(-1, 9)\n    return 'alive'")
        assert r.output == "'alive'" or (r.status is Status.RUNTIME_ERROR and "Operation not permitted" in r.error), r
    assert not Path(f"{canary}.new").exists()
    if IS_ROOT:  # the fork server (root) was out of reach of every child
        assert [server.hello["server_pid"] for server in os_layer._pool_for_use().servers] == server_pids
        assert all(psutil.pid_exists(pid) for pid in server_pids)


def test_os_layer_segfault_is_crashed(os_layer):
    r = run(os_layer, "import faulthandler\ndef f(a):\n    faulthandler._sigsegv()")
    assert r.status is Status.CRASHED and "SIGSEGV" in r.error


def test_os_layer_ignoring_signals_or_raising_limits_still_times_out(os_layer):
    ignore = (
        "import signal\ndef f(a):\n    for s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGALRM, signal.SIGINT):\n"
        "        signal.signal(s, signal.SIG_IGN)\n    while True:\n        pass"
    )
    assert run(os_layer, ignore).status is Status.TIMEOUT
    raise_limits = (
        "import resource\ndef f(a):\n    for lim in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC):\n"
        "        try:\n            resource.setrlimit(lim, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        except (ValueError, OSError):\n            pass\n"
        "    return [resource.getrlimit(l)[1] == resource.RLIM_INFINITY for l in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC)]"
    )
    assert run(os_layer, raise_limits).output == "[False, False, False]"


def test_os_layer_memory_bomb(os_layer):
    assert run(os_layer, "def f(a):\n    return len(bytearray(2 ** 34))").status is Status.MEMORY_LIMIT
    assert run(os_layer, "def f(a):\n    return len(bytearray(300 * 2 ** 20))").status is Status.MEMORY_LIMIT  # over 256 MB
    assert run(os_layer, "def f(a):\n    return len(bytearray(100 * 2 ** 20))").output == str(100 * 2**20)


# --- the verifier keeps serving ---------------------------------------------------------------


def test_concurrent_callers(verifier):
    """Eight threads at once, each with programs of its own to compile (CPython 3.11's parser is not safe for
    threads parsing at once: the verifier serialises its own parsing)."""
    results: dict[int, list[ExecResult]] = {}

    def call(k: int) -> None:
        results[k] = verifier.execute_many([(f"def f(a):\n    return [a * 3, {k}, {i}][0]", str(k * 100 + i))
                                            for i in range(10)])

    threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(8):
        assert [r.output for r in results[k]] == [str(3 * (k * 100 + i)) for i in range(10)]


def test_a_slow_run_holds_up_only_its_own_fork_server():
    """Runs are queued host-side and handed to the least loaded server: while one worker's run loops
    until its timeout, the other worker serves a whole batch of quick calls."""
    with Verifier(timeout_s=3.0, workers=2) as v:
        slow: list[ExecResult] = []
        looping = threading.Thread(target=lambda: slow.append(v.execute("def f(a):\n    while True:\n        pass", "0", repeats=1)))
        looping.start()
        time.sleep(0.3)
        start = time.monotonic()
        quick = v.execute_many([("def f(a):\n    return a + 1", str(i)) for i in range(20)])
        elapsed = time.monotonic() - start
        assert [r.output for r in quick] == [str(i + 1) for i in range(20)]
        assert elapsed < 2.5, elapsed  # not queued behind the 3 s loop
        looping.join(timeout=20)
        assert slow and slow[0].status is Status.TIMEOUT


def test_a_dead_fork_server_is_replaced_and_its_runs_retried():
    """A server killed from outside costs no verdict: its runs are retried, each alone, on a fresh server
    (here the program's true verdict is TIMEOUT); only a run whose lone retry dies too is CRASHED."""
    with Verifier(timeout_s=2.0, workers=1) as v:
        first = v._pool_for_use().servers[0]
        results: list[ExecResult] = []
        pending = threading.Thread(target=lambda: results.append(v.execute("def f(a):\n    while True:\n        pass", "0")))
        pending.start()
        time.sleep(0.5)
        os.kill(first.proc.pid, signal.SIGKILL)
        pending.join(timeout=20)
        assert results and results[0].status is Status.TIMEOUT, results
        assert_serving(v)
        assert v._pool_for_use().servers[0] is not first

        results.clear()
        pending = threading.Thread(target=lambda: results.append(v.execute("def f(a):\n    while True:\n        pass", "0")))
        pending.start()
        for _ in range(2):  # kill the server, then the one that replaced it
            time.sleep(0.5)
            server = v._pool.servers[0]
            os.kill(server.proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while v._pool.servers[0] is server and time.monotonic() < deadline:
                time.sleep(0.05)
        pending.join(timeout=20)
        assert results and results[0].status is Status.CRASHED and "again when it ran alone" in results[0].error
        assert_serving(v)
    if first.hello["scratch"]:  # a server without namespaces keeps its run directories on the host's tmpfs
        assert not os.path.exists(first.hello["scratch"])  # the dead server's scratch directory is removed


def test_no_leftover_processes():
    v = Verifier(timeout_s=5.0, workers=2)
    servers = real_servers(v)
    handles = [psutil.Process(server.proc.pid) for server in v._pool_for_use().servers]  # the keepers, when isolated
    helpers = zygotes(v)
    slow = threading.Thread(target=v.execute, args=("def f(a):\n    while True:\n        pass", "0"))
    slow.start()
    deadline = time.monotonic() + 5
    while len(children(servers, helpers)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    runs = children(servers, helpers)
    assert len(runs) == 2  # the two runs of the looping call, one per server
    if IS_ROOT:  # once a run has confined itself it is an unprivileged uid of the server's block
        while any(p.uids().real == 0 for p in runs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {p.uids().real for p in runs} <= set(range(DEFAULT_UID_BASE, DEFAULT_UID_BASE + 4096 * 64))
    v.close()  # kills the runs in flight and the server
    slow.join(timeout=10)
    gone, alive = psutil.wait_procs(runs + list({*servers, *handles}) + helpers, timeout=5)
    assert alive == []


def test_runs_die_with_a_killed_fork_server():
    v = Verifier(timeout_s=30.0, workers=2)
    servers = real_servers(v)
    handles = [psutil.Process(server.proc.pid) for server in v._pool_for_use().servers]  # the keepers, when isolated
    helpers = zygotes(v)
    threads = [threading.Thread(target=v.execute, args=("def f(a):\n    while True:\n        pass", "0")) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(children(servers, helpers)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    runs = children(servers, helpers)
    assert len(runs) == 2
    for handle in handles:
        handle.kill()  # no cleanup by the servers: the parent-death signals take servers, zygotes and runs down
    gone, alive = psutil.wait_procs(runs + helpers + servers, timeout=5)
    assert alive == []
    v.close()  # the pool retries the two runs on new servers; closing ends them instead of their 30 s timeouts
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()


def test_runs_are_cloned_by_a_zygote_and_a_dead_zygote_retires_its_server():
    v = Verifier(timeout_s=4.0, workers=1)  # a run below loops until this timeout
    server = v._pool_for_use().servers[0]
    parent = real_servers(v)[0]
    zygote = in_namespace(parent, server.hello["zygote"])
    assert zygote.ppid() == parent.pid
    slow = threading.Thread(target=v.execute, args=("def f(a):\n    while True:\n        pass", "0"))
    slow.start()
    deadline = time.monotonic() + 5
    while not children([parent], [zygote]) and time.monotonic() < deadline:
        time.sleep(0.05)
    runs = children([parent], [zygote])
    assert len(runs) == 1 and runs[0].ppid() == parent.pid  # the server's own child: it reaps and signals it
    assert zygote.children() == []
    zygote.kill()
    # a batch sent now waits: the run in flight ends as it would have (its timeout), then the server,
    # which never clones or forks a run itself, retires, and a fresh server with a fresh zygote runs the batch
    batch = [("def f(a):\n    return a * 3", str(k)) for k in range(6)]
    results = v.execute_many(batch)
    assert [r.output for r in results] == [str(3 * k) for k in range(6)]
    slow.join(timeout=30)
    assert not slow.is_alive()
    psutil.wait_procs([parent], timeout=5)
    assert not parent.is_running() and not psutil.pid_exists(zygote.pid)
    fresh = v._pool_for_use().servers[0]
    assert fresh is not server and fresh.hello["zygote"]
    address = "class N:\n    pass\ndef f(n):\n    return [hash(N()) % 9973 for _ in range(n)]"
    assert_serving(v)
    assert any(v.execute(address, "5").status is Status.NONDETERMINISTIC for _ in range(3))
    v.close()


