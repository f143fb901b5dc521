"""Builds the g4 package: libg4 from the source tree this folder is part of (make), or an installed
one found through pkg-config.

G4_LIB chooses: "source" builds ../build/release/libg4.so with make and puts a copy into the package;
"pkg-config" records where `pkg-config g4` says the installed library is (nothing is copied); unset
or "auto", the source tree when this folder is in one, else pkg-config. G4_MAKE_JOBS sets make's
-j (default: the number of CPUs).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the g4.h version the package mirrors (g4/_version.py)
API_VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "g4" / "_version.py").read_text()).group(1)


def fail(msg):
    sys.exit("g4: " + msg)


def in_source_tree():
    return (ROOT / "include" / "g4.h").is_file() and (ROOT / "Makefile").is_file() and (ROOT / "sources.mk").is_file()


def build_from_source():
    """make the shared library in the tree; returns its path."""
    env = dict(os.environ)
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # a make above us (make python-test) passes its jobserver
        env.pop(k, None)
    jobs = os.environ.get("G4_MAKE_JOBS") or str(os.cpu_count() or 1)
    cmd = ["make", "-C", str(ROOT), "-j" + jobs, "BUILD=release", "build/release/libg4.so"]
    print("g4: " + " ".join(cmd), flush=True)
    try:
        subprocess.run(cmd, check=True, env=env)
    except (OSError, subprocess.CalledProcessError) as e:
        fail(f"building libg4 failed ({e}); the build needs gcc, make, libcjson-dev, libpcre2-dev, libpng-dev and libjpeg62-turbo-dev "
             "(scripts/install-deps.sh), or install libg4 (make install) and set G4_LIB=pkg-config")
    return ROOT / "build" / "release" / "libg4.so"


def find_with_pkg_config():
    """The installed library's folder, through pkg-config; checks its version."""
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "g4"], check=True, capture_output=True, text=True).stdout.strip()
        ver = subprocess.run(["pkg-config", "--modversion", "g4"], check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", "") or str(e)
        fail(f"pkg-config cannot find g4 ({err.strip()}): install libg4 (make install PREFIX=...) and set "
             "PKG_CONFIG_PATH to its lib/pkgconfig, or build this package inside the g4 source tree")
    if ver != API_VERSION:
        fail(f"pkg-config finds g4 {ver} in {libdir}, this package is for {API_VERSION}")
    if not (Path(libdir) / "libg4.so.0").exists():
        fail(f"pkg-config says g4 is in {libdir}, which has no libg4.so.0")
    return libdir


class BuildPy(build_py):
    def run(self):
        super().run()
        mode = os.environ.get("G4_LIB", "auto")
        if mode == "auto":
            mode = "source" if in_source_tree() else "pkg-config"
        if mode not in ("source", "pkg-config"):
            fail(f"G4_LIB={mode}: expected source, pkg-config or auto")
        out = Path(self.build_lib) / "g4"
        out.mkdir(parents=True, exist_ok=True)
        bundled = out / "libg4.so.0"
        if bundled.exists():
            bundled.unlink()  # left by an earlier build in the same folder
        libdir = None
        if mode == "source":
            if not in_source_tree():
                fail(f"G4_LIB=source, but {ROOT} is not the g4 source tree")
            shutil.copy2(build_from_source(), bundled)
        else:
            libdir = find_with_pkg_config()
        (out / "_build_config.py").write_text(
            '"""Written by setup.py: where the package\'s libg4 is (LIBDIR None: the copy beside this file)."""\n'
            f"LIBDIR = {libdir!r}\n"
        )


class BinaryDistribution(Distribution):
    """The wheel holds a shared library (or a machine's path to one): not a pure-Python wheel."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
