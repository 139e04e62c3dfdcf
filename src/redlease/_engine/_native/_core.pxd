# The declarations each unit of the native core offers the others: one .pxd
# per unit, in dependency order (its structs, enums, cdef function signatures
# and cdef classes). The .pxi files that _core.pyx includes hold the
# implementations. Cython reads this file when it compiles _core.pyx.

include "_posix.pxd"
include "_process.pxd"
include "_resp_encode.pxd"
include "_resp_parse.pxd"
include "_conn.pxd"
include "_tls.pxd"
include "_discovery.pxd"
include "_sentinel.pxd"
include "_cluster.pxd"
include "_replies.pxd"
include "_route.pxd"
include "_pool.pxd"
include "_pipeline.pxd"
include "_lease.pxd"
include "_renewer_heap.pxd"
include "_renewer_cluster.pxd"
include "_renewer_thread.pxd"
include "_renewer_api.pxd"
include "_renewer_lease_api.pxd"
include "_notices_queue.pxd"
include "_notices_session.pxd"
include "_notices_reader.pxd"
include "_notices_hub_api.pxd"
