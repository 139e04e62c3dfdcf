"""Release notices: what one is and where it is published (``notice``), and
each engine's listener (``pynotices``, ``nativenotices``), reached through
``Engine.notices(client)``.
"""
