# The bottom layer's one Python-visible helper; its C and system
# declarations are in _posix.pxd.
#
# Needs: nothing: the bottom layer.

def _monotonic():
    """CLOCK_MONOTONIC in seconds: the clock every deadline here is measured on.

    A test hook, not part of the module's interface.
    """
    return <double>rl_now_ns() / 1e9
