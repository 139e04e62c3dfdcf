"""The one interface both engines implement (``interface``: Engine, Keeper, the
keeper states, a batch of script calls) and the asyncio loop writer they hand to
coroutines (``aiowriter``, compiled where the extension is built).
"""
