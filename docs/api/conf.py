"""Sphinx configuration of the API reference (``sphinx-build -W -b html docs/api OUT``).

The pages are made from the docstrings of the public modules; the package is
imported from ``src`` when it is not installed, so the reference builds from a
checkout too.
"""

from __future__ import annotations

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
if SRC.is_dir():
    sys.path.insert(0, str(SRC))

from redlease import __version__  # noqa: E402

project = "redlease"
author = "the redlease authors"
copyright = "the redlease authors, MIT License"
version = release = __version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]

# The docstrings say in prose what each parameter is; the signatures carry the
# types. Annotations name internal classes, which the reference does not list.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
# Double backticks in the docstrings are code, as in the rest of the project.
default_role = "literal"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# The optional integrations' libraries need not be installed to build this.
autodoc_mock_imports = ["celery", "apscheduler", "prometheus_client", "opentelemetry"]

html_theme = "alabaster"
html_title = f"redlease {__version__} API reference"
exclude_patterns = ["_build"]


def _fences(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """Markdown code fences in a docstring (the project writes its examples so) as
    reStructuredText code blocks: ```` ```python ```` ... ```` ``` ```` becomes a
    ``code-block`` directive over the same lines."""
    out: list[str] = []
    fence: str | None = None
    for line in lines:
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence = line[: len(line) - len(line.lstrip())]
            out += [f"{fence}.. code-block:: {stripped[3:].strip() or 'text'}", ""]
        elif fence is not None and stripped == "```":
            out.append("")
            fence = None
        elif fence is not None:
            out.append(f"{fence}   {line[len(fence):]}" if line.strip() else "")
        else:
            out.append(line)
    lines[:] = out


def setup(app: object) -> None:
    app.connect("autodoc-process-docstring", _fences)  # type: ignore[attr-defined]
