"""What a release carries: the license where every pip reads it, and an sdist
with the documents, the examples, the scripts and the tests.

The sdist is built as a user's frontend builds it (``python -m build --sdist``:
its own build environment from the build requirements, no compiler), from a
copy of this checkout, since setuptools stages an sdist in the folder it builds
from; its PKG-INFO is the metadata every wheel built from it carries. Both tests
run on one worker, which builds it once.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.metadata import Metadata

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.xdist_group("sdist")

# What a checkout holds that is not its source: never copied, never in an sdist.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "_build", "*.egg-info", "__pycache__", "*.so",
    ".pytest_cache", ".mypy_cache", ".ruff_cache", ".benchmarks",
)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> tarfile.TarFile:
    """The sdist ``python -m build --sdist`` makes of this checkout, opened."""
    out = tmp_path_factory.mktemp("sdist")
    tree = out / "tree"
    shutil.copytree(ROOT, tree, ignore=NOT_SOURCE)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("redlease-*.tar.gz")
    return tarfile.open(built)


def members(sdist: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """The sdist's files by their path in the checkout (its top folder taken off)."""
    return {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}


def read(sdist: tarfile.TarFile, name: str) -> str:
    extracted = sdist.extractfile(members(sdist)[name])
    assert extracted is not None, name
    return extracted.read().decode()


def test_the_license_is_in_the_field_every_pip_shows(sdist: tarfile.TarFile) -> None:
    text = read(sdist, "PKG-INFO")
    headers = email.message_from_string(text)
    # pip 23's `pip show` prints the License field and nothing else; newer pips
    # print it too when there is no License-Expression.
    assert headers["License"] == "MIT"
    # Metadata 2.4 allows one of License and License-Expression, never both.
    assert headers["License-Expression"] is None
    assert headers.get_all("License-File") == ["LICENSE"]
    assert read(sdist, "LICENSE") == (ROOT / "LICENSE").read_text()
    Metadata.from_email(text, validate=True)  # raises on metadata an index would reject


def test_the_sdist_carries_the_documents_examples_scripts_and_tests(
    sdist: tarfile.TarFile,
) -> None:
    listed = set(members(sdist))
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
