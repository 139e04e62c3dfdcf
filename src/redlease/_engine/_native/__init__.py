"""The native core, one Cython extension (``_core``) built from files split by concern.

Nothing is imported here, so that ``import redlease._engine._native`` works
whether or not the extension was built; import ``_core`` to use it.
"""
