"""Errors: g4's one-line messages as g4.Error subclasses, the same as the command line's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import g4
from conftest import MODEL, PROMPT, run_cli


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg, repr(msg)
    return msg


def cli_error(*args: str, prompt=("-p", "hi")) -> str:
    """The message of `g4 run ARGS PROMPT`'s error line, less its "g4...: error: " prefix."""
    p = run_cli("run", *args, *prompt, check=False)
    assert p.returncode != 0
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0].split("error: ", 1)[1]


def test_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(g4.LoadError) as e:
        g4.Model(missing)
    assert one_line(e) == cli_error("-m", str(missing))
    assert str(missing) in str(e.value)
    assert isinstance(e.value, g4.Error)


def test_folder_without_tokenizer(tmp_path: Path) -> None:
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(MODEL / f, tmp_path / f)
    with pytest.raises(g4.LoadError) as e:
        g4.Model(tmp_path)
    assert "tokenizer.json" in one_line(e)


def test_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(g4.LoadError) as e:
        g4.Model(tmp_path)
    one_line(e)


@pytest.mark.parametrize(
    "kw, flag, names",
    [
        (dict(act="fast"), ("--act", "fast"), "act fast: expected one of float fake int"),
        (dict(kv="int4"), ("--kv", "int4"), "kv int4: expected one of f32 int8"),
        (dict(ctx=0), ("--ctx", "0"), "ctx 0: expected an integer in [1, 1048576]"),
        (dict(threads=0), ("--threads", "0"), "threads 0: expected an integer in [1, 256] or auto"),
        (dict(pmp_scales=(0.1,)), ("--pmp-scales", "0.1"), "pmp_scales 0.1:"),
        (dict(linear_quant=3), ("--linear-quant", "3"), "linear_quant 3: expected one of off on"),
    ],
)
def test_bad_engine_option(kw: dict, flag: tuple, names: str) -> None:
    with pytest.raises(g4.OptionError) as e:
        g4.Model(MODEL, **kw)
    msg = one_line(e)
    assert msg.startswith(names), msg
    assert isinstance(e.value, ValueError)
    # the command line's message, where the option is named by its flag
    name, rest = msg.split(" ", 1)
    assert cli_error(*flag) == "--" + name.replace("_", "-") + " " + rest


def test_unknown_engine_option() -> None:
    with pytest.raises(g4.OptionError) as e:
        g4.Model(MODEL, fast_mode="on")
    assert one_line(e) == "unknown option fast_mode"


def test_bad_generation_settings(model: g4.Model) -> None:
    for kw, what in [
        (dict(max_tokens=0), "max_tokens 0"),
        (dict(max_tokens="8"), "max_tokens '8'"),
        (dict(seed=-1), "seed -1"),
        (dict(top_k=1.5), "top_k 1.5"),
        (dict(temperature="hot"), "temperature 'hot'"),
        (dict(stop=[1]), "stop"),
    ]:
        with pytest.raises(g4.OptionError) as e:
            model.generate("hi", **kw)
        assert one_line(e).startswith(what), (kw, str(e.value))
    with pytest.raises(g4.OptionError) as e:
        model.generate("hi", raw=True, system="You add.")
    assert one_line(e) == "system: a raw prompt has no chat template to put it in"
    with pytest.raises(g4.OptionError):
        model.generate([2, 5], thinking=True)
    with pytest.raises(g4.GenerationError) as e:
        model.generate("hi", temperature=-1)
    assert one_line(e).startswith("temperature -1: expected a finite number >= 0")
    with pytest.raises(g4.GenerationError):
        model.generate("hi", top_p=0.0)
    assert model.generate("What is 2+3?", temperature=0).endswith("The final answer is 50")  # still fine after


def test_prompt_too_long() -> None:
    with g4.Model(MODEL, ctx=32) as m:
        with pytest.raises(g4.ContextError) as e:
            m.generate(PROMPT)
        assert one_line(e) == cli_error("--ctx", "32", prompt=("-f", str(MODEL / "example_prompt.txt")))
        assert one_line(e) == "prompt of 71 tokens does not fit the context: 32 of 32 tokens left (--ctx)"
        with pytest.raises(g4.ContextError):
            m.chat([("user", PROMPT)])
        assert m.generate("What is 2+3?", temperature=0, max_tokens=4)  # the model is fine after


def test_bad_inputs(model: g4.Model) -> None:
    with pytest.raises(g4.InputError) as e:
        model.detokenize([5, 100000])
    assert "100000" in one_line(e)
    with pytest.raises(g4.InputError):
        model.generate([5, -3])
    with pytest.raises(g4.InputError):
        model.generate([1 << 40])
    with pytest.raises(g4.InputError) as e:
        model.generate("", raw=True)
    assert one_line(e) == "empty prompt"
    with pytest.raises(g4.InputError) as e:
        model.chat([{"role": "narrator", "content": "once"}])
    assert '"narrator"' in one_line(e)
    with pytest.raises(g4.InputError):
        model.chat([])
    with pytest.raises(g4.InputError):
        model.chat([{"role": "user", "content": 5}])
    with pytest.raises(g4.InputError):
        model.chat([("user", "hi")], tools=[{"name": "add"}])
    with pytest.raises(g4.InputError) as e:
        model.chat([("user", "hi"), {"role": "assistant", "content": None, "tool_calls": [{"name": "add"}]}, ("tool", "5")])
    assert "ChatReply.message" in one_line(e)


def test_closed_model() -> None:
    m = g4.Model(MODEL)
    m.close()
    m.close()  # twice is fine
    with pytest.raises(g4.Error) as e:
        m.generate("hi")
    assert "closed" in one_line(e)
    with pytest.raises(g4.Error):
        m.tokenize("hi")


def test_close_while_in_use() -> None:
    """close() defers freeing to the end of what is running: an open conversation goes on."""
    m = g4.Model(MODEL)
    c = m.conversation(temperature=0)
    m.close()
    with pytest.raises(g4.Error):
        m.generate("hi")
    assert c.send("What is 2+3?").content.endswith("The final answer is 50")
    assert m._m is not None  # still held by the conversation
    c.close()
    assert m._m is None
    with pytest.raises(g4.Error) as e:
        c.send("again")
    assert "closed" in one_line(e)
