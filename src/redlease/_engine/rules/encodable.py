"""What a Redis command argument may be, as every writer of the engines encodes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EncodableT = str | bytes | int | float
"""A script argument: text (sent as UTF-8), bytes as they are, or a number."""


_split: Callable[[object, bool], tuple[list[Any], list[Any]] | None] | None = None
_looked = False


def split_pairs(items: object, keys: bool) -> tuple[list[Any], list[Any]] | None:
    """``items`` as ``(firsts, seconds)`` when a dict or a list/tuple of pairs holds only
    plainly good arguments (exact types: firsts str/bytes with ``keys``, else a value;
    seconds a value); None when that takes a closer look, or without the extension.

    The fast path of a fenced pipeline's ``set_many`` / ``hset_many`` check, in C
    where the native extension is built (whichever engine the pipeline is on);
    the caller checks item by item whenever this says None.
    """
    global _split, _looked
    if not _looked:
        try:
            from .._native._core import split_pairs as native_split

            _split = native_split
        except ImportError:
            _split = None
        _looked = True
    return None if _split is None else _split(items, keys)
