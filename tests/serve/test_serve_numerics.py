"""g4 serve and numerics (issue 33, defects 1, 9 and 10): a checkpoint that loads but whose output
is NaN (every row of its embedding scale 3e38) answers each request with a 500 JSON error (a
streamed one with an error event) and goes on serving; a temperature below the greedy line
(1e-40) gives greedy decoding's answer, a non-finite one is refused; a prompt longer than the
context without max_tokens gets a context_length_exceeded error with no negative count."""
import json
import os
import shutil
import struct
import tempfile

from serve_util import MODEL, MODEL_ID, Server, chat_body, check, g4_run, is_error_shape, problem, raw_stream, sse_events


def overflowing_model(root):
    """The built-in model with its token embedding scale set to 3e38 (a finite float, so it loads)
    in root/gemma4-tiny-math (the same model id); its path."""
    d = os.path.join(root, os.path.basename(MODEL))
    os.mkdir(d)
    for name in os.listdir(MODEL):
        if name != "model.safetensors":
            os.symlink(os.path.join(MODEL, name), os.path.join(d, name))
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as f:
        b = bytearray(f.read())
    n = struct.unpack("<Q", b[:8])[0]
    a, e = json.loads(b[8:8 + n])["model.language_model.embed_tokens.embedding_scale"]["data_offsets"]
    b[8 + n + a:8 + n + e] = struct.pack("<f", 3e38) * ((e - a) // 4)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b)
    return d


def test_non_finite(root):
    sv = Server("-m", overflowing_model(root), "--parallel", "2")
    try:
        for name, kw in (("sampled", {"temperature": 1, "top_k": 5}), ("sampled, every logit", {"temperature": 0.8}),
                         ("greedy", {"temperature": 0})):
            status, body = sv.http("POST", "/v1/chat/completions", chat_body(problem(0), max_tokens=8, **kw))
            check(status == 500 and is_error_shape(body, 500) and "non-finite" in body["error"]["message"],
                  "NaN logits, %s: 500 with a JSON error naming them" % name, (status, body))
        c, r, status = raw_stream(sv.port, chat_body(problem(1), max_tokens=8, temperature=1, stream=True))
        events = list(sse_events(r))
        c.close()
        errors = [json.loads(x) for x in events if x != "[DONE]" and "error" in json.loads(x)]
        check(status == 200 and len(errors) == 1 and "non-finite" in errors[0]["error"]["message"] and events[-1] == "[DONE]",
              "NaN logits, streamed: an error event, then [DONE]", events)
        status, body = sv.http("GET", "/health")
        check(sv.proc.poll() is None and status == 200 and body.get("status") == "ok", "the server goes on serving after them", (status, body))
        status, body = sv.http("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "2+2=", "max_tokens": 4, "temperature": 1})
        check(status == 500 and is_error_shape(body, 500), "and answers the next request (completions) the same way", (status, body))
    finally:
        check(sv.stop() == 0, "the server on the overflowing checkpoint stops cleanly", "".join(sv.log[-5:]))


def test_temperature_and_context():
    sv = Server("--parallel", "2", "--ctx", "256")
    try:
        want = g4_run(problem(2), extra=["--temp", "0"])
        for t in (1e-40, 9e-6):
            status, body = sv.http("POST", "/v1/chat/completions", chat_body(problem(2), temperature=t))
            got = body["choices"][0]["message"]["content"] if status == 200 else body
            check(got == want, "temperature %g is greedy decoding (g4 run --temp 0)" % t, "%r != %r" % (got, want))
        status, body = sv.http("POST", "/v1/chat/completions", '{"model": "%s", "temperature": 1e999, "messages": '
                               '[{"role": "user", "content": "hi"}]}' % MODEL_ID)
        check(status == 400 and is_error_shape(body, 400, param="temperature"), "temperature 1e999 (inf) is refused", (status, body))
        long = " ".join(["seven"] * 400)
        status, body = sv.http("POST", "/v1/chat/completions", chat_body(long))
        msg = body["error"]["message"] if is_error_shape(body, 400, "context_length_exceeded") else ""
        check(status == 400 and "maximum context length is 256 tokens" in msg and "-" not in msg and "resulted in" in msg,
              "a prompt past the context without max_tokens: the error counts no negative completion", (status, body))
        status, body = sv.http("POST", "/v1/chat/completions", chat_body(long, max_tokens=10))
        msg = body["error"]["message"] if is_error_shape(body, 400, "context_length_exceeded") else ""
        check(status == 400 and ", 10 in the completion)" in msg, "with max_tokens the error counts both parts", (status, body))
    finally:
        check(sv.stop() == 0, "the server stops cleanly", "".join(sv.log[-5:]))


def run():
    root = tempfile.mkdtemp(prefix="g4-serve-numerics-")
    try:
        test_non_finite(root)
        test_temperature_and_context()
    finally:
        shutil.rmtree(root, ignore_errors=True)
