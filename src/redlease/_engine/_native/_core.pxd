# The declarations each unit of the native core offers the others: one .pxd
# per unit, in dependency order (its structs, enums, cdef function signatures
# and cdef classes). The .pxi files that _core.pyx includes hold the
# implementations. Cython reads this file when it compiles _core.pyx.

include "process/_posix.pxd"
include "process/_process.pxd"
include "conn/_resp_encode.pxd"
include "conn/_resp_parse.pxd"
include "conn/_conn.pxd"
include "conn/_tls.pxd"
include "conn/_discovery.pxd"
include "conn/_sentinel.pxd"
include "conn/_cluster.pxd"
include "conn/_replies.pxd"
include "conn/_route.pxd"
include "conn/_pool.pxd"
include "conn/_pipeline.pxd"
include "renewal/_lease.pxd"
include "renewal/_renewer_heap.pxd"
include "renewal/_renewer_cluster.pxd"
include "renewal/_renewer_thread.pxd"
include "renewal/_renewer_api.pxd"
include "renewal/_renewer_lease_api.pxd"
include "notices/_notices_queue.pxd"
include "notices/_notices_session.pxd"
include "notices/_notices_reader.pxd"
include "notices/_notices_hub_api.pxd"
