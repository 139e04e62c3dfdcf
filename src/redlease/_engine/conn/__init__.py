"""Connections: the endpoint a client names (``client``), its family
(``clientfamily``), the engines' own connections made like it (``connect``,
``pyconn``, ``pyloopconn`` over ``boundedsocket``), a Sentinel master's
switches (``failover``), a Cluster's slot map (``slotmap``) and the first
contact that fails loudly (``contact``).
"""
