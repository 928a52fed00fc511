from envkit.sandbox.channel import Capped


def test_small_output_is_kept_whole():
    c = Capped(100)
    c.add(b"hello ")
    c.add(b"world")
    assert c.value() == b"hello world" and not c.truncated


def test_large_output_keeps_head_and_tail():
    c = Capped(100)
    for i in range(1000):
        c.add(f"{i:04d}\n".encode())
    out = c.value()
    assert c.truncated and c.total == 5000
    assert out.startswith(b"0000\n0001\n")
    assert out.endswith(b"0998\n0999\n")
    assert b"bytes elided" in out
    assert len(out) < 200


def test_a_helper_whose_output_docker_lost_is_run_once_more_when_idempotent():
    """Docker can drop a short exec's output entirely; idempotent helper commands (reset) are
    rerun once; others, or a second silence, are an infra failure with the evidence."""
    from types import SimpleNamespace

    import pytest

    from envkit.errors import InfraFailure
    from envkit.sandbox import SandboxLimits
    from envkit.sandbox.docker_backend import DockerSandbox

    def answer(text: bytes) -> tuple[Capped, Capped, bool]:
        out = Capped(1 << 20)
        if text:
            out.add(text)
        return out, Capped(1 << 20), False

    sb = DockerSandbox(container=SimpleNamespace(id="c0"), limits=SandboxLimits(), image="sha256:x")
    replies = [answer(b""), answer(b'{"state_hash": "sha256:a", "commit": "c"}\n')]
    calls: list[list[str]] = []
    sb._run = lambda cmd, **_kw: (calls.append(cmd), replies.pop(0))[1]  # type: ignore[method-assign]
    assert sb._helper(["reset", "3"], user="agent")["state_hash"] == "sha256:a"
    assert len(calls) == 2

    calls.clear()
    replies[:] = [answer(b""), answer(b"")]
    with pytest.raises(InfraFailure) as e:
        sb._helper(["reset", "3"], user="agent")
    assert e.value.kind == "reset_failed" and len(calls) == 2

    calls.clear()
    replies[:] = [answer(b""), answer(b"{}\n")]
    with pytest.raises(InfraFailure):
        sb._helper(["http", "GET", "/"], user="agent")  # not idempotent in general: never rerun
    assert len(calls) == 1


def test_closing_a_channel_wakes_a_call_waiting_on_it():
    """A sandbox destroyed from another thread (an interrupted synth, 2026-12-07) while a call
    waits for its reply: the call ends at once with the channel closed, not at its deadline
    (closing the descriptor alone left the waiting poll to run out its 150 s)."""
    import socket
    import threading
    import time

    from envkit.sandbox.channel import Channel, close_hijacked

    ours, theirs = socket.socketpair()
    chan = Channel(ours)
    got: list[BaseException] = []

    def call() -> None:
        try:
            chan.call({"op": "exec"}, timeout=60)
        except BaseException as e:  # noqa: BLE001 - what the waiting call raised is the point
            got.append(e)
    waiter = threading.Thread(target=call)
    waiter.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    close_hijacked(ours)
    waiter.join(10)
    assert not waiter.is_alive() and time.monotonic() - t0 < 5
    assert isinstance(got[0], OSError)  # the channel closed (or its descriptor gone): what the backend's calls catch
    theirs.close()
