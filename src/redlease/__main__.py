"""``python -m redlease``: the same command line as the ``redlease`` script."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
