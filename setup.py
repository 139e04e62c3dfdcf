"""Build the native engine and ship the Lua scripts inside the package.

The extension is optional at install time: when it cannot be compiled the
package still installs and runs on the pure-Python engine. CI checks that the
build produced it (``engine="auto"`` must resolve to ``native`` there).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
LUA_DIR = HERE / "lua"


class BuildPyWithLua(build_py):
    """Copy lua/*.lua (the single source of truth) into redlease/lua/."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "redlease" / "lua"
        target.mkdir(parents=True, exist_ok=True)
        for script in sorted(LUA_DIR.glob("*.lua")):
            shutil.copy2(script, target / script.name)


class OptionalBuildExt(build_ext):
    """Build the extension, but let the install succeed without it unless asked.

    ``REDLEASE_REQUIRE_NATIVE=1`` turns a failed build into a failed install.
    """

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # pragma: no cover - depends on the toolchain
            self._give_up(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # pragma: no cover - depends on the toolchain
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        if os.environ.get("REDLEASE_REQUIRE_NATIVE") == "1":
            raise exc
        sys.stderr.write(
            f"warning: redlease native engine not built ({exc}); "
            "the pure-Python engine will be used\n"
        )


def extensions() -> list[Extension]:
    native = HERE / "src" / "redlease" / "_engine" / "_native"
    pyx = native / "_core.pyx"
    if not pyx.exists():
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        if os.environ.get("REDLEASE_REQUIRE_NATIVE") == "1":
            raise
        return []
    # One extension: _core.pyx includes the .pxi files (one concern each).
    # Listing them as dependencies rebuilds the extension when one changes.
    included = sorted([*native.glob("*.pxi"), *native.glob("*.pxd")])
    ext = Extension(
        "redlease._engine._native._core",
        sources=[str(pyx.relative_to(HERE))],
        depends=[str(path.relative_to(HERE)) for path in included],
        extra_compile_args=["-O2", "-pthread"],
        extra_link_args=["-pthread"],
    )
    return list(
        cythonize(
            [ext],
            language_level=3,
            compiler_directives={"boundscheck": False, "wraparound": False},
        )
    )


setup(
    ext_modules=extensions(),
    cmdclass={"build_py": BuildPyWithLua, "build_ext": OptionalBuildExt},
)
