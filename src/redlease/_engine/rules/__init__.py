"""The engines' rules: what a reply means (``replytable``, ``replies``), the timing
(``timing``), the WAIT rule of a fenced write (``replication``) and what an
argument may be (``encodable``). Plain data and pure functions, read by both
engines; the native core fills its C tables from them at import.
"""
