# What _renewer_thread.pxi offers the other units: the renewer thread's main
# function.

cdef void* renewer_main(void* arg) noexcept nogil
