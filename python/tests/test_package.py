"""The package as installed: which library it loaded, its version, the options table, the
structs' layouts against g4.h (a C program compiled here prints them), the engine's warnings."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

import g4
from g4 import _capi
from conftest import BIN, MODEL, ROOT, cli_answer, run_cli


def under(path: str, folder: str) -> bool:
    a, b = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([a, b]) == b


def test_the_package_under_test() -> None:
    """With run-tests.sh: the venv's package and the library it brings, not the source folder's."""
    want = os.environ.get("G4_EXPECT_PACKAGE")
    if want:
        assert under(g4.__file__, want), g4.__file__
        assert under(g4.library_path, want), g4.library_path
    assert os.access(BIN, os.X_OK), f"{BIN}: no g4 command line (make, or set G4_BIN)"


def test_versions() -> None:
    header = (ROOT / "include" / "g4.h").read_text()
    want = re.search(r'#define G4_VERSION "([^"]+)"', header).group(1)
    assert g4.version == want  # the library's g4_version()
    assert g4.__version__ == want  # the g4.h the package mirrors
    assert run_cli("--version").stdout.strip() == f"g4 {want}"


def test_struct_layouts(tmp_path: Path) -> None:
    """Every struct _capi mirrors has g4.h's size and field offsets."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler"
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "g4.h"', "int main(void) {"]
    want = []
    for cname, st in _capi.STRUCTS.items():
        lines.append(f'    printf("{cname} %zu\\n", sizeof({cname}));')
        want.append(f"{cname} {ctypes.sizeof(st)}")
        for fname, *_ in st._fields_:
            lines.append(f'    printf("{cname}.{fname} %zu\\n", offsetof({cname}, {fname}));')
            want.append(f"{cname}.{fname} {getattr(st, fname).offset}")
    lines += ["    return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", str(ROOT / "include"), "-o", str(tmp_path / "layout"), str(src)], check=True)
    got = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout.split("\n")[:-1]
    assert got == want


def test_options_table_is_the_command_lines() -> None:
    """g4.options() are the engine options `g4 help` lists, with the same flags."""
    p = run_cli("help")
    help_text = p.stdout + p.stderr
    flags = re.findall(r"^  (?:-\w, )?(--[a-z0-9-]+) ", help_text[help_text.index("engine options (") :], re.M)
    rows = g4.options()
    assert [r.flag for r in rows] == flags
    act = next(r for r in rows if r.name == "act")
    assert act.values == "float|fake|int" and act.default == "int" and act.kind == "result"
    assert next(r for r in rows if r.name == "threads").kind == "run"


def test_engine_options_as_keywords() -> None:
    with g4.Model(MODEL, act="fake", kv="f32", linear_quant=True, pmp_scales=(0.04, 0.0025), ctx=512, weights="mapped") as m:
        o = m.options
        assert (o["act"], o["kv"], o["linear_quant"], o["pmp_scales"], o["ctx"], o["weights"]) == (
            "fake",
            "f32",
            "on",
            "0.04,0.0025",
            "512",
            "mapped",
        )
        assert o["qdiv"] == "div"  # resolved: fake mode divides
        assert m.ctx == 512 and not m.weights_resident
        # and they are what the command line computes with the same flags
        q = "What is 12+30?"
        assert m.generate(q, temperature=0) == cli_answer(
            "--act", "fake", "--kv", "f32", "--pmp-scales", "0.04,0.0025", "--ctx", "512", "--temp", "0", "-p", q
        )


def test_model_facts(model: g4.Model) -> None:
    assert model.vocab_size == 768
    assert model.stop_ids == (1, 6)  # generation_config.json's eos_token_id
    assert model.bos_id == 2
    assert model.chat_form == "e2b"
    assert model.is_special(2) and not model.is_special(model.tokenize("7")[0])
    assert "gemma4-tiny-math" in repr(model)


def test_engine_warnings_are_python_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """g4_set_log's warnings reach Python's warnings machinery as g4.G4Warning, in the calling thread."""
    monkeypatch.setenv("G4_TOKENIZER_CACHE", "sometimes")
    with pytest.warns(g4.G4Warning, match=r"G4_TOKENIZER_CACHE=sometimes: expected on or off"):
        g4.Model(MODEL).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", g4.G4Warning)
        with pytest.raises(g4.G4Warning):
            g4.Model(MODEL)


def test_threads_setting() -> None:
    before = g4.threads()
    try:
        g4.set_threads(1)
        assert g4.threads() == 1
        with g4.Model(MODEL, threads=2):
            assert g4.threads() == 2
    finally:
        g4.set_threads(before)
    assert g4.threads() == before
