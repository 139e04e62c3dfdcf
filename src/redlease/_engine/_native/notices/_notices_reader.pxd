# What _notices_reader.pxi offers the other units: a hub wanted by a
# waiter (reader_want) and a hub let go (reader_let_go), served by the
# process's reader and connector threads.

cdef int reader_want(rl_reader* r, rl_hub* h) noexcept nogil
cdef void reader_let_go(rl_reader* r, rl_hub* h) noexcept nogil
