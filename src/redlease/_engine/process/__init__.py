"""What one process runs once: the driver thread that runs elections and lock
watchdogs (``driver``) and the locks that a forked child re-makes (``forksafe``).
"""
