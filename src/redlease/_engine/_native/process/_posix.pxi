# The bottom layer: its C and system declarations are all in _posix.pxd
# (CLOCK_MONOTONIC, rl_now_ns, is the clock every deadline here is measured
# on, time.monotonic()'s).
#
# Needs: nothing: the bottom layer.
