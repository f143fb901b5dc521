"""Shared fixtures: the source tree, the built-in model, the g4 command line to compare with.

G4_SOURCE (default: two folders up) is the g4 source tree, G4_BIN (default: its
build/release/g4) the command line the answers are compared with. G4_EXPECT_PACKAGE, when set
(python/run-tests.sh sets it to the venv), is a folder the imported g4 package must be under: the
tests then run against the installed package, not the source folder."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

import g4

ROOT = Path(os.environ.get("G4_SOURCE") or Path(__file__).resolve().parents[2])
BIN = os.environ.get("G4_BIN") or str(ROOT / "build" / "release" / "g4")
MODEL = ROOT / "models" / "gemma4-tiny-math"
PROMPT = (MODEL / "example_prompt.txt").read_text()


def run_cli(*args: str, stdin: str = "", check: bool = True) -> subprocess.CompletedProcess:
    """`g4 ARGS`, its output captured as text."""
    p = subprocess.run([BIN, *args], input=stdin, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"g4 {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p


def cli_answer(*args: str, stdin: str = "") -> str:
    """What `g4 run ARGS` prints, less the newline it ends with."""
    out = run_cli("run", "-m", str(MODEL), *args, stdin=stdin).stdout
    assert out.endswith("\n"), repr(out)
    return out[:-1]


def cli_generated_ids(*args: str) -> List[int]:
    """The token ids `g4 run --verbose ARGS` generated."""
    err = run_cli("run", "-m", str(MODEL), "--verbose", *args).stderr
    lines = [l for l in err.splitlines() if l.startswith("g4: generated ids:")]
    assert len(lines) == 1, err
    return [int(x) for x in lines[0].split(":", 2)[2].split()]


def questions(n: int, bare: bool = False) -> List[str]:
    """The first n word problems of the model's test set, in the prompt form it was trained on
    (bare: the problem alone, on one line)."""
    head = "" if bare else PROMPT[: PROMPT.index("Problem: ") + len("Problem: ")]
    out = []
    with open(MODEL / "test.jsonl") as f:
        for line in f:
            out.append(head + json.loads(line)["question"])
            if len(out) == n:
                break
    return out


@pytest.fixture(scope="session")
def model() -> g4.Model:
    m = g4.Model(MODEL)
    yield m
    m.close()


@pytest.fixture(scope="session")
def greedy(model: g4.Model) -> Tuple[str, List[int]]:
    """The greedy answer to the example prompt and its token ids, from the command line."""
    return cli_answer("--temp", "0", "-f", str(MODEL / "example_prompt.txt")), cli_generated_ids(
        "--temp", "0", "-f", str(MODEL / "example_prompt.txt")
    )
