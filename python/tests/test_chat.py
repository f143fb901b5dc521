"""chat() and conversation(): the answers of g4 run / g4 chat for the same messages, KV-continued
turns equal to the history rendered anew, streaming, thinking and tool declarations, and the
reply parser's parts."""

from __future__ import annotations

import g4
from conftest import MODEL, PROMPT, cli_answer, questions, run_cli

GREEDY = dict(temperature=0)


def g4_chat(*lines: str, args=()) -> str:
    """What `g4 chat` prints for these lines on its standard input (one answer and a newline each)."""
    return run_cli("chat", "-m", str(MODEL), "--temp", "0", *args, stdin="".join(l + "\n" for l in lines)).stdout


def test_chat_is_g4_run(model: g4.Model, greedy) -> None:
    text, ids = greedy
    r = model.chat([{"role": "user", "content": PROMPT}], **GREEDY)
    assert (r.content, r.reasoning, r.tool_calls, r.finish_reason) == (text, "", [], "eos")
    assert r.text == text and r.tokens == ids
    assert r.message == {"role": "assistant", "content": text}
    # a (role, content) pair is a message too
    assert model.chat([("user", PROMPT)], **GREEDY).content == text


def test_chat_is_g4_chat(model: g4.Model) -> None:
    q = questions(1, bare=True)[0]
    assert model.chat([{"role": "user", "content": q}], **GREEDY).content + "\n" == g4_chat(q)


def test_conversation_is_g4_chat(model: g4.Model) -> None:
    """Turns that keep the KV cache give what `g4 chat` prints for the same lines."""
    lines = ["What is 2+3?", "And 4+4?", questions(2, bare=True)[1]]
    with model.conversation(**GREEDY) as c:
        replies = [c.send(l) for l in lines]
        assert [m["role"] for m in c.messages] == ["user", "assistant"] * 3
        assert [m["content"] for m in c.messages[1::2]] == [r.content for r in replies]
        # the KV cache holds the whole conversation: its tokens are the history's
        toks = c.tokens
        assert model.detokenize(toks).startswith("<bos><|turn>user\nWhat is 2+3?<turn|>\n<|turn>model\n")
    assert "".join(r.content + "\n" for r in replies) == g4_chat(*lines)


def test_conversation_continued_equals_history_anew(model: g4.Model) -> None:
    """chat() with the whole history (the replies as ChatReply.message) answers as the continued conversation."""
    lines = ["What is 2+3?", "And 4+4?"]
    with model.conversation(**GREEDY) as c:
        r1, r2 = c.send(lines[0]), c.send(lines[1])
    msgs = [{"role": "user", "content": lines[0]}, r1.message, {"role": "user", "content": lines[1]}]
    again = model.chat(msgs, **GREEDY)
    assert again.content == r2.content and again.tokens == r2.tokens


def test_conversation_system_and_reset(model: g4.Model) -> None:
    q = "What is 5+6?"
    want = cli_answer("--system", "You add.", "--temp", "0", "-p", q)
    with model.conversation(system="You add.", **GREEDY) as c:
        assert c.send(q).content == want
        c.reset()
        assert c.messages == [] and c.tokens == []
        assert c.send(q).content == want  # the system message comes first again
        assert c.messages[0] == {"role": "system", "content": "You add."}
    assert model.chat([{"role": "system", "content": "You add."}, {"role": "user", "content": q}], **GREEDY).content == want


def test_chat_stream(model: g4.Model, greedy) -> None:
    text, ids = greedy
    with model.chat([{"role": "user", "content": PROMPT}], stream=True, **GREEDY) as s:
        deltas = list(s)
    assert all(isinstance(d, g4.ChatDelta) for d in deltas)
    assert "".join(d.content for d in deltas) == text
    assert all(d.reasoning == "" and d.tool_call == "" for d in deltas)
    assert s.result.content == text and s.result.tokens == ids
    with model.conversation(**GREEDY) as c:
        c.add("user", PROMPT)
        st = c.reply(stream=True)
        assert "".join(d.content for d in st) == text and st.result.content == text


def test_thinking(model: g4.Model) -> None:
    q = "What is 5+6?"
    r = model.chat([{"role": "user", "content": q}], thinking=True, **GREEDY)
    assert r.content == cli_answer("--think", "on", "--temp", "0", "-p", q)
    with model.conversation(thinking=True, **GREEDY) as c:
        c.send(q)
        assert model.detokenize(c.tokens).startswith("<bos><|turn>system\n<|think|>\n")


def test_tool_declarations_and_responses(model: g4.Model) -> None:
    decl = 'declaration:add{description:<|"|>Adds two numbers<|"|>,parameters:{a:{type:<|"|>NUMBER<|"|>}}}'
    with model.conversation(tools=[decl], **GREEDY) as c:
        c.send("What is 2+3?")
        prompt = model.detokenize(c.tokens)
        assert prompt.startswith("<bos><|turn>system\n<|tool>" + decl + "<tool|>")
    # a tool response answers a call of the model message before it
    call = '<|tool_call>call:add{a:2,b:3}<tool_call|>'
    msgs = [("user", "What is 2+3?"), ("assistant", call), ("tool", "5")]
    r = model.chat(msgs, tools=[decl], max_tokens=8, **GREEDY)
    assert r.finish_reason in ("eos", "budget") and r.tokens
    try:
        model.chat([("user", "What is 2+3?"), ("tool", "5")], **GREEDY)
    except g4.InputError as e:
        assert "tool" in str(e)
    else:
        raise AssertionError("a tool message answering no call was accepted")


def test_parse_reply() -> None:
    p = g4.parse_reply('<|channel>thought\nadd them<channel|>It is 5.<|tool_call>call:add{a:2,b:3}<tool_call|>')
    assert (p.content, p.reasoning, p.tool_calls) == ("It is 5.", "add them", [g4.ToolCall("add", "{a:2,b:3}")])
    assert not p.truncated_in_thought and not p.tool_call_unclosed
    p = g4.parse_reply("<|channel>thought\nstill thinking")
    assert p.truncated_in_thought and p.content == "" and p.reasoning == "still thinking"
    p = g4.parse_reply("x <|tool_call>call:f{")
    assert p.tool_call_unclosed and p.tool_calls == [] and p.content == "x"
