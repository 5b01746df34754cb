"""The result channel of one run: exactly one length-prefixed frame on a pipe made for that run.

A frame is ``kind`` (1 byte) ``|`` ``length`` (4 bytes, little-endian) ``|`` ``body`` (``length``
bytes). The body of every kind is ``error length`` (2 bytes, little-endian) ``|`` ``error``
(UTF-8, at most ``MAX_ERROR_BYTES``) ``|`` ``output`` (UTF-8 with surrogates passed; only ``ok``
carries one; ``probe`` carries its JSON report there).

Everything a run writes is hostile input: the program holds its own result pipe, so it can write
any bytes there. ``decode`` therefore takes nothing on trust. It accepts exactly one well-formed
frame of a kind the run may send (``probe`` only for a probe request), of at most ``frame_bound``
bytes, with an output of at most ``max_output_chars`` characters; anything else (no frame, a
torn or oversized one, an unknown kind, a second frame, trailing bytes, text that is not UTF-8)
is a protocol violation, reported as that run's CRASHED verdict with the reason. It parses no
nested structure (the probe's JSON is parsed by the caller, bounded in size), so no input can
drive a recursion. A run that writes a well-formed frame of its own gives itself a verdict it
could have earned honestly (an ``ok`` frame is the same as returning that value; the caller
still checks that the output is one literal within the bound); it can never write another run's.

Standard library only: the fork server imports this module.
"""

from __future__ import annotations

# The statuses a run reports about itself. ``timeout`` and ``crashed`` are the server's to give
# (from the wait status), never a run's.
KINDS: dict[str, int] = {
    "ok": 1, "no_entry_function": 2, "forbidden": 3, "runtime_error": 4, "memory_limit": 5,
    "output_too_large": 6, "bad_output": 7, "probe": 8,
}
NAMES: dict[int, str] = {code: name for name, code in KINDS.items()}
HEADER_BYTES = 5
MAX_ERROR_BYTES = 1024
MAX_PROBE_BYTES = 4096
VIOLATION = "result protocol violation"


def encode(kind: str, error: str = "", output: str = "") -> bytes:
    """One frame: ``kind | len(body) | len(error) | error | output`` (see the module docstring)."""
    err = error.encode("utf-8", "backslashreplace")[:MAX_ERROR_BYTES]
    body = len(err).to_bytes(2, "little") + err + output.encode("utf-8", "surrogatepass")
    return bytes((KINDS[kind],)) + len(body).to_bytes(4, "little") + body


def frame_bound(max_output_chars: int) -> int:
    """The most bytes one frame may take: an output of ``max_output_chars`` characters at 4 UTF-8
    bytes each (or a probe report), a full error and the headers. The server reads no more."""
    return HEADER_BYTES + 2 + MAX_ERROR_BYTES + max(4 * int(max_output_chars), MAX_PROBE_BYTES)


def violation(reason: str) -> dict:
    """The verdict of a run that broke the protocol."""
    return {"status": "crashed", "output": None, "error": f"{VIOLATION}: {reason}"}


def decode(data: bytes, max_output_chars: int, probe: bool) -> dict:
    """The verdict ``data`` (everything a run wrote, at most ``frame_bound + 1`` bytes) stands for:
    ``{"status", "output", "error"}`` (and ``"probe"``, the report's JSON text, for a probe).
    Never raises; a malformed channel gives a CRASHED verdict naming the violation."""
    if len(data) < HEADER_BYTES:
        return violation("no frame" if not data else f"a torn frame header ({len(data)} bytes)")
    code, length = data[0], int.from_bytes(data[1:HEADER_BYTES], "little")
    kind = NAMES.get(code)
    if kind is None:
        return violation(f"unknown frame kind {code}")
    if (kind == "probe") != bool(probe):
        return violation(f"a {kind} frame answering a probe" if probe else "a probe frame from a program run")
    if HEADER_BYTES + length > frame_bound(max_output_chars):
        return violation(f"a frame of {length} bytes, more than the bound of {frame_bound(max_output_chars)}")
    end = HEADER_BYTES + length
    if len(data) < end:
        return violation(f"a torn frame ({len(data) - HEADER_BYTES} of {length} body bytes)")
    if len(data) > end:
        return violation(f"{len(data) - end} bytes after the frame (a second frame or trailing data)")
    if length < 2:
        return violation("a frame body without its error length")
    error_bytes = int.from_bytes(data[HEADER_BYTES : HEADER_BYTES + 2], "little")
    if error_bytes > MAX_ERROR_BYTES or 2 + error_bytes > length:
        return violation(f"an error field of {error_bytes} bytes in a body of {length}")
    error = data[HEADER_BYTES + 2 : HEADER_BYTES + 2 + error_bytes].decode("utf-8", "replace")
    payload = data[HEADER_BYTES + 2 + error_bytes : end]
    if kind == "probe":
        if len(payload) > MAX_PROBE_BYTES:
            return violation(f"a probe report of {len(payload)} bytes")
        return {"status": "ok", "output": None, "error": "", "probe": payload.decode("utf-8", "replace")}
    if kind != "ok":
        if payload:
            return violation(f"a {kind} frame carrying an output")
        return {"status": kind, "output": None, "error": error}
    try:
        output = payload.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return violation("an output that is not UTF-8")
    if len(output) > max_output_chars:
        return {"status": "output_too_large", "output": None,
                "error": f"the run's frame holds an output of {len(output)} characters, the bound is {max_output_chars}"}
    return {"status": "ok", "output": output, "error": ""}
