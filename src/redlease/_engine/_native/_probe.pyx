# cython: language_level=3, boundscheck=False, wraparound=False
"""Test hooks into the native core: its RESP encoder and parser, its reading of a
reply, and one plain command on a ``Pool`` connection.

A module of its own, apart from ``_core``: no engine imports it, and the core
carries nothing for it. It reaches the core's C functions through the
declarations ``_core.pxd`` exports (Cython's cross-module cimport), so what
it runs is the shipped code itself, not a copy; the tests use it (through
``tests/helpers.py``'s ``require_probe``) for what the core keeps to itself.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t
from libc.stdlib cimport free
from libc.string cimport memset

from redlease._engine._native._core cimport (
    DISCO_CLUSTER,
    DISCO_SENTINEL,
    EXPECT_ANY,
    RESP_PAST_LIMIT,
    Pool,
    buf_free,
    build_reply,
    conn_exception,
    deadline_after,
    put_command,
    release_slot,
    reply_node_class,
    reply_route_class,
    resp_parse,
    rl_buf,
    rl_conn,
    rl_disco,
    rl_nodes,
    rl_slot,
    route_run,
    send_all,
    slot_of_object,
    take_reply,
)


def command(Pool pool not None, args, double timeout):
    """Run one plain command (e.g. ``["PING"]``) on one of ``pool``'s connections,
    routed as a script call is; the reply as redis-py gives it."""
    cdef int64_t deadline = deadline_after(timeout)
    cdef rl_slot* slot = pool.grab(deadline)
    cdef rl_conn* c = &slot.conn
    cdef int rc
    try:
        c.w.len = 0
        put_command(&c.w, args)
        c.slot = -1
        with nogil:
            rc = route_run(c, deadline, NULL, send_all, NULL, False)
        if rc < 0:
            raise conn_exception(c)
        return take_reply(c)
    finally:
        release_slot(slot)


def encode_command(args):
    """The RESP2 encoding of one command, e.g. ``encode_command(["SET", "k", 1])``."""
    cdef rl_buf b
    memset(&b, 0, sizeof(b))
    try:
        put_command(&b, args)
        return PyBytes_FromStringAndSize(b.data, <Py_ssize_t>b.len)
    finally:
        buf_free(&b)


def parse_reply(bytes data not None):
    """``(value, consumed)`` for the first whole reply in ``data``, or None when incomplete.

    Error replies come back as exception instances (not raised). A malformed
    reply raises ValueError.
    """
    cdef rl_nodes nodes
    cdef Py_ssize_t rc
    cdef size_t i = 0
    memset(&nodes, 0, sizeof(nodes))
    try:
        rc = resp_parse(PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data), &nodes)
        if rc == 0:
            return None
        if rc == -2:
            raise MemoryError()
        if rc == RESP_PAST_LIMIT:
            raise ValueError("RESP2 array past the element or depth limit")
        if rc < 0:
            raise ValueError("malformed RESP2 reply")
        return build_reply(PyBytes_AS_STRING(data), nodes.items, &i), rc
    finally:
        free(nodes.items)


def reply_kind(bytes reply not None, bint cluster=False):
    """``(class, route class)`` of one raw RESP reply: the core's REPLY_* numbers.

    The route class is for a client through sentinels, or with ``cluster``,
    on a cluster.
    """
    cdef rl_nodes nodes
    cdef rl_disco d
    cdef const char* data = reply
    cdef int what, route
    memset(&nodes, 0, sizeof(nodes))
    try:
        if resp_parse(data, <size_t>len(reply), &nodes) != len(reply):
            raise ValueError("not one whole RESP reply")
        d.kind = DISCO_CLUSTER if cluster else DISCO_SENTINEL
        what = reply_node_class(data, &nodes.items[0], EXPECT_ANY)
        route = reply_route_class(data, &nodes.items[0], &d)
    finally:
        free(nodes.items)
    return what, route


def key_slot(key):
    """The cluster slot of ``key`` (str or bytes) as the core computes it, hash tags honoured."""
    return slot_of_object(key)
