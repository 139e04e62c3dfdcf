"""RESP2 in the native core: commands encoded like redis-py, replies parsed like redis-py."""

from __future__ import annotations

import pytest
import redis.exceptions as rex

from engine_helpers import in_child
from helpers import require_probe

probe = require_probe()


# ---------------------------------------------------------------- encoding


def test_each_argument_type_is_encoded_like_redis_py() -> None:
    encoded = probe.encode_command(
        ["SET", b"k\x00", 42, -7, 2**70, 1.5, 0.1, 1e100, "é", bytearray(b"ba"), memoryview(b"mv")]
    )
    expected = (
        b"*11\r\n$3\r\nSET\r\n$2\r\nk\x00\r\n$2\r\n42\r\n$2\r\n-7\r\n"
        b"$22\r\n1180591620717411303424\r\n$3\r\n1.5\r\n$3\r\n0.1\r\n$6\r\n1e+100\r\n"
        b"$2\r\n\xc3\xa9\r\n$2\r\nba\r\n$2\r\nmv\r\n"
    )
    assert encoded == expected


def test_int_and_float_text_matches_repr() -> None:
    for value in (0, -(2**63), 2**63 - 1, 2**64, 3.0, -0.0, 1 / 3, 1e-310, float("inf")):
        text = repr(value).encode()
        assert probe.encode_command([value]) == b"*1\r\n$%d\r\n%s\r\n" % (len(text), text)


@pytest.mark.parametrize("value", [True, False, None, [1], {"a": 1}, object()])
def test_unencodable_arguments_raise_type_error_naming_the_type(value: object) -> None:
    with pytest.raises(TypeError, match=type(value).__name__):
        probe.encode_command(["SET", "k", value])


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (b":0\r\n", 0),
        (b":-9223372036854775808\r\n", -(2**63)),
        (b"+OK\r\n", b"OK"),
        (b"$-1\r\n", None),
        (b"$0\r\n\r\n", b""),
        (b"$5\r\na\r\nbc\r\n", b"a\r\nbc"),
        (b"*-1\r\n", None),
        (b"*0\r\n", []),
        (b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n*0\r\n$-1\r\n", [1, [b"a", []], None]),
    ],
)
def test_each_reply_type_is_parsed(data: bytes, value: object) -> None:
    assert probe.parse_reply(data + b"+next\r\n") == (value, len(data))


def test_error_replies_use_redis_py_exception_classes() -> None:
    cases = {
        b"-ERR unknown command\r\n": rex.ResponseError,
        b"-WRONGTYPE Operation against a key\r\n": rex.ResponseError,
        b"-NOSCRIPT No matching script\r\n": rex.NoScriptError,
        b"-NOAUTH Authentication required.\r\n": rex.AuthenticationError,
        b"-WRONGPASS invalid username-password pair\r\n": rex.AuthenticationError,
        b"-READONLY You can't write\r\n": rex.ReadOnlyError,
        b"-BUSY Redis is busy running a script\r\n": rex.ResponseError,
    }
    for data, cls in cases.items():
        parsed = probe.parse_reply(data)
        assert parsed is not None
        assert type(parsed[0]) is cls, data
    nested = probe.parse_reply(b"*2\r\n:1\r\n-NOSCRIPT gone\r\n")
    assert nested is not None
    assert type(nested[0][1]) is rex.NoScriptError


def test_incomplete_replies_ask_for_more() -> None:
    whole = b"*2\r\n$5\r\nhello\r\n:12\r\n"
    for cut in range(len(whole)):
        assert probe.parse_reply(whole[:cut]) is None
    assert probe.parse_reply(whole) == ([b"hello", 12], len(whole))


@pytest.mark.parametrize(
    "data",
    [b"?1\r\n", b":1x\r\n", b"$3\r\nabcde\r\n", b"$-2\r\n", b":1\rX", b":99999999999999999999\r\n"],
)
def test_malformed_replies_are_rejected(data: bytes) -> None:
    with pytest.raises(ValueError):
        probe.parse_reply(data)


def test_array_counts_that_overflow_the_element_tally_are_rejected() -> None:
    # Two huge counts used to wrap the count of elements still owed, so the
    # reply "completed" with far fewer nodes than its arrays claim and turning
    # it into Python objects read past the end of the node array.
    child = in_child(
        """
        from redlease._engine._native import _probe as probe
        for data in (
            b"*2\\r\\n*9223372036854775807\\r\\n",
            b"*3\\r\\n*4611686018427387904\\r\\n*4611686018427387904\\r\\n",
        ):
            try:
                got = probe.parse_reply(data)
            except ValueError:
                continue
            assert got is None, got
        print("fine")
        """
    )
    assert child.returncode == 0 and child.stdout.strip() == "fine", child.stderr[-2000:]


def test_a_reply_nested_deeper_than_the_c_stack_is_refused_without_a_crash() -> None:
    # Only a broken or hostile server sends this, and it must not take the
    # process down: it is refused at the ninth level, never built.
    child = in_child(
        """
        import socket, threading
        import redis
        from redlease._engine._native import _core as native
        from redlease._engine._native import _probe as probe
        from redlease._engine.conn.client import Endpoint
        depth = 300000
        data = b"*1\\r\\n" * depth + b":7\\r\\n"
        try:
            probe.parse_reply(data)
        except ValueError as exc:
            assert "depth limit" in str(exc), exc
        else:
            raise AssertionError("parsed")
        # The same reply from a server, read on a thread with a small stack.
        listener = socket.create_server(("127.0.0.1", 0))
        def serve():
            conn, _ = listener.accept()
            conn.recv(1024)
            conn.sendall(b"*1\\r\\n" * 20000 + b":7\\r\\n")
            conn.recv(1024)
            conn.close()
        threading.Thread(target=serve, daemon=True).start()
        threading.stack_size(256 * 1024)
        out = []
        def call():
            port = listener.getsockname()[1]
            endpoint = Endpoint("127.0.0.1", port, None, 0, None, None, None)
            pool = native.Pool(native.Target(endpoint))
            try:
                probe.command(pool, ["PING"], 5.0)
            except redis.RedisError as exc:
                out.append(exc)
            pool.close()
        t = threading.Thread(target=call)
        t.start()
        t.join()
        assert out and "past the limits" in str(out[0]), out
        print("fine")
        """
    )
    assert child.returncode == 0 and child.stdout.strip() == "fine", child.stderr[-2000:]
