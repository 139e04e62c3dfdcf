"""What a release carries: the license where every pip reads it, and an sdist
with the documents, the examples, the scripts and the tests.

The metadata is prepared from this checkout the way a build frontend asks for it
(no compiler, no wheel): a few seconds.
"""

from __future__ import annotations

import email
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.metadata import Metadata

ROOT = Path(__file__).resolve().parents[1]

PREPARE = """
import sys
import setuptools.build_meta as backend
print(backend.prepare_metadata_for_build_wheel(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's .dist-info (and the egg-info beside it) as setuptools prepares them."""
    out = tmp_path_factory.mktemp("metadata")
    done = subprocess.run(
        [sys.executable, "-c", PREPARE, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out / done.stdout.strip().splitlines()[-1]


def test_the_license_is_in_the_field_every_pip_shows(prepared: Path) -> None:
    text = (prepared / "METADATA").read_text()
    headers = email.message_from_string(text)
    # pip 23's `pip show` prints the License field and nothing else; newer pips
    # print it too when there is no License-Expression.
    assert headers["License"] == "MIT"
    # Metadata 2.4 allows one of License and License-Expression, never both.
    assert headers["License-Expression"] is None
    assert headers.get_all("License-File") == ["LICENSE"]
    assert (prepared / "licenses" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    Metadata.from_email(text, validate=True)  # raises on metadata an index would reject


def test_the_sdist_carries_the_documents_examples_scripts_and_tests(prepared: Path) -> None:
    (egg_info,) = prepared.parent.glob("*.egg-info")
    listed = set((egg_info / "SOURCES.txt").read_text().split())
    wanted = {
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "MANIFEST.in",
        "docs/versioning.md",
        "docs/troubleshooting.md",
        "docs/api/conf.py",
        "docs/api/index.rst",
        "tests/conftest.py",
        "tests/helpers.py",
        "tests/cli/cli_helpers.py",
        "tests/engine/conftest.py",
    }
    for tracked in ("docs", "examples", "lua"):
        wanted |= {
            str(path.relative_to(ROOT))
            for path in (ROOT / tracked).rglob("*")
            if path.is_file() and "_build" not in path.parts and "__pycache__" not in path.parts
        }
    assert wanted - listed == set()
    assert not [name for name in listed if "__pycache__" in name or name.endswith(".pyc")]
