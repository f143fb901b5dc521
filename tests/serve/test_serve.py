#!/usr/bin/env python3
"""g4 serve against the official openai client (and raw HTTP where the client hides what is
checked), on loopback with the built-in model. Every reference is independent of the server: the
greedy and sampled answers are `g4 run`'s (and `g4 chat`'s for a continued conversation) for the
same messages and settings, the tool declarations' rendering is the real template's
(tests/fixtures/chat/template_cases.jsonl), parsed tool calls are compared with the arguments the
scripted model text holds, and the token counts with `g4 tokenize`.

    G4_BIN=build/release/g4 python3 tests/serve/test_serve.py        (tests/serve/run.sh makes the venv)

Environment: G4_BIN (the g4 command), SERVE_LOAD_N (load-test requests, default 500). Prints
"ok ..." per passed check, "FAIL ..." per failed one, and the closing line
"serve: N passed, N failed, N skipped" that tests/result.sh reads."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import openai

import serve_util
import test_serve_numerics
import test_hardening
import test_endpoints
import test_page
import test_genapi
import test_structured
import test_media
from serve_util import *  # noqa: F401,F403 (check, Server, problem, g4_run, ...)


def test_models(sv):
    models = sv.client().models.list().data
    check(len(models) == 1 and models[0].id == MODEL_ID, "GET /v1/models lists the model", models)
    status, body = sv.http("GET", "/v1/models/" + MODEL_ID)
    check(status == 200 and body.get("id") == MODEL_ID and body.get("object") == "model", "GET /v1/models/ID", body)
    status, body = sv.http("GET", "/v1/models/nope")
    check(status == 404 and is_error_shape(body, 404, "model_not_found"), "GET /v1/models/unknown is 404", body)
    status, body = sv.http("GET", "/health")
    check(status == 200 and body.get("status") == "ok" and body.get("slots") == 16, "GET /health", body)


def test_greedy(sv):
    c = sv.client()
    for i in range(3):
        want = g4_run(problem(i), extra=["--temp", "0"])
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(i)}], temperature=0)
        got = r.choices[0].message.content
        check(got == want, "greedy chat %d equals g4 run --temp 0" % i, "%r != %r" % (got, want))
        check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens > 0 and r.usage.total_tokens ==
              r.usage.prompt_tokens + r.usage.completion_tokens, "greedy chat %d: finish_reason stop, usage" % i, r.usage)
    want = g4_run(problem(5), system="You are a careful calculator.", extra=["--temp", "0"])
    r = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "system", "content": "You are a careful calculator."},
                                                                          {"role": "user", "content": problem(5)}])
    check(r.choices[0].message.content == want, "greedy chat with a system message equals g4 run --system", r.choices[0].message.content)
    r = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "developer", "content": "You are a careful calculator."},
                                                                          {"role": "user", "content": [{"type": "text", "text": problem(5)}]}])
    check(r.choices[0].message.content == want, "developer role and content parts render as system and text", r.choices[0].message.content)
    # the prompt's token count is g4 tokenize's of the template's text
    text = "<bos><|turn>user\n" + problem(0).strip() + "<turn|>\n<|turn>model\n"
    r = c.chat.completions.create(model=MODEL_ID, temperature=0, max_tokens=1, messages=[{"role": "user", "content": problem(0)}])
    check(r.usage.prompt_tokens == len(g4_tokens(text)), "prompt_tokens is the rendered prompt's token count", r.usage.prompt_tokens)


def test_sampling(sv):
    c = sv.client()
    args = ["--temp", "0.9", "--top-p", "0.9", "--top-k", "20", "--min-p", "0.01", "--seed", "1234"]
    want = g4_run(problem(7), extra=args)
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(7)}], temperature=0.9, top_p=0.9,
                                  seed=1234, extra_body={"top_k": 20, "min_p": 0.01})
    check(r.choices[0].message.content == want, "sampled chat equals g4 run with the same temperature, top_p, top_k, min_p, seed",
          "%r != %r" % (r.choices[0].message.content, want))
    want = g4_run(problem(8), extra=["--temp", "0", "--repeat-penalty", "1.3"])
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(8)}], temperature=0,
                                  extra_body={"repetition_penalty": 1.3})
    check(r.choices[0].message.content == want, "repetition_penalty equals g4 run --repeat-penalty", r.choices[0].message.content)


def test_streaming(sv):
    c = sv.client()
    want = g4_run(problem(1), extra=["--temp", "0"])
    chunks = list(c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(1)}], temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(text == want, "streamed chunks join to g4 run's answer", "%r != %r" % (text, want))
    check(chunks[0].choices[0].delta.role == "assistant", "the first chunk carries the role")
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(finals == ["stop"], "one chunk ends the choice with finish_reason stop", finals)
    usage = chunks[-1].usage
    whole = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(1)}], temperature=0).usage
    check(not chunks[-1].choices and usage and usage.completion_tokens == whole.completion_tokens and usage.prompt_tokens == whole.prompt_tokens,
          "include_usage: a last chunk with the usage of the whole reply and no choices", (usage, whole))
    check(all(ch.id == chunks[0].id and ch.object == "chat.completion.chunk" for ch in chunks), "every chunk has the completion's id")
    s, f, status = raw_stream(sv.port, chat_body(problem(1), temperature=0, stream=True))
    events = list(sse_events(f))
    s.close()
    check(status == 200 and events[-1] == "[DONE]" and all(e == "[DONE]" or json.loads(e) for e in events),
          "the raw stream is SSE data: events ending with data: [DONE]", events[-2:])
    # completions, raw prompt: g4 run --raw
    prompt = "<bos><|turn>user\n" + problem(2) + "<turn|>\n<|turn>model\n"
    want = g4_run(prompt, raw=True, extra=["--temp", "0", "-n", "40"])
    r = c.completions.create(model=MODEL_ID, prompt=prompt, temperature=0, max_tokens=40)
    check(r.choices[0].text == want, "completions: raw prompt equals g4 run --raw", "%r != %r" % (r.choices[0].text, want))
    parts = list(c.completions.create(model=MODEL_ID, prompt=prompt, temperature=0, max_tokens=40, stream=True))
    check("".join(p.choices[0].text for p in parts if p.choices) == want and parts[-1].choices[0].finish_reason in ("stop", "length"),
          "completions: streamed text equals the whole", parts[-1])
    ids = g4_tokens(prompt[len("<bos>"):])
    r2 = c.completions.create(model=MODEL_ID, prompt=[2] + ids, temperature=0, max_tokens=40)
    check(r2.choices[0].text == want, "completions: a prompt of token ids", r2.choices[0].text)
    r3 = c.completions.create(model=MODEL_ID, prompt=prompt, temperature=0)
    check(r3.usage.completion_tokens == 16 and r3.choices[0].finish_reason == "length", "completions: max_tokens defaults to 16", r3.usage)


def test_stop_and_length(sv):
    c = sv.client()
    want = g4_run(problem(3), extra=["--temp", "0"])
    cut = want.index("=")
    for stream in (False, True):
        kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": problem(3)}], temperature=0, stop=["=", "never-there"])
        if stream:
            chunks = list(c.chat.completions.create(stream=True, **kw))
            got = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            reason = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        else:
            r = c.chat.completions.create(**kw)
            got, reason = r.choices[0].message.content, [r.choices[0].finish_reason]
        check(got == want[:cut] and reason == ["stop"], "stop string (stream %s): text up to it, not sent" % stream, "%r %r" % (got, reason))
    two = want[cut - 1:cut + 1]  # a stop string spanning two tokens' text
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(3)}], temperature=0, stop=two)
    check(r.choices[0].message.content == want[:want.index(two)], "a stop string across tokens", r.choices[0].message.content)
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(3)}], temperature=0, max_tokens=7)
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7 and want.startswith(r.choices[0].message.content),
          "max_tokens: finish_reason length after that many tokens", r)
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(3)}], temperature=0, max_completion_tokens=5)
    check(r.usage.completion_tokens == 5, "max_completion_tokens", r.usage)


def test_thinking(sv):
    c = sv.client()
    for kw in ({"reasoning_effort": "high"}, {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}}):
        want = g4_run(problem(4), extra=["--temp", "0", "--think", "on"])
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(4)}], temperature=0, **kw)
        check(r.choices[0].message.content == want, "thinking on (%s) equals g4 run --think on" % list(kw)[0], r.choices[0].message.content)
    want_off = g4_run(problem(4), extra=["--temp", "0"])
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(4)}], temperature=0, reasoning_effort="none")
    check(r.choices[0].message.content == want_off, "reasoning_effort none is thinking off")


def test_continued_conversation(sv):
    """Turn two of a conversation: g4 chat's second answer; the first turn's prefix comes from the cache."""
    c = sv.client()
    q1, q2 = QUESTIONS[10], QUESTIONS[11]  # one line each: g4 chat reads a turn a line
    a1 = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "user", "content": q1}]).choices[0].message.content
    msgs = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1}, {"role": "user", "content": q2}]
    r = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=msgs)
    chat = g4_chat([q1, q2], extra=["--temp", "0"])
    check(chat == a1 + "\n" + r.choices[0].message.content + "\n", "a continued conversation equals g4 chat's two answers",
          "%r vs %r" % (chat, a1 + "\n" + r.choices[0].message.content + "\n"))
    cached = r.usage.prompt_tokens_details.cached_tokens
    check(cached > len(g4_tokens(q1)), "the second turn reuses the first turn's KV (cached_tokens %d)" % cached, r.usage)


def concurrent_greedy(sv, first, n):
    """n clients at once, half streaming, each asking problem(first + i) greedily: the indices
    whose answer differs from g4 run --temp 0's (with what they got), the answers, the wall time."""
    c = sv.client()
    wants = [g4_run(problem(first + i), extra=["--temp", "0"]) for i in range(n)]
    got = [None] * n

    def one(i):
        try:
            r = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "user", "content": problem(first + i)}],
                                          stream=(i % 2 == 1))
            got[i] = "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices) if i % 2 else r.choices[0].message.content
        except Exception as e:  # noqa: BLE001 (reported as a failed check)
            got[i] = e

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [(i, got[i], wants[i]) for i in range(n) if got[i] != wants[i]]
    return bad, wants, time.time() - t0


def test_concurrent(sv, n=16):
    bad, _, wall = concurrent_greedy(sv, 20, n)
    check(not bad, "%d concurrent clients each get exactly its own greedy answer (%.2f s)" % (n, wall), bad[:2])


def test_draft(common):
    """--draft (the built-in model's trained MTP drafter): 8 concurrent greedy clients, half
    streaming, each get exactly the answer g4 run gives without a drafter; stop strings cut a
    drafting round's tokens where the text asks."""
    draft = os.path.join(os.path.dirname(MODEL), "gemma4-tiny-math-drafter")
    sv = Server(*common, "--draft", draft, "--draft-tokens", "4")
    try:
        n = 8
        bad, wants, _ = concurrent_greedy(sv, 40, n)
        check(not bad, "--draft: %d concurrent greedy clients each get the answer g4 run gives without a drafter" % n, bad[:2])
        c = sv.client()
        want = wants[0]
        cut = want[: max(1, len(want) // 2)][-3:]
        r = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "user", "content": problem(40)}], stop=[cut])
        got0 = r.choices[0].message.content
        check(r.choices[0].finish_reason == "stop" and got0 == want[: want.find(cut)], "--draft: a stop string ends the reply where it starts",
              "%r (stop %r)" % (got0, cut))
        m = sv.metrics()
        check(m.get("g4_draft_rounds_total", 0) > 0 and 0.5 * m["g4_draft_tokens_total"] < m.get("g4_draft_accepted_tokens_total", 0) <=
              m["g4_draft_tokens_total"], "--draft: /metrics counts the rounds, drafts and accepted drafts", m)
        # a constrained request drafts too: the same reply as g4 run's under the schema without a drafter
        schema = {"type": "object", "properties": {"steps": {"type": "string", "maxLength": 40}, "answer": {"type": "integer"}},
                  "required": ["steps", "answer"], "additionalProperties": False}
        want = g4_run(problem(41), extra=["--temp", "0", "--json-schema", json.dumps(schema)])
        rounds = m.get("g4_draft_rounds_total", 0)
        r = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "user", "content": problem(41)}],
                                      response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
        got = r.choices[0].message.content
        check(got == want and sv.metrics().get("g4_draft_rounds_total", 0) > rounds,
              "--draft: a json_schema request drafts, and answers what g4 run answers under the schema without a drafter", "%r vs %r" % (got, want))
    finally:
        check(sv.stop() == 0, "the --draft server stops cleanly on SIGTERM", "".join(sv.log[-5:]))


def test_errors(sv):
    # a greedy stream runs beside the bad requests and must be unaffected
    want = g4_run(problem(12), extra=["--temp", "0"])
    result = {}

    def good():
        chunks = sv.client().chat.completions.create(model=MODEL_ID, temperature=0, stream=True, messages=[{"role": "user", "content": problem(12)}])
        result["text"] = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    t = threading.Thread(target=good)
    t.start()
    cases = [
        ("malformed JSON", "POST", "/v1/chat/completions", '{"model": "gemma4-tiny-math", "messages": [', 400, None, None),
        ("a body that is no object", "POST", "/v1/chat/completions", "[1, 2]", 400, None, None),
        ("messages not an array", "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": "hi"}, 400, None, "messages"),
        ("no messages", "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": []}, 400, None, "messages"),
        ("unknown role", "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "wizard", "content": "x"}]}, 400, None,
         "messages[0].role"),
        ("content of a wrong type", "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": 5}]}, 400,
         None, "messages[0].content"),
        ("a remote image URL", "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, None, "messages[0].content[0].image_url.url"),
        ("temperature a string", "POST", "/v1/chat/completions", chat_body("x", temperature="hot"), 400, None, "temperature"),
        ("temperature out of range", "POST", "/v1/chat/completions", chat_body("x", temperature=5), 400, None, "temperature"),
        ("max_tokens 0", "POST", "/v1/chat/completions", chat_body("x", max_tokens=0), 400, None, "max_tokens"),
        ("max_tokens past the context", "POST", "/v1/chat/completions", chat_body("x", max_tokens=10 ** 6), 400, "context_length_exceeded",
         "max_tokens"),
        ("stream not a boolean", "POST", "/v1/chat/completions", chat_body("x", stream="yes"), 400, None, "stream"),
        ("n past --parallel (16)", "POST", "/v1/chat/completions", chat_body("x", n=17), 400, None, "n"),
        ("top_logprobs without logprobs", "POST", "/v1/chat/completions", chat_body("x", top_logprobs=2), 400, None, "top_logprobs"),
        ("top_logprobs 21", "POST", "/v1/chat/completions", chat_body("x", logprobs=True, top_logprobs=21), 400, None, "top_logprobs"),
        ("frequency_penalty out of range", "POST", "/v1/chat/completions", chat_body("x", frequency_penalty=2.5), 400, None, "frequency_penalty"),
        ("logit_bias past the vocabulary", "POST", "/v1/chat/completions", chat_body("x", logit_bias={"99999999": 1}), 400, None, "logit_bias"),
        ("logit_bias over 100", "POST", "/v1/chat/completions", chat_body("x", logit_bias={"5": 101}), 400, None, "logit_bias"),
        ("an empty stop string", "POST", "/v1/chat/completions", chat_body("x", stop=[""]), 400, None, "stop[0]"),
        ("five stop strings", "POST", "/v1/chat/completions", chat_body("x", stop=list("abcde")), 400, None, "stop"),
        ("stream_options without stream", "POST", "/v1/chat/completions", chat_body("x", stream_options={"include_usage": True}), 400, None,
         "stream_options"),
        ("a tool message answering nothing", "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [
            {"role": "user", "content": "x"}, {"role": "tool", "content": "42"}]}, 400, None, "messages"),
        ("an unknown response_format type", "POST", "/v1/chat/completions", chat_body("x", response_format={"type": "xml"}), 400, None,
         "response_format.type"),
        ("reasoning_effort unknown", "POST", "/v1/chat/completions", chat_body("x", reasoning_effort="max"), 400, None, "reasoning_effort"),
        ("tool_choice naming no tool", "POST", "/v1/chat/completions", chat_body("x", tool_choice={"type": "function", "function": {"name": "f"}}),
         400, None, "tool_choice"),
        ("completions: no prompt", "POST", "/v1/completions", {"model": MODEL_ID}, 400, None, "prompt"),
        ("completions: a token id outside the vocabulary", "POST", "/v1/completions", {"model": MODEL_ID, "prompt": [2, 10 ** 7]}, 400, None,
         "prompt"),
        ("completions: echo", "POST", "/v1/completions", {"model": MODEL_ID, "prompt": "x", "echo": True}, 400, None, "echo"),
        ("unknown path", "GET", "/v1/images/generations", None, 404, "not_found", None),
        ("wrong method", "GET", "/v1/chat/completions", None, 405, "method_not_allowed", None),
        ("wrong method on models", "POST", "/v1/models", "{}", 405, "method_not_allowed", None),
    ]
    for name, method, path, body, status, code, param in cases:
        got_status, got = sv.http(method, path, body)
        check(got_status == status and is_error_shape(got, status, code, param), "error: %s -> %d" % (name, status), (got_status, got))
    got_status, got = sv.http("POST", "/v1/chat/completions", b'{"model":"gemma4-tiny-math","messages":[{"role":"user","content":"\xff\xfe"}]}')
    check(got_status == 400 and is_error_shape(got, 400, "invalid_utf8"), "error: invalid UTF-8 -> 400", got)
    got_status, got = sv.http("POST", "/v1/chat/completions", '{"model":"gemma4-tiny-math","messages":[{"role":"user","content":"a\\u0000b"}]}')
    check(got_status == 400 and is_error_shape(got, 400), "error: an escaped NUL -> 400", got)
    t.join()
    check(result.get("text") == want, "a stream running beside the bad requests is unaffected", result)


def test_limits():
    sv = Server("--parallel", "2", "--ctx", "256", "--max-body", "64k", "--max-messages", "8", "--max-tools", "2")
    try:
        status, body = sv.http("POST", "/v1/chat/completions", chat_body("x" * 100000))
        check(status == 413 and is_error_shape(body, 413, "request_too_large"), "error: a body over --max-body -> 413", (status, body))
        chunked = json.dumps(chat_body("y" * 100000))
        c = http.client.HTTPConnection("127.0.0.1", sv.port, timeout=TIMEOUT)
        c.putrequest("POST", "/v1/chat/completions")
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for i in range(0, len(chunked), 8192):
            part = chunked[i:i + 8192].encode()
            c.send(b"%x\r\n%s\r\n" % (len(part), part))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        body = json.loads(r.read())
        check(r.status == 413 and is_error_shape(body, 413, "request_too_large"), "error: a chunked body over --max-body -> 413", body)
        msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * 4 + [{"role": "user", "content": "q"}]
        status, body = sv.http("POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": msgs})
        check(status == 400 and is_error_shape(body, 400, None, "messages"), "error: more messages than --max-messages", body)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
        status, body = sv.http("POST", "/v1/chat/completions", chat_body("x", tools=[tool] * 3))
        check(status == 400 and is_error_shape(body, 400, None, "tools"), "error: more tools than --max-tools", body)
        status, body = sv.http("POST", "/v1/chat/completions", chat_body("seven " * 300))
        check(status == 400 and is_error_shape(body, 400, "context_length_exceeded", "messages"), "error: a prompt past the context", body)
        status, body = sv.http("POST", "/v1/chat/completions", chat_body("seven " * 30, max_tokens=250))
        check(status == 400 and is_error_shape(body, 400, "context_length_exceeded"), "error: prompt + max_tokens past the context", body)
        r = sv.client().chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(0)}], temperature=0)
        check(r.choices[0].message.content == g4_run(problem(0), extra=["--temp", "0", "--ctx", "256"]), "a good request after the refused ones")
    finally:
        check(sv.stop() == 0, "the limits server stops cleanly on SIGTERM")


def test_api_key():
    sv = Server("--parallel", "1", "--api-key", "s3cret")
    try:
        status, body = sv.http("GET", "/v1/models")
        check(status == 401 and is_error_shape(body, 401, "invalid_api_key"), "--api-key: no Authorization -> 401", body)
        status, body = sv.http("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        check(status == 401, "--api-key: a wrong key -> 401", body)
        status, body = sv.http("GET", "/health")
        check(status == 200, "--api-key: /health needs no key (load balancers)", body)
        try:
            sv.client(api_key="nope").models.list()
            check(False, "the openai client with a wrong key raises AuthenticationError")
        except openai.AuthenticationError:
            check(True, "the openai client with a wrong key raises AuthenticationError")
        check(sv.client(api_key="s3cret").models.list().data[0].id == MODEL_ID, "--api-key: the right key is let in")
    finally:
        sv.stop()


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "The city."}}, "required": ["city"]}}}


def fixture_case(name):
    with open(os.path.join(FIXTURES, "template_cases.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["name"] == name and row["template"] == "upstream":
                return row
    raise KeyError(name)


def test_tools_scripted():
    """The model's text scripted (--test-replies): calls parsed, thoughts split out, declarations rendered as the template does."""
    replies = [
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>',
        "<|channel>thought\nThe user wants 2+2.<channel|>It is 4.",
        '{city:<|"|>Oslo<|"|>}<tool_call|>',
        "Let me check. <|tool_call>call:get_weather{city:<|\"|>Par",
        '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|><|tool_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>',
    ]
    path = os.path.join(tempfile.mkdtemp(), "replies.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(replies, f)
    sv = Server("--parallel", "1", "--test-replies", path)
    try:
        c = sv.client()
        user = [{"role": "user", "content": "Weather in Paris?"}]
        r = c.chat.completions.create(model=MODEL_ID, messages=user, tools=[WEATHER])
        m = r.choices[0].message
        check(r.choices[0].finish_reason == "tool_calls" and m.content is None and len(m.tool_calls) == 1 and
              m.tool_calls[0].function.name == "get_weather" and json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris"},
              "a scripted call is parsed into tool_calls with JSON arguments", m)
        chunks = list(c.chat.completions.create(model=MODEL_ID, messages=user, tools=[WEATHER], stream=True))
        calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        check([(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] ==
              [(0, "get_weather", {"city": "Paris"}), (1, "get_weather", {"city": "Rome"})] and
              chunks[-1].choices[0].finish_reason == "tool_calls", "two streamed calls, each a tool_calls delta", calls)
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "2+2?"}], reasoning_effort="high")
        m = r.choices[0].message
        check(m.content == "It is 4." and getattr(m, "reasoning_content", None) == "The user wants 2+2.",
              "the thought goes to reasoning_content, never content", m)
        r = c.chat.completions.create(model=MODEL_ID, messages=user, tools=[WEATHER],
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
        tc = r.choices[0].message.tool_calls
        check(tc and tc[0].function.name == "get_weather" and json.loads(tc[0].function.arguments) == {"city": "Oslo"},
              "a named tool_choice opens the call in the prompt; the model's text completes it", r.choices[0].message)
        r = c.chat.completions.create(model=MODEL_ID, messages=user, tools=[WEATHER])
        check(r.choices[0].message.content == 'Let me check. <|tool_call>call:get_weather{city:<|"|>Par' and not r.choices[0].message.tool_calls
              and r.choices[0].finish_reason == "stop", "an unclosed call stays text", r.choices[0].message)
        # parallel_tool_calls false: the two-call reply ends at its first call, streamed as one tool_calls delta
        chunks = list(c.chat.completions.create(model=MODEL_ID, messages=user, tools=[WEATHER], stream=True, parallel_tool_calls=False))
        calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        check([(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [(0, "get_weather", {"city": "Oslo"})] and
              chunks[-1].choices[0].finish_reason == "tool_calls", "parallel_tool_calls false: one call, then the end", calls)
        # tool_choice none drops the tools from the prompt
        base = c.chat.completions.create(model=MODEL_ID, messages=user, max_tokens=1).usage.prompt_tokens
        none = c.chat.completions.create(model=MODEL_ID, messages=user, tools=[WEATHER], tool_choice="none", max_tokens=1).usage.prompt_tokens
        check(base == none, "tool_choice none renders no tools", (base, none))
    finally:
        sv.stop()


def test_tool_rendering(sv):
    """A conversation with tools, a call and its response, OpenAI's way: the prompt is the real template's rendering (the same
    token count, and the same greedy continuation as the template's text sent raw)."""
    row = fixture_case("a call and its response")
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    c = sv.client()
    r = c.chat.completions.create(model=MODEL_ID, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=20)
    want_ids = g4_tokens(row["text"][len("<bos>"):])
    check(r.usage.prompt_tokens == 1 + len(want_ids), "tools, a call and its response: the template's token count",
          (r.usage.prompt_tokens, 1 + len(want_ids)))
    raw = c.completions.create(model=MODEL_ID, prompt=row["text"], temperature=0, max_tokens=20)
    check(raw.choices[0].text == (r.choices[0].message.content or "") and raw.usage.prompt_tokens == r.usage.prompt_tokens,
          "tools, a call and its response: the same continuation as the template's text", (raw.choices[0].text, r.choices[0].message))
    row = fixture_case("two calls, two responses, the answer")
    rome = {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    paris = {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [{"role": "user", "content": "Paris or Rome, which is warmer?"}, {"role": "assistant", "content": "", "tool_calls": [paris, rome]},
            {"role": "tool", "tool_call_id": "b", "content": " 25 C "}, {"role": "tool", "tool_call_id": "a", "content": "21 C"},
            {"role": "assistant", "content": "Rome is warmer."}, {"role": "user", "content": "Thanks!"}]
    r = c.chat.completions.create(model=MODEL_ID, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=1)
    check(r.usage.prompt_tokens == 1 + len(g4_tokens(row["text"][len("<bos>"):])),
          "two calls answered out of order by tool_call_id: the template's prompt", r.usage.prompt_tokens)


def wait_until(cond):
    """Polls cond() until it holds, for at most TIMEOUT seconds (a hang guard: a loaded machine may take any time to get there)."""
    deadline = time.time() + TIMEOUT
    while not cond() and time.time() < deadline:
        time.sleep(0.05)


def test_cancel():
    """A client that leaves mid-stream frees its slot at once; so does one that leaves while waiting for a whole reply."""
    path = os.path.join(tempfile.mkdtemp(), "long.json")
    with open(path, "w") as f:
        json.dump(["1+1=2. " * 400], f)
    sv = Server("--parallel", "1", "--queue", "1", "--test-replies", path, "--test-step-ms", "20")
    try:
        s, f, status = raw_stream(sv.port, chat_body("x", max_tokens=2000, stream=True))
        first = [next(sse_events(f)) for _ in range(3)]
        check(all(json.loads(e)["object"] == "chat.completion.chunk" for e in first), "the long stream is running")
        s.close()
        wait_until(lambda: sv.metrics().get("g4_slots_active", 1) == 0)
        m = sv.metrics()
        check(m.get("g4_slots_active") == 0 and m.get("g4_requests_cancelled_total") == 1, "a client leaving mid-stream frees its slot", m)
        r = sv.client().chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}], max_tokens=5)
        check(r.usage.completion_tokens == 5, "the freed slot serves the next request")
        conn = socket.create_connection(("127.0.0.1", sv.port))
        body = json.dumps(chat_body("x", max_tokens=2000)).encode()
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: sv.metrics().get("g4_slots_active") == 1)  # the request is running: the client leaves a wait
        conn.close()
        wait_until(lambda: sv.metrics().get("g4_requests_cancelled_total") == 2)
        m = sv.metrics()
        check(m.get("g4_slots_active") == 0 and m.get("g4_requests_cancelled_total") == 2, "a client leaving a whole-reply wait frees its slot", m)
        # every slot and queue place taken: 503 at once (while the held requests still hold them: /health below), never a wait
        held = [raw_stream(sv.port, chat_body("x", max_tokens=2000, stream=True)) for _ in range(2)]
        wait_until(lambda: sv.http("GET", "/health")[1].get("queued") == 1)
        try:
            sv.client().chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}])
            check(False, "a full server answers 503")
        except openai.APIStatusError as e:
            check(e.status_code == 503 and e.body.get("code") == "server_busy", "a full server answers 503 at once", e.body)
        status, body = sv.http("GET", "/health")
        check(status == 200 and body["slots_active"] == 1 and body["queued"] == 1, "/health shows the slot and the queue", body)
        for s, f, _ in held:
            s.close()
    finally:
        check(sv.stop() == 0, "the cancel server stops cleanly")


def test_drain():
    """SIGTERM: running requests finish with a finish_reason and [DONE], new ones are refused, the server exits 0."""
    path = os.path.join(tempfile.mkdtemp(), "long.json")
    with open(path, "w") as f:
        json.dump(["2+2=4. " * 60], f)
    sv = Server("--parallel", "2", "--test-replies", path, "--test-step-ms", "10", "--drain-timeout", "30")
    results = [None, None]

    def one(i):
        try:
            chunks = list(sv.client().chat.completions.create(model=MODEL_ID, stream=True, messages=[{"role": "user", "content": "x"}],
                                                              max_tokens=(60 * 4 + 10) if i == 0 else 2000))
            results[i] = (chunks[-1].choices[0].finish_reason, "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices))
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: sv.metrics().get("g4_slots_active") == 2)  # both running: the signal must find them in flight
    sv.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: sv.http("GET", "/health")[0] == 503)
    status, body = sv.http("GET", "/health")
    check(status == 503 and body.get("status") == "draining", "draining: /health says 503 draining", body)
    status, body = sv.http("POST", "/v1/chat/completions", chat_body("x"))
    check(status == 503 and is_error_shape(body, 503, "shutting_down"), "draining: a new request gets 503", body)
    for t in threads:
        t.join()
    check(all(isinstance(r, tuple) and r[0] in ("stop", "length") and r[1].startswith("2+2=4.") for r in results),
          "draining: both streams ran to their end, with a finish_reason", results)
    check(sv.proc.wait(timeout=TIMEOUT) == 0, "draining: the server exits 0 once they are done")
    # a request that outlives --drain-timeout is cut short with finish_reason length
    sv = Server("--parallel", "1", "--test-replies", path, "--test-step-ms", "20", "--drain-timeout", "1")
    s, f, status = raw_stream(sv.port, chat_body("x", max_tokens=2000, stream=True))
    next(sse_events(f))
    sv.proc.send_signal(signal.SIGTERM)
    events = list(sse_events(f))
    s.close()
    last = json.loads(events[-2]) if len(events) >= 2 else {}
    check(events and events[-1] == "[DONE]" and last.get("choices", [{}])[0].get("finish_reason") == "length",
          "--drain-timeout: a longer request ends with finish_reason length and [DONE]", events[-2:])
    check(sv.proc.wait(timeout=TIMEOUT) == 0, "--drain-timeout: the server exits 0")


def test_metrics(sv_args):
    sv = Server(*sv_args)
    try:
        c = sv.client()
        total = 0
        for i in range(3):
            total += c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "user", "content": problem(i)}]).usage.completion_tokens
        sv.http("POST", "/v1/chat/completions", "{")
        m = sv.metrics()
        check(m.get('g4_requests_total{endpoint="/v1/chat/completions",status="200"}') == 3 and
              m.get('g4_requests_total{endpoint="/v1/chat/completions",status="400"}') == 1, "/metrics counts requests by status", m)
        check(m.get("g4_generated_tokens_total") == total and m.get("g4_slots_active") == 0 and m.get("g4_queue_depth") == 0 and
              m.get("g4_decode_tokens_per_second", 0) > 0, "/metrics: generated tokens, slots, queue, decode speed", m)
        _, text = sv.http("GET", "/metrics")
        check(all(re.match(r"^(# (HELP|TYPE) \S+ .+|[a-z_][a-z0-9_]*(\{[^}]*\})? [0-9.e+-]+)$", line) for line in text.splitlines()),
              "/metrics is Prometheus text format")
    finally:
        sv.stop()


def load_round(sv, first, n, concurrency, failures):
    """Requests first..first+n-1 from `concurrency` threads (every third one streamed); each failure appended to failures."""
    lock = threading.Lock()
    counter = [first]

    def worker():
        c = sv.client(timeout=5 * TIMEOUT)  # a hang guard: each request waits its turn behind up to 31 others, on a loaded machine too
        try:
            requests(c)
        finally:
            c.close()  # its idle keep-alive connection counts against --max-conn-per-ip until closed

    def requests(c):
        while True:
            with lock:
                i = counter[0]
                counter[0] += 1
            if i >= first + n:
                return
            try:
                kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": problem(i)}], temperature=0.7, seed=i, max_tokens=64)
                if i % 3 == 0:
                    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw) if ch.choices)
                else:
                    text = c.chat.completions.create(**kw).choices[0].message.content
                if not text:
                    failures.append((i, "empty"))
            except Exception as e:  # noqa: BLE001
                failures.append((i, repr(e)))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_load(n_requests, concurrency=32):
    """n_requests at concurrency 32 in three equal rounds, stopping by itself: no failure, and no leak. Under ASan the leak check
    is LeakSanitizer's at the server's exit (RSS there is the allocator's quarantine, not the server's). In the release build the
    rounds after the first must not grow the server's memory by more than the first round did (its warm-up: arenas, caches, the
    KV of every slot) plus 8 MiB: a bound from what this run measured that allocator noise stays well under, and that a leak
    of more than the warm-up each round (a slot's KV kept per request, a cache never pruned) exceeds. Smaller leaks of lost memory
    are LeakSanitizer's, in the ASan build's run of this test."""
    sv = Server("--parallel", "16", "--queue", "32", "--ctx", "1024")
    failures = []
    rounds = 3
    per = max(1, n_requests // rounds)
    rss = [sv.rss_kb()]
    t0 = time.time()
    for r in range(rounds):
        load_round(sv, r * per, per, concurrency, failures)
        rss.append(sv.rss_kb())
    wall = time.time() - t0
    m = sv.metrics()
    rc = sv.stop()
    check(not failures, "load: %d requests at concurrency %d, none failed (%.1f s, %.0f tokens/s)" % (
        rounds * per, concurrency, wall, m.get("g4_generated_tokens_total", 0) / wall), failures[:3])
    leaks = [line for line in sv.log if "LeakSanitizer" in line or "ERROR: AddressSanitizer" in line]
    check(rc == 0 and not leaks, "load: the server exits cleanly on SIGTERM%s" % (" with no leak (LeakSanitizer)" if ASAN else ""),
          "exit %s; %s" % (rc, "".join(leaks[:3]) or "".join(sv.log[-5:])))
    if ASAN:
        leak_flags = re.findall(r"detect_leaks=(\w+)", os.environ.get("ASAN_OPTIONS", ""))
        check(not leak_flags or leak_flags[-1] not in ("0", "false"), "load: LeakSanitizer is on (ASAN_OPTIONS)", os.environ.get("ASAN_OPTIONS"))
        return
    warm, later = rss[1] - rss[0], rss[rounds] - rss[1]
    check(later <= warm + 8 * 1024, "load: the server's memory grew by %d KiB in rounds 2-%d, first round %d KiB (RSS %s KiB)" % (
        later, rounds, warm, " -> ".join(map(str, rss))))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_nginx():
    """Two replicas behind nginx (examples/serve/nginx.conf): the openai client through it gets g4 run's answers, both replicas
    serve, and with one replica stopped the other takes every request."""
    nginx = "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        check(False, "nginx is not installed (scripts/install-deps.sh installs it)")
        return
    replicas = [Server("--parallel", "4"), Server("--parallel", "4")]
    prefix = tempfile.mkdtemp(prefix="g4-nginx-")
    port = free_port()
    with open(os.path.join(ROOT, "examples", "serve", "nginx.conf")) as f:
        conf = f.read()
    ups = "\n".join("        server 127.0.0.1:%d max_fails=1 fail_timeout=10s;" % r.port for r in replicas)
    conf = conf.replace("@PREFIX@", prefix).replace("@LISTEN@", "127.0.0.1:%d" % port).replace("@UPSTREAMS@", ups)
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(conf)
    proc = subprocess.Popen([nginx, "-p", prefix, "-c", os.path.join(prefix, "nginx.conf"), "-g", "daemon off;"], stderr=subprocess.PIPE)
    try:
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none", max_retries=0, timeout=TIMEOUT)
        wants = [g4_run(problem(30 + i), extra=["--temp", "0"]) for i in range(8)]
        got = [None] * 8

        def one(i):
            kw = dict(model=MODEL_ID, temperature=0, messages=[{"role": "user", "content": problem(30 + i)}])
            if i % 2:
                got[i] = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw) if ch.choices)
            else:
                got[i] = c.chat.completions.create(**kw).choices[0].message.content

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(got == wants, "nginx: 8 concurrent clients through two replicas get g4 run's answers", [i for i in range(8) if got[i] != wants[i]])
        served = [r.metrics().get('g4_requests_total{endpoint="/v1/chat/completions",status="200"}', 0) for r in replicas]
        check(all(n > 0 for n in served) and sum(served) == 8, "nginx: least_conn spread the requests over both replicas", served)
        check(replicas[0].stop() == 0, "nginx: the first replica drains and stops")
        ok = 0
        for i in range(4):
            r = c.chat.completions.create(model=MODEL_ID, temperature=0, messages=[{"role": "user", "content": problem(30 + i)}])
            ok += r.choices[0].message.content == wants[i]
        check(ok == 4, "nginx: with one replica down every request is answered by the other", ok)
    finally:
        proc.terminate()
        proc.wait(timeout=TIMEOUT)
        for r in replicas:
            r.stop()


def core():
    """The servers of this file's tests."""
    common = ("--parallel", "16", "--queue", "16", "--ctx", "2048")
    sv = Server(*common)
    try:
        test_models(sv)
        test_greedy(sv)
        test_sampling(sv)
        test_streaming(sv)
        test_stop_and_length(sv)
        test_thinking(sv)
        test_continued_conversation(sv)
        test_concurrent(sv)
        test_errors(sv)
        test_tool_rendering(sv)
    finally:
        check(sv.stop() == 0, "the main server stops cleanly on SIGTERM", "".join(sv.log[-5:]))
    test_limits()
    test_api_key()
    test_tools_scripted()
    test_cancel()
    test_drain()
    test_metrics(common)
    test_draft(common)
    test_nginx()
    test_load(int(os.environ.get("SERVE_LOAD_N", "500")))


def modules():
    # Further test modules of tests/serve (each a run() over serve_util's check and Server):
    # one line each here.
    test_serve_numerics.run()
    test_hardening.run()  # issue 33's transport defects (unknown and missing model names: there, --strict-model)
    test_endpoints.run()
    test_page.run()
    test_genapi.run()
    test_structured.run()
    test_media.run()  # issue 35: images in the messages


GROUPS = {"core": core, "modules": modules}


def main(argv):
    """`test_serve.py [GROUP...]`: the groups named (all by default), in order; tests/serve/run.sh
    runs the two groups side by side (each server on a port of its own). The closing line is named
    after the groups run ("serve" for all) so the runner can add the groups' counts up."""
    names = argv or list(GROUPS)
    for n in names:
        if n not in GROUPS:
            print("test_serve.py: no group '%s' (%s)" % (n, ", ".join(GROUPS)), file=sys.stderr)
            return 2
    for n in names:
        GROUPS[n]()
    label = "serve" if names == list(GROUPS) else "serve-" + "-".join(names)
    print("%s: %d passed, %d failed, %d skipped" % (label, serve_util.passed, serve_util.failed, serve_util.skipped))
    return 1 if serve_util.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
