"""Build the native engine and ship the Lua scripts inside the package.

The extension is optional at install time: when it cannot be compiled the
package still installs and runs on the pure-Python engine. CI checks that the
build produced it (``engine="auto"`` must resolve to ``native`` there).

TLS in the native engine needs nothing at build time: the extension does not
link OpenSSL, and includes none of its headers. At import it finds the
OpenSSL that Python's own ssl module has loaded and calls it through a table
of function pointers (``_native/rl_tls.h`` says why), so every build, in
place, from the sdist or as a wheel, is the same build.
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


SANITIZERS = ("address", "undefined")


def sanitizers() -> str:
    """``REDLEASE_SANITIZE`` (e.g. ``address,undefined``): build the extension with them.

    For tests only: an AddressSanitizer build must be loaded with the
    sanitizer's runtime preloaded (``LD_PRELOAD``), as Python itself is not
    built with it (see docs/contributing.md).
    """
    asked = [name.strip() for name in os.environ.get("REDLEASE_SANITIZE", "").split(",")]
    asked = [name for name in asked if name]
    unknown = [name for name in asked if name not in SANITIZERS]
    if unknown:
        raise SystemExit(
            f"REDLEASE_SANITIZE names {', '.join(unknown)}: it takes any of {', '.join(SANITIZERS)}"
        )
    return ",".join(asked)


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
    # One extension: _core.pyx includes the .pxi files (one concern each), and
    # _core.pxd, which Cython finds beside it, their .pxd declarations.
    # Listing them as dependencies rebuilds the extension when one changes.
    included = sorted([*native.rglob("*.pxi"), *native.rglob("*.pxd"), *native.rglob("*.h")])
    compile_args, link_args = ["-O2", "-pthread"], ["-pthread"]
    sanitize = sanitizers()
    if sanitize:
        # Every report is fatal: a test run under them fails on the first.
        flags = [f"-fsanitize={sanitize}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
        compile_args = ["-O1", "-g", "-pthread", *flags]
        link_args = ["-pthread", *flags]
    ext = Extension(
        "redlease._engine._native._core",
        sources=[str(pyx.relative_to(HERE))],
        depends=[str(path.relative_to(HERE)) for path in included],
        include_dirs=[str(native.relative_to(HERE))],
        # dlopen/dlsym find the ssl module's OpenSSL (libdl: glibc before 2.34).
        libraries=["dl"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    # The core's test hooks (its encoder, parser, reply reading, a plain
    # command), a module of their own that no engine imports: it reaches the
    # core's C functions through what _core.pxd declares (cimport), and the
    # core carries nothing for it.
    probe = Extension(
        "redlease._engine._native._probe",
        sources=[str((native / "_probe.pyx").relative_to(HERE))],
        depends=[str(path.relative_to(HERE)) for path in included],
        include_dirs=[str(native.relative_to(HERE))],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    # The asyncio writer's Python source, compiled as it is, with
    # aiowriter.pxd making its class an extension type: one definition, which
    # runs uncompiled where no extension is built.
    writer = Extension(
        "redlease._engine.contract.aiowriter",
        sources=["src/redlease/_engine/contract/aiowriter.py"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    return [
        *cythonize(
            [ext, probe],
            # Where ``cimport redlease._engine._native._core`` finds _core.pxd.
            include_path=["src"],
            language_level=3,
            compiler_directives={"boundscheck": False, "wraparound": False},
        ),
        # Annotations stay hints: a ``float`` parameter takes an int, as in Python.
        *cythonize(
            [writer],
            language_level=3,
            compiler_directives={"annotation_typing": False, "binding": True},
        ),
    ]


# The license as the core metadata's License field, not as a License-Expression
# (pyproject's ``license = "MIT"``): Metadata 2.4 lets a package carry one of the
# two, never both, and older pips' ``pip show`` reads only License (pip 23.2
# printed an empty "License:" for a License-Expression); newer pips print
# License wherever no License-Expression is set.
setup(
    license="MIT",
    ext_modules=extensions(),
    cmdclass={"build_py": BuildPyWithLua, "build_ext": OptionalBuildExt},
)
