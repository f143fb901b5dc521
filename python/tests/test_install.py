"""pip install ./python against an installed libg4 (make install), found through pkg-config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import MODEL, PROMPT, ROOT


def test_pip_install_with_pkg_config(tmp_path: Path, greedy) -> None:
    text, _ = greedy
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "G4_LIBRARY")}
    prefix = tmp_path / "prefix"
    subprocess.run(["make", "-C", str(ROOT), "--no-print-directory", "install", f"PREFIX={prefix}"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    base = getattr(sys, "_base_executable", sys.executable)
    venv = tmp_path / "venv"
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    env.update(G4_LIB="pkg-config", PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT / "python")], env=env, check=True)
    env.pop("PKG_CONFIG_PATH")
    script = (
        "import sys, g4\n"
        "print(g4.library_path)\n"
        "m = g4.Model(sys.argv[1])\n"
        "sys.stdout.write(m.generate(open(sys.argv[2]).read(), temperature=0))\n"
    )
    p = subprocess.run([py, "-c", script, str(MODEL), str(MODEL / "example_prompt.txt")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, check=True)
    lib, out = p.stdout.split("\n", 1)
    assert lib == str(prefix / "lib" / "libg4.so.0")
    assert out == text
    # nothing of the library was copied into the package
    pkg = subprocess.run([py, "-c", "import g4, os; print(os.path.dirname(g4.__file__))"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert not any(f.startswith("libg4") for f in os.listdir(pkg)), os.listdir(pkg)


def test_pkg_config_missing_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(G4_LIB="pkg-config", PKG_CONFIG_PATH=str(tmp_path), PKG_CONFIG_LIBDIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(tmp_path / "t"), "-q",
                        "--disable-pip-version-check", str(ROOT / "python")], env=env, capture_output=True, text=True)
    assert p.returncode != 0
    assert "g4: pkg-config cannot find g4" in p.stdout + p.stderr
