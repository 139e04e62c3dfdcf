"""The native RESP2 parser against hiredis's reader, on generated and mutated replies.

Both read the same bytes, whole and cut at every point: where hiredis reads
a reply, the native parser reads the same value over the same bytes; where
hiredis says the bytes are not RESP, so does the native parser; where
hiredis waits for more, the native parser waits too. Hypothesis finds the
inputs, shrinks any disagreement to its smallest form, and keeps it.
"""

from __future__ import annotations

import itertools
from typing import Any

import hiredis
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from helpers import require_probe
from redlease._engine.conn.boundedsocket import Headers
from redlease._engine.contract.interface import MAX_REPLY_DEPTH, MAX_REPLY_ELEMENTS
from redlease._engine.rules.replies import ReplyTooLarge

probe = require_probe()

MAX_DEPTH = 4
"""Nesting the generated replies reach (hiredis refuses deeper than 7)."""

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda v: b":%d\r\n" % v),
    st.binary(max_size=40).map(lambda b: b"$%d\r\n%s\r\n" % (len(b), b)),
    st.just(b"$-1\r\n"),
    st.just(b"*-1\r\n"),
    st.text(
        st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=20
    ).map(lambda t: b"+" + t.encode() + b"\r\n"),
    st.text(
        st.characters(blacklist_characters="\r\n", codec="utf-8"), min_size=1, max_size=20
    ).map(lambda t: b"-ERR " + t.encode() + b"\r\n"),
)

replies = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5).map(
        lambda items: b"*%d\r\n" % len(items) + b"".join(items)
    ),
    max_leaves=20,
)


def depth(data: bytes) -> int:
    """How deep the arrays of a generated reply nest (a rough bound, from its headers)."""
    return data.count(b"*")


def hiredis_reads(data: bytes) -> tuple[str, Any]:
    """("value", v) / ("incomplete", None) / ("malformed", None), as hiredis's reader says."""
    reader = hiredis.Reader()
    reader.feed(data)
    try:
        got = reader.gets()
    except hiredis.ProtocolError:
        return "malformed", None
    except Exception:  # a RESP3 type byte, read as such, that fails in hiredis itself
        return "malformed", None
    if got is False:
        return "incomplete", None
    return "value", normal(got)


def native_reads(data: bytes) -> tuple[str, Any]:
    try:
        got = probe.parse_reply(data)
    except ValueError:
        return "malformed", None
    if got is None:
        return "incomplete", None
    value, consumed = got
    return "value", (normal(value), consumed)


def normal(value: Any) -> Any:
    """Errors compare by message (the two build different exception classes)."""
    if isinstance(value, Exception):
        return ("error", str(value).split(" ", 1)[-1] if " " in str(value) else str(value))
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


def hiredis_spans(data: bytes) -> int:
    """How many bytes hiredis's first reply spans (by feeding byte by byte)."""
    reader = hiredis.Reader()
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
        if reader.gets() is not False:
            return i + 1
    raise AssertionError("no whole reply")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies)
def test_a_generated_reply_reads_the_same_whole_and_at_every_cut(data: bytes) -> None:
    kind, value = hiredis_reads(data)
    assert kind == "value"
    native_kind, native_value = native_reads(data)
    assert native_kind == "value", (data, native_kind)
    got, consumed = native_value
    assert consumed == len(data)
    assert compare(got, value), (data, got, value)
    for cut in range(len(data)):
        assert native_reads(data[:cut]) == ("incomplete", None), (data, cut)


def compare(native: Any, other: Any) -> bool:
    if isinstance(native, tuple) and native and native[0] == "error":
        # hiredis keeps the error code in the message, redis-py's classes strip it.
        return isinstance(other, tuple) and other[0] == "error"
    if isinstance(native, list):
        return (
            isinstance(other, list)
            and len(native) == len(other)
            and all(compare(a, b) for a, b in zip(native, other, strict=True))
        )
    return bool(native == other)


mutations = st.tuples(
    replies,
    st.lists(
        st.tuples(
            st.sampled_from(["flip", "drop", "insert"]),
            st.integers(min_value=0, max_value=10_000),
            st.binary(min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=3,
    ),
)


def mutate(data: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    out = bytearray(data)
    for how, where, what in edits:
        at = where % (len(out) + 1)
        if how == "flip" and out:
            out[at % len(out)] = what[0]
        elif how == "drop" and out:
            del out[at % len(out)]
        else:
            out[at:at] = what
    return bytes(out)


class _Malformed(Exception):
    pass


class _Incomplete(Exception):
    pass


def strict_reads(data: bytes) -> tuple[str, Any]:
    """RESP2 as the protocol states it: every line and every bulk ends in CRLF.

    The reference the native parser must match to the byte; hiredis reads
    the same values wherever the bytes are strictly RESP2 (checked below),
    and is laxer elsewhere (it skips a bulk's last two bytes unread).
    """
    try:
        value, end = _strict(data, 0)
    except _Malformed:
        return "malformed", None
    except _Incomplete:
        return "incomplete", None
    return "value", (value, end)


def _strict(data: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
    if pos >= len(data):
        raise _Incomplete
    kind = data[pos : pos + 1]
    if kind not in (b"+", b"-", b":", b"$", b"*", b"_"):
        raise _Malformed
    if kind == b"_" and data[pos + 1 : pos + 2] not in (b"", b"\r"):
        raise _Malformed  # RESP3's null holds nothing before its CRLF
    cr = data.find(b"\r", pos + 1)
    if cr < 0 or cr + 1 >= len(data):
        raise _Incomplete
    if data[cr + 1 : cr + 2] != b"\n":
        raise _Malformed
    line, pos = data[pos + 1 : cr], cr + 2
    if b"\n" in line:
        raise _Malformed  # a line holds no LF
    if kind == b"_":
        return None, pos  # RESP3's null, read as RESP2's nil (as hiredis reads it)
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return ("error", line.decode("utf-8", "replace")), pos
    number = _integer(line)
    if kind == b":":
        return number, pos
    if number < -1:
        raise _Malformed
    if kind == b"$":
        if number == -1:
            return None, pos
        if pos + number + 2 > len(data):
            raise _Incomplete
        if data[pos + number : pos + number + 2] != b"\r\n":
            raise _Malformed
        return data[pos : pos + number], pos + number + 2
    if number == -1:
        return None, pos
    if number > 0 and (number > MAX_REPLY_ELEMENTS or depth == MAX_REPLY_DEPTH):
        raise _Malformed  # past our limits: refused at the header, whatever follows
    items = []
    for _ in range(number):
        item, pos = _strict(data, pos, depth + 1)
        items.append(item)
    return items, pos


def _integer(line: bytes) -> int:
    digits = line[1:] if line[:1] == b"-" else line
    if not digits or not digits.isdigit():
        raise _Malformed
    if digits[:1] == b"0" and (len(digits) > 1 or line[:1] == b"-"):
        raise _Malformed  # "00", "-0": canonical integers only, as hiredis reads them
    value = int(line)
    if not -(2**63) <= value < 2**63:
        raise _Malformed
    return value


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
@example((b":1\r\n", [("flip", 0, b"?")]))  # a bad type byte: refused at once, as hiredis does
@example((b"$3\r\nabc\r\n", [("flip", 1, b"9")]))  # a bulk whose length lies
@example((b"*1\r\n:1\r\n", [("insert", 1, b"99999999999999999999")]))  # a count past 64 bits
@example((b"$0\r\n\r\n", [("insert", 4, b"\x00")]))  # a bulk not ended by CRLF
def test_a_mutated_reply_is_read_as_the_protocol_states_and_as_hiredis_reads_it(
    case: tuple[bytes, list[tuple[str, int, bytes]]],
) -> None:
    data = mutate(*case)
    strict_kind, strict_value = strict_reads(data)
    native_kind, native_value = native_reads(data)
    assert native_kind == strict_kind, (data, native_kind, strict_kind)
    if strict_kind == "value":
        got, consumed = native_value
        assert compare(got, normal_strict(strict_value[0])), (data, got, strict_value)
        assert consumed == strict_value[1], data
        # Strictly valid bytes: hiredis reads the same value.
        kind, value = hiredis_reads(data)
        assert kind == "value" and compare(got, value), (data, kind, value)
    # What hiredis refuses, the native parser refuses too: it never waits on
    # bytes a reader could already tell are not a reply.
    if hiredis_reads(data)[0] == "malformed":
        assert native_kind == "malformed", (data, native_kind)
    for cut in range(len(data)):
        kind_at_cut = strict_reads(data[:cut])[0]
        assert native_reads(data[:cut])[0] == kind_at_cut, (data, cut)


def normal_strict(value: Any) -> Any:
    if isinstance(value, list):
        return [normal_strict(v) for v in value]
    return value


PAST_LIMITS = {
    "two billion elements": b"*2147483647\r\n",
    "one element too many": b"*%d\r\n" % (MAX_REPLY_ELEMENTS + 1),
    "one level too deep": b"*1\r\n" * (MAX_REPLY_DEPTH + 1) + b":1\r\n",
    "too deep inside a wide array": b"*3\r\n:1\r\n" + b"*1\r\n" * MAX_REPLY_DEPTH + b":1\r\n",
}
"""Arrays past the limits, refused as soon as the offending header's line ends."""

AT_LIMITS = {
    "as many elements as allowed": b"*%d\r\n" % MAX_REPLY_ELEMENTS + b":1\r\n" * MAX_REPLY_ELEMENTS,
    "as deep as allowed": b"*1\r\n" * MAX_REPLY_DEPTH + b":1\r\n",
}


@pytest.mark.parametrize("case", list(PAST_LIMITS))
def test_an_array_past_the_limits_is_refused_at_its_header(case: str) -> None:
    data = PAST_LIMITS[case]
    assert native_reads(data) == ("malformed", None)
    assert strict_reads(data) == ("malformed", None)
    header_end = data.rfind(b"*")  # the offending header is the last one
    for cut in range(data.find(b"\n", header_end) + 1):
        assert native_reads(data[:cut])[0] == "incomplete", cut
    # The Python engine's walker refuses it at the same header, however the bytes arrive.
    for step in (1, 3, len(data)):
        walker = Headers()
        with pytest.raises(ReplyTooLarge, match="past the limits"):
            for at in range(0, len(data), step):
                walker.feed(data[at : at + step])


@pytest.mark.parametrize("case", list(AT_LIMITS))
def test_an_array_at_the_limits_is_read(case: str) -> None:
    data = AT_LIMITS[case]
    kind, value = native_reads(data)
    assert kind == "value" and value[1] == len(data)
    walker = Headers()
    walker.feed(data)
    assert walker._owed == []  # every array closed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies, st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40))
def test_the_python_walker_follows_a_reply_fed_in_any_pieces(
    data: bytes, steps: list[int]
) -> None:
    # Within the limits it never refuses, and it ends each reply with no array open,
    # over two replies back to back (a bulk's body is skipped, never taken for headers).
    assume(strict_reads(data)[0] == "value")
    stream = data + data
    walker, at = Headers(), 0
    for step in itertools.cycle(steps):
        if at >= len(stream):
            break
        walker.feed(stream[at : at + step])
        at += step
    assert walker._owed == [] and walker._skip == 0 and walker._line == b""


@pytest.mark.parametrize(
    "data",
    [b"?", b"!x\r\n", b"\r\n", b"*1\r\n?"],
)
def test_a_bad_type_byte_is_refused_before_any_line_end(data: bytes) -> None:
    assert native_reads(data) == ("malformed", None)
