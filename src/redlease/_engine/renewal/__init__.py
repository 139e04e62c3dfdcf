"""The Python renewer (``renewer``): one thread that renews every lease of an
engine on time; the native one is ``_native/renewal/``.
"""
