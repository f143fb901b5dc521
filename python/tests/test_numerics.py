"""Issue 33 in Python: a checkpoint whose output is NaN raises GenerationError (the command line's
message); temperatures below the greedy line are greedy and non-finite ones are refused (the
library's rule, as everywhere); text holding a NUL is refused naming the argument; a cancel
(Ctrl-C, a closed stream) reaches the engine between prompt chunks, not only at the next token."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest

import g4
from conftest import MODEL, PROMPT, run_cli


def overflowing_model(root: Path) -> Path:
    """The built-in model with its token embedding scale set to 3e38 (a finite float, so it loads;
    every hidden state is then NaN), the other files linked."""
    d = root / MODEL.name
    d.mkdir()
    for f in MODEL.iterdir():
        if f.name != "model.safetensors":
            os.symlink(f, d / f.name)
    b = bytearray((MODEL / "model.safetensors").read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    a, e = json.loads(b[8 : 8 + n])["model.language_model.embed_tokens.embedding_scale"]["data_offsets"]
    b[8 + n + a : 8 + n + e] = struct.pack("<f", 3e38) * ((e - a) // 4)
    (d / "model.safetensors").write_bytes(bytes(b))
    return d


def test_non_finite_output_raises_generation_error(tmp_path: Path) -> None:
    d = overflowing_model(tmp_path)
    p = run_cli("run", "-m", str(d), "--temp", "0", "-p", "hi", check=False)
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 1, p.stderr
    want = p.stderr.strip().split("error: ", 1)[1]
    assert "non-finite" in want
    with g4.Model(d) as m:
        for kw in ({"temperature": 0}, {"temperature": 1, "top_k": 5}, {"temperature": 0.8}):
            with pytest.raises(g4.GenerationError) as e:
                m.generate("hi", max_tokens=8, **kw)
            assert str(e.value) == want, kw
        with pytest.raises(g4.GenerationError, match="non-finite"):
            m.chat([("user", "hi")], temperature=1)
        with pytest.raises(g4.GenerationError, match="non-finite"):
            m.generate("hi", temperature=1, stream=True).result


def test_tiny_temperature_is_greedy(model: g4.Model, greedy) -> None:
    text, ids = greedy
    for t in (1e-40, 9e-6):
        c = model.complete(PROMPT, temperature=t)
        assert (c.text, c.tokens) == (text, ids), t


def test_non_finite_temperature_refused(model: g4.Model) -> None:
    for t, shown in ((float("inf"), "inf"), (float("nan"), "nan"), (1e39, "inf")):
        with pytest.raises(g4.GenerationError) as e:
            model.generate("hi", temperature=t)
        assert str(e.value) == f"temperature {shown}: expected a finite number >= 0 (below 1e-05: greedy)", t
    with pytest.raises(g4.GenerationError, match="repeat-penalty inf"):
        model.generate("hi", repeat_penalty=float("inf"))


def test_nul_refused(model: g4.Model) -> None:
    with pytest.raises(g4.InputError) as e:
        model.generate("What is 2+3?\0 and the rest")
    assert str(e.value) == "prompt: a NUL character (U+0000) at offset 12; g4 reads text up to a NUL, so it is refused"
    with pytest.raises(g4.InputError, match=r"^system: a NUL character"):
        model.generate("hi", system="be\0brief")
    with pytest.raises(g4.InputError, match=r"^message 1: content: a NUL character \(U\+0000\) at offset 0"):
        model.chat([("user", "hi"), ("user", "\0")])
    with pytest.raises(g4.InputError, match=r"^tools\[0\]: a NUL"):
        model.chat([("user", "hi")], tools=["declaration:add{\0}"])
    conv = model.conversation(temperature=0)
    try:
        with pytest.raises(g4.InputError, match="NUL"):
            conv.send("a\0b")
        assert conv.send("What is 2+3?").text == model.chat([("user", "What is 2+3?")], temperature=0).text  # nothing of it kept
    finally:
        conv.close()
    # the tokenizer takes lengths: a NUL is text like any other there
    assert model.detokenize(model.tokenize("a\0b", special=False)) == "a\0b"


class _CancelAfter(threading.Event):
    """A cancel event that reads as set from its n+1-th look on: counts how often the engine asks."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.looks = n, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks > self.n or super().is_set()


def test_cancel_between_prompt_chunks(model: g4.Model) -> None:
    """A cancel during a long prompt stops it between two chunks of 64 (Ctrl-C used to wait for the
    whole prefill: 8.7 s for 7k tokens): after 3 looks (3 chunks fed of the prompt's 6+), no token,
    finish_reason user, and the model answers the next call as before."""
    prompt = " ".join(["seven plus eight"] * 150)
    n_prompt = len(model.tokenize(prompt))
    assert n_prompt > 6 * 64
    job = model._generation(prompt, 4, 0.0, None, None, None, None, None, None, None, True, None, False)
    cancel = _CancelAfter(3)
    c = job(None, cancel)
    assert (c.finish_reason, c.tokens, cancel.looks) == ("user", [], 4), (c, cancel.looks)
    assert c.prompt_tokens == n_prompt
    assert model.generate("What is 2+3?", temperature=0).endswith("The final answer is 50")
