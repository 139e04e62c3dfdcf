"""What a Redis command argument may be, as every writer of the engines encodes it."""

from __future__ import annotations

EncodableT = str | bytes | int | float
"""A script argument: text (sent as UTF-8), bytes as they are, or a number."""
