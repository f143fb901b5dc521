"""generate(): the command line's answers (g4 run), streamed and not, stop strings, budgets,
raw prompts and token ids, sampling settings."""

from __future__ import annotations

import pytest

import g4
from conftest import MODEL, PROMPT, cli_answer, cli_generated_ids, questions

PROMPT_FILE = str(MODEL / "example_prompt.txt")


def test_greedy_is_g4_run(model: g4.Model, greedy) -> None:
    text, ids = greedy
    assert text.endswith("The final answer is 890")
    assert model.generate(PROMPT, temperature=0) == text
    c = model.complete(PROMPT, temperature=0)
    assert (c.text, c.tokens, c.finish_reason) == (text, ids, "eos")
    assert c.tokens[-1] in model.stop_ids
    assert c.prompt_tokens == len(model.tokenize("<bos><|turn>user\n" + PROMPT.strip() + "<turn|>\n<|turn>model\n"))
    assert c.prefill_s > 0 and c.decode_s > 0


@pytest.mark.parametrize("i", range(4))
def test_more_questions_are_g4_run(model: g4.Model, i: int) -> None:
    q = questions(4)[i]
    assert model.generate(q, temperature=0) == cli_answer("--temp", "0", "-p", q)


def test_stream_concatenates_to_the_text(model: g4.Model, greedy) -> None:
    text, ids = greedy
    with model.generate(PROMPT, temperature=0, stream=True) as s:
        deltas = list(s)
    assert all(isinstance(d, str) and d for d in deltas)
    assert len(deltas) >= len(ids) - 1  # about one per token (the stop id adds none)
    assert "".join(deltas) == text
    assert s.result.text == text and s.result.tokens == ids and s.result.finish_reason == "eos"


def test_sampling_is_g4_runs(model: g4.Model) -> None:
    q = questions(1)[0]
    for args, kw in [
        (("--temp", "0.8", "--seed", "7"), dict(temperature=0.8, seed=7)),
        (("--temp", "1.2", "--seed", "3", "--top-k", "5", "--top-p", "0.9"), dict(temperature=1.2, seed=3, top_k=5, top_p=0.9)),
        (("--temp", "0.7", "--seed", "11", "--min-p", "0.1", "--repeat-penalty", "1.3", "--repeat-last-n", "16"),
         dict(temperature=0.7, seed=11, min_p=0.1, repeat_penalty=1.3, repeat_last_n=16)),
    ]:
        assert model.generate(q, **kw) == cli_answer(*args, "-p", q), kw
    # the model's own sampling (generation_config.json: temperature 1, top-k 64, top-p 0.95) when none is given
    assert model.generate(q, seed=5) == cli_answer("--seed", "5", "-p", q)
    texts = {model.generate(q, temperature=1.5, seed=s) for s in range(6)}
    assert len(texts) > 1  # the seed reaches the sampler


def test_openai_penalties_and_bias_are_g4_runs(model: g4.Model) -> None:
    q = questions(2)[1]
    seven = model.tokenize("7")[-1]
    for args, kw in [
        (("--temp", "0", "--frequency-penalty", "1.5"), dict(temperature=0, frequency_penalty=1.5)),
        (("--temp", "0.9", "--seed", "4", "--presence-penalty", "-1", "--logit-bias", "%d=3" % seven),
         dict(temperature=0.9, seed=4, presence_penalty=-1, logit_bias={seven: 3})),
    ]:
        assert model.generate(q, **kw) == cli_answer(*args, "-p", q), kw
    assert model.generate(q, temperature=0, max_tokens=4, logit_bias={seven: 100}) == "7777"  # +100 forces a token
    for bad in (dict(frequency_penalty=2.5), dict(presence_penalty=float("nan")), dict(logit_bias={seven: -101}), dict(logit_bias=[seven])):
        with pytest.raises(g4.OptionError):
            model.generate(q, **bad)


def test_budget(model: g4.Model, greedy) -> None:
    text, ids = greedy
    c = model.complete(PROMPT, temperature=0, max_tokens=5)
    assert c.finish_reason == "budget" and c.tokens == ids[:5]
    assert c.text == cli_answer("--temp", "0", "-n", "5", "-f", PROMPT_FILE)
    assert text.startswith(c.text)


def test_context_full(greedy) -> None:
    text, ids = greedy
    with g4.Model(MODEL, ctx=80) as m:
        c = m.complete(PROMPT, temperature=0)
    assert c.finish_reason == "context" and c.prompt_tokens + len(c.tokens) == 80 + 1
    assert c.tokens == ids[: len(c.tokens)]


@pytest.mark.parametrize("stop", ["+", "=890", "890.\n#", "\nThe final", "no such text"])
def test_stop_strings(model: g4.Model, greedy, stop: str) -> None:
    text, ids = greedy
    want = text[: text.index(stop)] if stop in text else text
    c = model.complete(PROMPT, temperature=0, stop=[stop, "not this either"])
    assert c.text == want
    assert c.finish_reason == ("stop" if stop in text else "eos")
    with model.generate(PROMPT, temperature=0, stop=stop, stream=True) as s:
        assert "".join(s) == want
    assert s.result.finish_reason == c.finish_reason and s.result.tokens == c.tokens
    if stop in text:  # generation stopped at the token that completed the stop string
        assert len(c.tokens) < len(ids) and c.tokens == ids[: len(c.tokens)]


def test_stream_closed_early(model: g4.Model, greedy) -> None:
    text, ids = greedy
    s = model.generate(PROMPT, temperature=0, stream=True)
    first = [next(s), next(s), next(s)]
    s.close()
    r = s.result
    assert r.finish_reason == "user"
    assert len(r.tokens) < len(ids) and r.tokens == ids[: len(r.tokens)]
    assert text.startswith("".join(first)) and text.startswith(r.text) and r.text.startswith("".join(first))
    # the model goes on as before
    assert model.generate(PROMPT, temperature=0) == text


def test_raw_prompts_and_token_ids(model: g4.Model) -> None:
    chat = "<bos><|turn>user\nWhat is 3+4?<turn|>\n<|turn>model\n"
    want = cli_answer("--raw", "--temp", "0", "-p", chat)
    assert model.generate(chat, raw=True, temperature=0) == want
    assert model.generate(model.tokenize(chat), temperature=0) == want
    # the same question through the template
    assert model.generate("What is 3+4?", temperature=0) == want
    # raw text that is no chat prompt: the model continues it
    assert model.generate("149*2=", raw=True, temperature=0, max_tokens=8) == cli_answer(
        "--raw", "--temp", "0", "-n", "8", "-p", "149*2="
    )


def test_system_message(model: g4.Model) -> None:
    q = "What is 5+6?"
    assert model.generate(q, system="You add.", temperature=0) == cli_answer("--system", "You add.", "--temp", "0", "-p", q)


def test_thinking_prompt(model: g4.Model) -> None:
    q = "What is 5+6?"
    assert model.generate(q, thinking=True, temperature=0) == cli_answer("--think", "on", "--temp", "0", "-p", q)


def test_tokenizer_is_g4_tokenize(model: g4.Model) -> None:
    import json

    from conftest import run_cli

    texts = ["Lily has 149 coins.", "<bos><|turn>user\nhi<turn|>", "naïve café ☕ 😀", "  spaces\n\ttabs  ", ""]
    out = run_cli("tokenize", "-m", str(MODEL), stdin="".join(json.dumps(t) + "\n" for t in texts)).stdout.splitlines()
    assert [model.tokenize(t) for t in texts] == [json.loads(l) for l in out]
    plain = run_cli("tokenize", "-m", str(MODEL), "--plain", stdin=json.dumps(texts[1]) + "\n").stdout
    assert model.tokenize(texts[1], special=False) == json.loads(plain)
    assert model.tokenize(texts[1], special=False) != model.tokenize(texts[1])
    for t in texts:
        assert model.detokenize(model.tokenize(t)) == t
    assert model.tokenize(texts[2].encode()) == model.tokenize(texts[2])
    # invalid UTF-8 never fails: byte tokens, decoded back as U+FFFD
    assert model.detokenize(model.tokenize(b"a\xffb")) == "a\ufffdb"


def test_exception_in_the_middle_of_a_generation(model: g4.Model, greedy) -> None:
    """A signal handler's exception (Ctrl-C's KeyboardInterrupt) raised while the engine calls back
    stops the generation and comes out of generate(), not swallowed by the callback."""
    import signal

    text, _ = greedy

    class Alarm(Exception):
        pass

    def on_alarm(signum, frame):
        raise Alarm()

    old = signal.signal(signal.SIGALRM, on_alarm)
    raised = 0
    try:
        for _ in range(20):
            signal.setitimer(signal.ITIMER_REAL, 0.004)
            try:
                model.generate(PROMPT, temperature=0)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except Alarm:
                raised += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert raised > 0
    assert model.generate(PROMPT, temperature=0) == text


DRAFT = MODEL.parent / "gemma4-tiny-math-drafter"


def test_draft_gives_the_same_greedy_text(greedy) -> None:
    """Model(path, draft=DIR): speculative decoding with the trained MTP drafter, greedy, is the
    text of plain greedy decoding, for several questions and draft lengths; chat too."""
    text, ids = greedy
    with g4.Model(MODEL, draft=DRAFT) as m:
        assert m.generate(PROMPT, temperature=0) == text
        c = m.complete(PROMPT, temperature=0)
        assert (c.text, c.tokens) == (text, ids)
        for q in questions(3):
            assert m.generate(q, temperature=0) == cli_answer("--temp", "0", "-p", q)
    with g4.Model(MODEL, draft=DRAFT, draft_tokens=7) as m:
        assert m.generate(PROMPT, temperature=0) == text
        assert m.chat([{"role": "user", "content": PROMPT}], temperature=0).text == text


def test_draft_errors(tmp_path) -> None:
    with pytest.raises(g4.LoadError, match="not gemma4_assistant"):
        g4.Model(MODEL, draft=MODEL)
    with pytest.raises(g4.LoadError, match="nonexistent"):
        g4.Model(MODEL, draft=tmp_path / "nonexistent")
    with pytest.raises(g4.OptionError, match="draft_tokens 0: expected an integer in"):
        g4.Model(MODEL, draft=DRAFT, draft_tokens=0)
    with pytest.raises(g4.OptionError, match="draft_tokens needs draft"):
        g4.Model(MODEL, draft_tokens=3)
    with pytest.raises(g4.LoadError, match="gemma4_assistant is a drafter"):
        g4.Model(DRAFT)


def test_reply_reader_through_capi(model: g4.Model) -> None:
    """The library's reply reader bound in _capi, on a worked example: "END" split across three
    byte tokens is held back (nothing of it released), then cut; the finish says stop."""
    import ctypes

    from g4 import _capi as C

    stops = (ctypes.c_char_p * 1)(b"END")
    opts = C.ReplyOptions(stop=ctypes.cast(stops, ctypes.POINTER(ctypes.c_char_p)), n_stop=1, calls=C.CALLS_TEXT)
    tok = model._tokenizer()
    r = C.lib.g4_reply_new(tok, ctypes.byref(opts))
    assert r, C.last_error()
    try:
        got = []
        for ch in "aENDb":
            d = C.ReplyDelta()
            rc = C.lib.g4_reply_push_token(r, C.lib.g4_tokenizer_piece_to_id(tok, b"<0x%02X>" % ord(ch)), ctypes.byref(d))
            answer = "".join(C.text(d.spans[i].text, d.spans[i].len) for i in range(d.n_spans))
            got.append((rc, C.text(d.text, d.len), answer, d.stop_string))
        assert got == [(0, "a", "a", -1), (0, "E", "", -1), (0, "N", "", -1), (1, "D", "", 0), (1, "", "", 0)]
        d = C.ReplyDelta()
        assert C.lib.g4_reply_finish(r, C.STOP_USER, ctypes.byref(d)) == 0
        assert (d.finish, d.stop_string, d.n_spans) == (C.FINISH_STOP, 0, 0)
    finally:
        C.lib.g4_reply_free(r)
