from envkit.sandbox.docker_backend import _Capped


def test_small_output_is_kept_whole():
    c = _Capped(100)
    c.add(b"hello ")
    c.add(b"world")
    assert c.value() == b"hello world" and not c.truncated


def test_large_output_keeps_head_and_tail():
    c = _Capped(100)
    for i in range(1000):
        c.add(f"{i:04d}\n".encode())
    out = c.value()
    assert c.truncated and c.total == 5000
    assert out.startswith(b"0000\n0001\n")
    assert out.endswith(b"0998\n0999\n")
    assert b"bytes elided" in out
    assert len(out) < 200
