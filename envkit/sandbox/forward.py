"""Port forwarding without a network: 127.0.0.1:<port> on the host reaches a sandbox's
service through one `docker exec` relay per connection.

The sandbox keeps ``network = "none"`` (no interface but loopback), so the host cannot
reach it over TCP; each accepted connection starts ``helper.py relay`` inside the sandbox
(as the agent), which connects to the service on the sandbox's own 127.0.0.1 and pipes bytes
both ways over the exec's hijacked socket. The listening socket is bound to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

from envkit.sandbox.docker_backend import DockerSandbox, close_hijacked, frames

__all__ = ["PortForward"]


class PortForward:
    def __init__(self, sandbox: DockerSandbox) -> None:
        self.sandbox = sandbox
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.host, self.port = self._listener.getsockname()
        self._closed = False
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._accept_loop, name="envkit-forward", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            relay = self.sandbox.open_relay()
        except Exception as e:  # noqa: BLE001 - recorded; the client sees its connection close
            self.errors.append(f"{type(e).__name__}: {e}")
            conn.close()
            return
        raw: socket.socket = getattr(relay, "_sock", relay)

        def to_sandbox() -> None:
            try:
                while data := conn.recv(65536):
                    raw.sendall(data)
            except OSError:
                pass
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_WR)

        threading.Thread(target=to_sandbox, daemon=True).start()
        try:
            for stream, data in frames(relay, time.monotonic() + 3600):
                if stream == 1:
                    conn.sendall(data)
        except Exception:  # noqa: BLE001 - a closed client or sandbox ends this connection only
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
            close_hijacked(relay)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
