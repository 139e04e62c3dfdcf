"""The Python renewer (``renewer``): one thread that renews every lease of an
engine on time, and the Python engine's batched renewals (``batch``: many
leases in one script call); the native one is ``_native/renewal/``.
"""
