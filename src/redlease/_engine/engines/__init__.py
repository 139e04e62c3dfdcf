"""The two engines (``python``, ``native``) and which one a client gets
(``select``: the choice, the shared engine per client, ``engine_info``).
"""
