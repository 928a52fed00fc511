"""The host's side of a sandbox's command channel and of Docker's exec streams: the framing
(Docker's multiplexed stream, newline-delimited JSON replies), output capped as it arrives,
and reading the channel's replies under a deadline. The sandbox side is
``incontainer/helper.py serve``; :mod:`envkit.sandbox.docker_backend` drives both."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import select
import socket
import time
from typing import Any

from envkit.errors import InfraFailure

__all__ = ["CHANNEL_PROTOCOL", "Capped", "Channel", "Deadline", "Demux", "attach_channel", "close_hijacked", "frames",
           "json_tail", "own_time", "with_last_words"]

CHANNEL_PROTOCOL = 3  # helper.py's CHANNEL_PROTOCOL
_ATTACH = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
_MAX_LINE = 128 << 20  # longer than any reply: two capped streams (16 MiB each at most, 32 for a file read), base64


class Deadline(Exception):
    pass


class Capped:
    """Keeps the head and the tail of a stream, up to ``limit`` bytes in all."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    @classmethod
    def from_parts(cls, limit: int, parts: dict[str, Any]) -> Capped:
        """What the in-sandbox helper kept of a stream (helper.py's Capped: the same parts)."""
        capped = cls(limit)
        capped.head = bytearray(base64.b64decode(parts["head"]))[: capped.half]
        capped.tail = bytearray(base64.b64decode(parts["tail"]))[-capped.half:] if parts["tail"] else bytearray()
        capped.total = int(parts["total"])
        return capped

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail) or len(self.tail) > self.half

    def value(self) -> bytes:
        tail = bytes(self.tail[-self.half:]) if len(self.tail) > self.half else bytes(self.tail)
        if self.truncated:
            elided = self.total - len(self.head) - len(tail)
            return bytes(self.head) + f"\n[... {elided} bytes elided ...]\n".encode() + tail
        return bytes(self.head) + tail


class Demux:
    """Docker's multiplexed attach stream: 8-byte headers (stream id, size), then the data."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self.buf += chunk
        out = []
        while len(self.buf) >= 8:
            size = int.from_bytes(self.buf[4:8], "big")
            if len(self.buf) < 8 + size:
                break
            out.append((self.buf[0], bytes(self.buf[8 : 8 + size])))
            del self.buf[: 8 + size]
        return out


def _recv(raw: socket.socket, deadline: float) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise Deadline()
    poller = select.poll()  # not select(): a busy runner holds more than 1024 descriptors
    poller.register(raw, select.POLLIN)
    if not poller.poll(remaining * 1000):
        raise Deadline()
    return raw.recv(65536)


def frames(sock: Any, deadline: float) -> Any:
    """Demultiplex an exec's output from its raw socket, to a deadline."""
    raw: socket.socket = getattr(sock, "_sock", sock)
    demux = Demux()
    while chunk := _recv(raw, deadline):
        yield from demux.feed(chunk)


class Channel:
    """A long-lived `helper.py serve`, attached to its stdin and stdout (the container's main
    process, or an exec's): JSON lines in, JSON lines out, one round trip per call. Each
    request carries a random ``id`` and the helper echoes it: a reply of an earlier request
    (one whose caller gave up, seen again after a re-attach) is skipped, never taken for
    another's, and nothing that writes to the channel's output can know a later request's id."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.raw: socket.socket = getattr(sock, "_sock", sock)
        self.demux = Demux()
        self.lines = bytearray()
        self.stderr = b""
        self.sent = 0

    def call(self, request: dict[str, Any], timeout: float, *, strict: bool = True) -> dict[str, Any]:
        """The reply to ``request``: the first line that is a JSON object with its id. Any other
        line is skipped (a late reply, or what a root process in the sandbox wrote to the
        channel's output: a container environment's agent may be root). ``strict=False`` (the
        hello) also takes a reply with no id, from a helper that does not echo ids."""
        self.sent += 1
        ident = secrets.token_hex(8)
        self.raw.sendall((json.dumps({**request, "id": ident}) + "\n").encode())
        deadline = time.monotonic() + timeout
        while True:
            result = json_tail(self._line(deadline))
            if isinstance(result, dict) and result.get("id", None if strict else ident) == ident:
                result.pop("id", None)
                return result

    def _line(self, deadline: float) -> bytes:
        seen = 0  # how much of self.lines holds no newline
        while (end := self.lines.find(b"\n", seen)) < 0:
            seen = len(self.lines)
            chunk = _recv(self.raw, deadline)
            if not chunk:
                raise ConnectionError("the helper channel closed" + (f": {self.stderr_tail()}" if self.stderr else ""))
            for stream, data in self.demux.feed(chunk):
                if stream == 1:
                    self.lines += data
                else:
                    self.stderr = (self.stderr + data)[-2000:]
            if len(self.lines) > _MAX_LINE:  # no reply is this long: something else writes there
                raise ConnectionError(f"the helper channel sent more than {_MAX_LINE} bytes without a line end")
        line = bytes(self.lines[:end])
        del self.lines[: end + 1]
        return line

    def stderr_tail(self) -> str:
        return self.stderr[-500:].decode(errors="replace").strip()

    def close(self) -> None:
        close_hijacked(self.sock)


_TICK = os.sysconf("SC_CLK_TCK")


def own_time(fields: list[bytes]) -> tuple[float | None, float | None]:
    """A command's own time and CPU from exec.sh's status line: (start, end, children's ticks
    before, after); None where it could not tell (a bash without EPOCHREALTIME, an older exec.sh)."""
    seconds = cpu = None
    with contextlib.suppress(ValueError, IndexError):
        seconds = max(0.0, float(fields[1].replace(b",", b".")) - float(fields[0].replace(b",", b".")))
    with contextlib.suppress(ValueError, IndexError):
        cpu = max(0, int(fields[3]) - int(fields[2])) / _TICK
    return seconds, cpu


def json_tail(line: bytes) -> Any:
    """The JSON value that ends ``line`` (a reply the helper wrote whole, after whatever another
    writer left in front of it), or None."""
    start = line.find(b"{")
    for _ in range(8):
        if start < 0:
            break
        try:
            return json.loads(line[start:])
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            start = line.find(b"{", start + 1)
    return None


def with_last_words(failure: InfraFailure, chan: Channel) -> InfraFailure:
    """``failure`` with what the channel last wrote to its stderr in its evidence."""
    evidence = {k: v for k, v in failure.evidence.items() if k != "message"}
    return InfraFailure(failure.kind, failure.message, **evidence, helper_stderr=chan.stderr_tail())


def close_hijacked(sock: Any) -> None:
    """Close a hijacked exec connection: the HTTP response, its SocketIO and the socket."""
    raw = getattr(sock, "_sock", sock)
    response = getattr(sock, "_response", None)
    with contextlib.suppress(OSError):  # wakes a thread waiting on it (close alone leaves its poll to the deadline)
        raw.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):  # the response's buffered reader may already be closed
        if response is not None:
            response.close()
    with contextlib.suppress(OSError):
        sock.close()
    with contextlib.suppress(OSError):
        raw.close()


def attach_channel(container: Any) -> Channel:
    """The host's end of a command channel that is ``container``'s main process (attach to its
    stdin and stdout; made before the start, nothing it says is missed)."""
    return Channel(container.client.api.attach_socket(container.id, params=_ATTACH))
