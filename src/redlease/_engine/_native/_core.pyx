# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The native core: RESP2 on the wire, sockets without the GIL, the lease renewer thread.

Three layers, each usable on its own:

* encoding (Python values -> RESP2 bytes in a C buffer, with the GIL) and
  parsing (bytes -> a flat array of C nodes, without the GIL; the nodes become
  Python objects only back in the calling thread, with the GIL);
* ``Pool``: a few connections, each guarded by a pthread mutex, each round
  trip done with the GIL released and bounded by one deadline on
  CLOCK_MONOTONIC (connect, handshake, send, NOSCRIPT reload and reply);
* ``Renewer`` and ``Lease``: one pthread per engine renews every lease of it
  on absolute deadlines, from a timer heap, pipelining the renewals that
  fall due together (one connection to the server, or on a cluster one per
  slot-owning master). It never takes the GIL and never touches a Python
  object: it talks to Python through atomics (state, token) and eventfds
  (wake-ups).

Linux only (eventfd, ppoll, CLOCK_MONOTONIC condition variables). Where the
extension cannot be built the pure-Python engine is used instead.

Lock discipline, the one rule that keeps this deadlock-free: a thread holding
the GIL never *blocks* on one of our mutexes (it may ``trylock``), and the
renewer thread never wants the GIL. A thread may take the GIL while holding a
pool slot mutex, because whoever waits for that mutex waits with the GIL
released.
The discovery state a Target shares with its connections
(master address, slot map; _discovery.pxi) has a mutex that is held only to
copy a few bytes, never across I/O and never while waiting for anything, so
any thread may block on it, the renewer thread included.
"""

# One extension, one file per concern, included in dependency order. Every
# file is compiled into this module: a name defined in one is visible in all.
# What a unit offers the others (its structs, enums, cdef function
# signatures and cdef classes) is declared in its .pxd; _core.pxd includes
# those in the same order, and Cython reads it before this file. The .pxi
# files below hold the implementations (_loopconn and _notices_sub_api offer
# nothing to the others and have no .pxd).
#
#   _posix.pxi         C and system declarations (all in _posix.pxd): clock,
#                      atomics, pthreads, poll, sockets, eventfd
#   _process.pxi       ProcessBound: the base of every object whose threads,
#                      locks or streams belong to the process that made it
#   _resp_encode.pxi   growable C buffers; Python values -> RESP2 commands
#   _resp_parse.pxi    RESP2 replies -> C nodes (no GIL) -> Python objects
#   _conn.pxi          one connection: connect, handshake, send and read
#                      under a deadline, scripts with the NOSCRIPT fallback
#   _tls.pxi           TLS on a connection (OpenSSL, glue in rl_tls.h): the
#                      context from the ssl_* settings, handshake, reads and
#                      writes without the GIL, over the OpenSSL of Python's
#                      ssl module, found at import (tls_available())
#   _discovery.pxi     which server: the shared state of one Target (master
#                      address, slot map), slot hashing, short-lived peers
#   _sentinel.pxi      asking the sentinels for the master, checking ROLE
#   _cluster.pxi       the slot map from CLUSTER SLOTS, MOVED / ASK parsing
#   _replies.pxi       what a reply means: done, MOVED, ASK, retry, failover,
#                      error, or not the shape the caller expects
#   _route.pxi         one routed round trip: MOVED / ASK / READONLY followed
#   _pool.pxi          the Python-facing connection objects: ScriptRef,
#                      Target, Pool, and failures as redis-py exceptions
#   _loopconn.pxi      LoopConn: a non-blocking connection an asyncio event
#                      loop drives, for pipelined fenced writes
#   _pipeline.pxi      many scripts in one round trip on a Pool connection
#   _lease.pxi         one lease's state: atomics, error ring, lateness
#                      histogram (bounds: the engine's LATENESS_BUCKETS)
#   _renewer_heap.pxi  the shared renewer's state: limits, structs, the
#                      timer heap, what a renewal's outcome does to its lease
#   _renewer_cluster.pxi
#                      on a cluster: one connection per slot-owning master,
#                      renewals routed per node, MOVED / ASK per lease
#   _renewer_thread.pxi
#                      the renewer thread's main loop: due leases as one
#                      pipelined batch on one connection (or cluster_round),
#                      no GIL, ever
#   _renewer_api.pxi   Renewer: the Python face that owns the thread
#   _renewer_lease_api.pxi
#                      Lease: one lease renewed by a Renewer (the Keeper
#                      protocol), its state, errors and lateness for Python
#   _notices_queue.pxi release notices: the hub's and a waiter's state, the
#                      bell, queueing a notice for a waiter
#   _notices_session.pxi
#                      one subscription session to one server: connect and
#                      subscribe (hub_open), one look at it (hub_serve)
#   _notices_reader.pxi
#                      the process's reader thread (every live session in one
#                      poll) and connector thread; no GIL, ever
#   _notices_hub_api.pxi
#                      NoticeReader and NoticeHub: the Python faces of the
#                      threads and of one hub
#   _notices_sub_api.pxi
#                      NoticeBell and NoticeSub: the Python faces of waiters
#
# The fork handler lives here, at the end: every ProcessBound made inert.
#
# The tests' hooks into the core (its encoder and parser, its reading of a
# reply, a plain command on a Pool) are not here: they are the module
# _probe.pyx, which cimports what _core.pxd declares and which no engine
# imports.

cimport cython
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_FromString,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.exc cimport PyErr_CheckSignals
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.unicode cimport PyUnicode_AsUTF8AndSize

import os
import weakref

# Every timing constant the engines share (renewal batching and retry floor,
# the resend pause, notice timings, WAIT): the .pxi files convert them into
# their C globals.
from redlease._engine.rules import timing as _timing
# The reply table: _replies.pxi copies its codes and kinds into C.
from redlease._engine.rules import replytable as _replytable
# A batch's series of calls of one script (a fenced pipeline's set_many):
# _pipeline.pxi encodes it from its lists.
from redlease._engine.contract.interface import ScriptSeries as _ScriptRun

# Every ProcessBound alive in this process (Pool, LoopConn, Renewer,
# NoticeHub), for the fork handler below. Not the leases, which are many: each
# is made inert by the first thing that reaches it in a child (see Lease._r).
_live = weakref.WeakSet()

include "process/_posix.pxi"
include "process/_process.pxi"
include "conn/_resp_encode.pxi"
include "conn/_resp_parse.pxi"
include "conn/_conn.pxi"
include "conn/_tls.pxi"
include "conn/_discovery.pxi"
include "conn/_sentinel.pxi"
include "conn/_cluster.pxi"
include "conn/_replies.pxi"
include "conn/_route.pxi"
include "conn/_pool.pxi"
include "conn/_loopconn.pxi"
include "conn/_pipeline.pxi"
include "renewal/_lease.pxi"
include "renewal/_renewer_heap.pxi"
include "renewal/_renewer_cluster.pxi"
include "renewal/_renewer_thread.pxi"
include "renewal/_renewer_api.pxi"
include "renewal/_renewer_lease_api.pxi"
include "notices/_notices_queue.pxi"
include "notices/_notices_session.pxi"
include "notices/_notices_reader.pxi"
include "notices/_notices_hub_api.pxi"
include "notices/_notices_sub_api.pxi"


# ---------------------------------------------------------------- fork safety

def _after_fork_in_child():
    # Each copy is made inert once, here or by whatever reached it first
    # (see ProcessBound); a lease makes its renewer inert before itself.
    for obj in list(_live):
        (<ProcessBound>obj).inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


def native_timing():
    """The timing constants as the native engine holds them: {name in timing: nanoseconds}."""
    return {
        "RENEW_BATCH_WINDOW": RENEW_WINDOW_NS,
        "RENEW_RETRY_FLOOR": RENEW_RETRY_NS,
        "MAX_TTL": MAX_TTL_NS,
        "RESEND_PAUSE": RETRY_PAUSE_NS,
        "NOTICE_READ_SLICE": NOTICE_SLICE_NS,
        "NOTICE_PING_AFTER": NOTICE_PING_NS,
        "NOTICE_DEAD_AFTER": NOTICE_DEAD_NS,
        "NOTICE_IDLE_CLOSE": NOTICE_IDLE_NS,
        "NOTICE_UNSUBSCRIBE_DELAY": NOTICE_UNSUBSCRIBE_NS,
        "NOTICE_BACKOFF_MIN": NOTICE_BACKOFF_MIN_NS,
        "NOTICE_BACKOFF_MAX": NOTICE_BACKOFF_MAX_NS,
        "NOTICE_CONNECT_TIMEOUT": NOTICE_CONNECT_NS,
    }


# What this build serves beyond a fixed TCP address or unix socket (see
# redlease._engine.engines.select).
FEATURES = frozenset(_DISCOVERY_FEATURES + _TLS_FEATURES)
