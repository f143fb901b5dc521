"""g4 serve's route table and the endpoints beside the completions: CORS (--cors-origin, OPTIONS
preflight), JSON errors, /tokenize and /detokenize against `g4 tokenize`, /props against the flags
given, and /v1/embeddings against transformers' final hidden states of tests/fixtures/tiny-bf16
(golden.safetensors' final_norm, pooled here) and through the official client's
embeddings.create. run() is called from test_serve.py's main()."""
import base64
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time

import serve_util
from serve_util import G4, MODEL, MODEL_ID, ROOT, TIMEOUT, Server, check, g4_tokens, is_error_shape

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tiny-bf16")


def g4_tokenize(texts, *flags):
    """`g4 tokenize`'s ids of each text (its JSON lines in, one line out each)."""
    out = subprocess.run([G4, "tokenize", "-m", MODEL] + list(flags), input="".join(json.dumps(t) + "\n" for t in texts), capture_output=True,
                         text=True, timeout=TIMEOUT)
    return [json.loads(line) for line in out.stdout.splitlines()]


# ---------------------------------------------------------------- the route table

ROUTES = [("POST", "/v1/chat/completions", "/chat/completions"), ("POST", "/v1/completions", "/completions"), ("GET", "/v1/models", "/models"),
          ("POST", "/v1/embeddings", "/embeddings"), ("POST", "/tokenize", None), ("POST", "/detokenize", None), ("GET", "/props", None),
          ("GET", "/health", None), ("GET", "/metrics", None), ("GET", "/", None)]


def test_routes(sv):
    before = sv.metrics()
    for method, path, alias in ROUTES:
        other = "GET" if method == "POST" else "POST"
        status, hdrs, body = sv.http_full(other, path, body="{}" if other == "POST" else None)
        check(status == 405 and is_error_shape(body, 405, code="method_not_allowed") and hdrs.get("allow") == method + ", OPTIONS",
              "%s %s: 405 with a JSON error and Allow: %s, OPTIONS" % (other, path, method), (status, hdrs.get("allow"), body))
        if alias:
            status, _, body = sv.http_full(other, alias, body="{}" if other == "POST" else None)
            check(status == 405 and is_error_shape(body, 405), "the alias %s is the same route (405 for %s)" % (alias, other), (status, body))
    for path in ("/v2/chat/completions", "/tokenizer", "/propsx", "/v1/models2", "/index.html"):
        status, _, body = sv.http_full("GET", path)
        check(status == 404 and is_error_shape(body, 404, code="not_found"), "GET %s: 404 with a JSON error" % path, (status, body))
    status, _, body = sv.http_full("GET", "/models/" + MODEL_ID)
    check(status == 200 and body.get("id") == MODEL_ID, "GET /models/ID (the alias takes sub-paths as /v1/models does)", (status, body))
    after = sv.metrics()
    for method, path, alias in ROUTES:
        key = 'g4_requests_total{endpoint="%s",status="405"}' % path
        want = 2 if alias else 1
        check(after.get(key, 0) - before.get(key, 0) == want, "/metrics counts %s's 405s (%d)" % (path, want), (before.get(key), after.get(key)))
    key = 'g4_requests_total{endpoint="other",status="404"}'
    check(after.get(key, 0) - before.get(key, 0) == 5, "/metrics counts the unknown paths' 404s under other", (before.get(key), after.get(key)))


def test_no_cors(sv):
    """Without --cors-origin no answer carries CORS headers; a preflight still gets its 204 and Allow."""
    status, hdrs, _ = sv.http_full("GET", "/v1/models", headers={"Origin": "http://a.test"})
    check(status == 200 and not any(h.startswith("access-control-") for h in hdrs), "no CORS headers without --cors-origin", hdrs)
    status, hdrs, body = sv.http_full("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://a.test", "Access-Control-Request-Method": "POST"})
    check(status == 204 and hdrs.get("allow") == "POST, OPTIONS" and not any(h.startswith("access-control-") for h in hdrs) and body == "",
          "OPTIONS without --cors-origin: 204, Allow, no CORS headers", (status, hdrs))


def test_cors():
    sv = Server("--cors-origin", "http://a.test", "--cors-origin", "http://b.test:8000", "--api-key", "sekrit")
    try:
        auth = {"Authorization": "Bearer sekrit"}
        for origin in ("http://a.test", "http://b.test:8000"):
            status, hdrs, body = sv.http_full("OPTIONS", "/v1/chat/completions",
                                           headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                    "Access-Control-Request-Headers": "authorization, content-type"})
            check(status == 204 and hdrs.get("access-control-allow-origin") == origin and hdrs.get("access-control-allow-methods") == "POST, OPTIONS" and
                  hdrs.get("access-control-allow-headers") == "Authorization, Content-Type" and "Origin" in hdrs.get("vary", ""),
                  "preflight from %s: 204 with its origin, POST and the Authorization and Content-Type headers, without the key" % origin, (status, hdrs))
        status, hdrs, _ = sv.http_full("OPTIONS", "/props", headers={"Origin": "http://a.test"})
        check(status == 204 and hdrs.get("access-control-allow-methods") == "GET, OPTIONS", "preflight of a GET route allows GET", (status, hdrs))
        status, hdrs, _ = sv.http_full("OPTIONS", "/v1/chat/completions", headers={"Origin": "http://evil.test"})
        check(status == 204 and "access-control-allow-origin" not in hdrs and "access-control-allow-methods" not in hdrs,
              "preflight from an origin not listed: no CORS headers", hdrs)
        status, hdrs, body = sv.http_full("OPTIONS", "/nowhere", headers={"Origin": "http://a.test"})
        check(status == 404 and is_error_shape(body, 404), "preflight of an unknown path: 404 JSON", (status, body))
        status, hdrs, body = sv.http_full("POST", "/tokenize", {"content": "2+2"}, headers=dict(auth, Origin="http://a.test"))
        check(status == 200 and hdrs.get("access-control-allow-origin") == "http://a.test", "an allowed origin's reply carries its CORS header", hdrs)
        status, hdrs, body = sv.http_full("POST", "/tokenize", {"content": "2+2"}, headers={"Origin": "http://a.test"})
        check(status == 401 and is_error_shape(body, 401) and hdrs.get("access-control-allow-origin") == "http://a.test",
              "a refusal (401) carries the CORS header too, so the page can read the error", (status, hdrs))
        status, hdrs, _ = sv.http_full("GET", "/v1/models", headers=dict(auth, Origin="http://evil.test"))
        check(status == 200 and "access-control-allow-origin" not in hdrs, "an origin not listed gets no CORS header", hdrs)
        # a stream too
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", sv.port, timeout=TIMEOUT)
        c.request("POST", "/v1/chat/completions", body=json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "2+2?"}], "stream": True,
                                                                   "max_tokens": 2}),
                  headers=dict(auth, Origin="http://b.test:8000"))
        r = c.getresponse()
        r.read()
        check(r.status == 200 and r.getheader("Access-Control-Allow-Origin") == "http://b.test:8000", "a streamed reply carries the CORS header",
              r.getheaders())
        c.close()
        status, _, body = sv.http_full("GET", "/props", headers=auth)
        check(status == 200 and body["server"]["cors_origins"] == ["http://a.test", "http://b.test:8000"] and body["server"]["api_key_required"] is True
              and "sekrit" not in json.dumps(body), "/props lists the origins and says a key is needed, without the key", body)
    finally:
        check(sv.stop() == 0, "the CORS server stops cleanly")
    sv = Server("--cors-origin", "*")
    try:
        status, hdrs, _ = sv.http_full("GET", "/health", headers={"Origin": "http://anything.test"})
        check(status == 200 and hdrs.get("access-control-allow-origin") == "*", "--cors-origin '*' allows every origin", hdrs)
    finally:
        sv.stop()
    for bad in ("http://a.test/path", "a.test", "http://", "http://a.test, http://b.test"):
        out = subprocess.run([G4, "serve", "-m", MODEL, "--port", "0", "--cors-origin", bad], capture_output=True, text=True, timeout=TIMEOUT)
        check(out.returncode != 0 and out.stderr.count("\n") == 1 and "--cors-origin" in out.stderr, "--cors-origin %r refused in one line" % bad,
              (out.returncode, out.stderr))
    out = subprocess.run([G4, "serve", "-m", MODEL, "--port", "0", "--pooling", "max"], capture_output=True, text=True, timeout=TIMEOUT)
    check(out.returncode != 0 and "--pooling" in out.stderr, "--pooling max refused", out.stderr)


# ---------------------------------------------------------------- /tokenize, /detokenize, /props

TEXTS = ["Hello world", "Problem: 12 + 30 = ?", " leading space and\ttab\nnewline", "unicode 媽 and emoji 🤗", "<start_of_turn>user\nhi<end_of_turn>",
         "x" * 300]


def test_tokenize(sv):
    want = g4_tokenize(TEXTS)
    want_plain = g4_tokenize(TEXTS, "--plain")
    want_bos = g4_tokenize(TEXTS[:1], "--add-bos")[0]
    for text, ids, plain in zip(TEXTS, want, want_plain):
        status, body = sv.http("POST", "/tokenize", {"content": text})
        check(status == 200 and body == {"tokens": ids}, "/tokenize %r: g4 tokenize's ids" % text[:30], (status, body, ids))
        status, body = sv.http("POST", "/tokenize", {"content": text, "parse_special": False})
        check(status == 200 and body == {"tokens": plain}, "/tokenize parse_special false %r: g4 tokenize --plain's ids" % text[:30], (body, plain))
        status, body = sv.http("POST", "/detokenize", {"tokens": ids})
        check(status == 200 and body == {"content": text}, "/detokenize gives %r back" % text[:30], (status, body))
        status, body = sv.http("POST", "/tokenize", {"content": text, "with_pieces": True})
        pieces = body.get("tokens", []) if isinstance(body, dict) else []
        joined = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
        check(status == 200 and [p["id"] for p in pieces] == ids and joined == text.encode(), "with_pieces %r: the ids, pieces that spell the text" % text[:30],
              body)
    status, body = sv.http("POST", "/tokenize", {"content": TEXTS[0], "add_special": True})
    check(status == 200 and body == {"tokens": want_bos}, "add_special puts BOS first (g4 tokenize --add-bos)", (body, want_bos))
    status, body = sv.http("POST", "/tokenize", {"content": ""})
    check(status == 200 and body == {"tokens": []}, "/tokenize of the empty text: no tokens", body)
    bad = [("/tokenize", {}, "content"), ("/tokenize", {"content": 5}, "content"), ("/tokenize", {"content": "a", "with_pieces": "yes"}, "with_pieces"),
           ("/detokenize", {}, "tokens"), ("/detokenize", {"tokens": [1, -1]}, "tokens"), ("/detokenize", {"tokens": [1, 1e9]}, "tokens"),
           ("/detokenize", {"tokens": [1.5]}, "tokens"), ("/detokenize", {"tokens": "12"}, "tokens")]
    for path, body, param in bad:
        status, out = sv.http("POST", path, body)
        check(status == 400 and is_error_shape(out, 400, param=param), "%s %s: 400 naming %s" % (path, json.dumps(body), param), (status, out))
    for raw in ("not json", "[1,2]", b"{\"content\": \"\xff\"}"):
        status, out = sv.http("POST", "/tokenize", raw)
        check(status == 400 and is_error_shape(out, 400), "/tokenize of %r: 400 JSON" % raw, (status, out))


def test_props():
    sv = Server("--parallel", "3", "--ctx", "1024", "--alias", "my-model", "--queue", "5", "--pooling", "last", "--max-body", "64k")
    try:
        status, body = sv.http("GET", "/props")
        s = body.get("server", {}) if isinstance(body, dict) else {}
        check(status == 200 and body["total_slots"] == 3 and body["n_ctx"] == 1024 and body["model_alias"] == "my-model" and s.get("queue") == 5 and
              s.get("pooling") == "last" and s.get("max_body") == 65536 and s.get("api_key_required") is False and s.get("cors_origins") == [],
              "/props gives the flags' settings", body)
        with open(os.path.join(MODEL, "generation_config.json")) as f:
            gen = json.load(f)
        params = body["default_generation_settings"]["params"]
        check(all(abs(params[k] - gen[k]) < 1e-6 for k in ("temperature", "top_k", "top_p") if k in gen),
              "/props' default sampling is generation_config.json's", (params, gen))
        status, out = sv.http("POST", "/props", {"n_ctx": 5})
        check(status == 405 and is_error_shape(out, 405), "/props is read-only (POST: 405)", (status, out))
    finally:
        sv.stop()


# ---------------------------------------------------------------- /v1/embeddings

def golden_final_norm():
    """transformers' final_norm rows [T][H] of tiny-bf16's golden input_ids, and the ids."""
    with open(os.path.join(FIXTURE, "golden.safetensors"), "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    t = header["final_norm"]
    start, end = t["data_offsets"]
    rows, width = t["shape"]
    flat = struct.unpack("<%df" % (rows * width), blob[8 + n + start:8 + n + end])
    with open(os.path.join(FIXTURE, "golden.json")) as f:
        ids = json.load(f)["input_ids"]
    return [list(flat[i * width:(i + 1) * width]) for i in range(rows)], ids


def l2(v):
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


def test_embeddings_golden():
    """Pooled, normalised final hidden states of the fixture equal transformers' (float activations;
    the fixture's float64 run lands within 1.6e-5 of float32's, which bounds a correct engine)."""
    rows, ids = golden_final_norm()
    mean = l2([sum(r[k] for r in rows) / len(rows) for k in range(len(rows[0]))])
    last = l2(rows[-1])
    prefix_mean = l2([sum(r[k] for r in rows[:10]) / 10 for k in range(len(rows[0]))])
    d = tempfile.mkdtemp(prefix="g4-embed-")
    try:
        for f in ("config.json", "model.safetensors", "generation_config.json"):
            os.symlink(os.path.join(FIXTURE, f), os.path.join(d, f))
        os.symlink(os.path.join(MODEL, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
        name = os.path.basename(d)
        for pooling, want in (("mean", mean), ("last", last)):
            sv = Server("-m", d, "--act", "float", "--pooling", pooling, "--parallel", "2")
            try:
                status, body = sv.http("POST", "/v1/embeddings", {"model": name, "input": ids})
                got = body["data"][0]["embedding"] if status == 200 else []
                check(status == 200 and max_diff(got, want) < 1e-4, "%s pooling of tiny-bf16 equals transformers' final_norm, pooled and L2-normalised" % pooling,
                      (status, max_diff(got, want) if got else body))
                if pooling == "mean":
                    # a batch of inputs of different lengths, each as if alone (rows of one g4_decode, slot after slot)
                    status, body = sv.http("POST", "/v1/embeddings", {"model": name, "input": [ids[:10], ids, ids[:10]]})
                    vecs = [x["embedding"] for x in body["data"]] if status == 200 else []
                    check(len(vecs) == 3 and max_diff(vecs[0], prefix_mean) < 1e-4 and max_diff(vecs[1], mean) < 1e-4 and vecs[2] == vecs[0] and
                          body["usage"]["prompt_tokens"] == 44, "three inputs in one request: each its golden vector, usage counts 44 tokens",
                          (status, body.get("usage") if isinstance(body, dict) else body))
                    status, body = sv.http("POST", "/v1/embeddings", {"model": name, "input": "hello there"})
                    check(status == 400 and is_error_shape(body, 400, param="input"), "a text with tokens the model's vocabulary lacks: 400", (status, body))
            finally:
                check(sv.stop() == 0, "the %s-pooling server stops cleanly" % pooling)
    finally:
        shutil.rmtree(d)


def test_embeddings(sv):
    client = sv.client()
    texts = ["What is 12 plus 30?", "A train travels 60 miles in 1.5 hours.", "unicode 媽 🤗"]
    one = [client.embeddings.create(model=MODEL_ID, input=t) for t in texts]
    batch = client.embeddings.create(model=MODEL_ID, input=texts)
    floats = client.embeddings.create(model=MODEL_ID, input=texts, encoding_format="float")
    ids = [[2] + x for x in g4_tokens_many(texts)]
    by_ids = client.embeddings.create(model=MODEL_ID, input=ids)
    vec = [r.data[0].embedding for r in one]
    check(all(len(v) == len(vec[0]) > 0 and abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5 for v in vec),
          "embeddings.create: unit vectors of the hidden size", [len(v) for v in vec])
    check([d.embedding for d in batch.data] == vec and [d.index for d in batch.data] == [0, 1, 2], "a batch of texts: each text's vector, in order",
          [d.index for d in batch.data])
    check([[f32(x) for x in d.embedding] for d in floats.data] == vec, "encoding_format float: the same float32s as base64 (the client's default)")
    check([d.embedding for d in by_ids.data] == vec, "token-id inputs ([BOS] + g4 tokenize's ids) give the texts' vectors")
    check(batch.usage.prompt_tokens == sum(len(x) for x in ids) == batch.usage.total_tokens and batch.model == MODEL_ID,
          "usage.prompt_tokens counts BOS and the texts' tokens", batch.usage)
    check(max(abs(a - b) for a, b in zip(vec[0], vec[1])) > 1e-3, "different texts give different vectors")
    status, body = sv.http("POST", "/v1/embeddings", {"model": MODEL_ID, "input": texts[0], "encoding_format": "base64"})
    raw = base64.b64decode(body["data"][0]["embedding"]) if status == 200 else b""
    check(list(struct.unpack("<%df" % (len(raw) // 4), raw)) == vec[0], "base64: the vector's float32 bytes, little-endian", status)
    bad = [({"model": MODEL_ID, "input": ""}, "input", 400), ({"model": MODEL_ID, "input": []}, "input", 400),
           ({"model": MODEL_ID, "input": ["ok", ""]}, "input[1]", 400), ({"model": MODEL_ID, "input": [[1, 2], []]}, "input[1]", 400),
           ({"model": MODEL_ID, "input": [1, 99999]}, "input", 400), ({"model": MODEL_ID, "input": 5}, "input", 400),
           ({"model": MODEL_ID}, "input", 400), 
           ({"model": MODEL_ID, "input": "x", "encoding_format": "int8"}, "encoding_format", 400),
           ({"model": MODEL_ID, "input": ["x"] * 2049}, "input", 400)]
    for body, param, code in bad:
        status, out = sv.http("POST", "/v1/embeddings", body)
        check(status == code and is_error_shape(out, code, param=param), "embeddings %s: %d naming %s" % (json.dumps(body)[:60], code, param), (status, out))
    status, out = sv.http("POST", "/v1/embeddings", {"model": MODEL_ID, "input": [[2] * 2049]})
    check(status == 400 and is_error_shape(out, 400, code="context_length_exceeded", param="input[0]"), "an input past the context: 400 context_length_exceeded",
          (status, out))
    test_embeddings_beside_chats(sv, texts, vec)
    m = sv.metrics()
    # 3 single texts, 5 batches of the 3 and one of 1 answered: 19 inputs, the 3 texts' tokens 6 times and the first's once more
    check(m.get('g4_requests_total{endpoint="/v1/embeddings",status="200"}') == 9 and m.get("g4_embedding_inputs_total") == 19 and
          m.get("g4_embedding_tokens_total") == 6 * sum(len(x) for x in ids) + len(ids[0]),
          "/metrics counts the embeddings answered, their inputs and tokens", {k: v for k, v in m.items() if "embed" in k})
    # a one-model server takes any model name, or none (without --strict-model), and names its own
    for body in ({"input": texts[0]}, {"model": "text-embedding-3-small", "input": texts[0]}):
        status, out = sv.http("POST", "/v1/embeddings", body)
        check(status == 200 and out.get("model") == MODEL_ID and max(abs(a - b) for a, b in zip(out["data"][0]["embedding"], vec[0])) < 1e-6,
              "embeddings with model %r: the server's model answers" % body.get("model"), (status, str(out)[:200]))


def test_embeddings_beside_chats(sv, texts, vec):
    """Embeddings computed while chats stream in the other slots: each side gets what it gets alone
    (the inputs' rows share the engine's steps, never a sequence)."""
    import threading
    client = sv.client()
    question = serve_util.problem(3)
    alone = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": question}], temperature=0).choices[0].message.content
    chats, embeds, errors = [], [], []

    def chat():
        try:
            parts = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": question}], temperature=0, stream=True)
            chats.append("".join(c.choices[0].delta.content or "" for c in parts if c.choices))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def embed():
        try:
            embeds.append([d.embedding for d in client.embeddings.create(model=MODEL_ID, input=texts).data])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (chat, embed, chat, embed)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors and chats == [alone, alone] and embeds == [vec, vec],
          "two streamed chats and two embeddings at once: each equal to its answer alone", (errors, chats == [alone, alone], embeds == [vec, vec]))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def g4_tokens_many(texts):
    return [g4_tokens(t) for t in texts]


def test_embeddings_cancel_and_drain():
    """A client that leaves mid-way stops its embedding job and frees its slot; a drain past
    --drain-timeout ends a running one with a 503 (each engine step paused 50 ms, so that the
    40 inputs of 100 tokens take about 60 steps)."""
    import socket
    body = json.dumps({"model": MODEL_ID, "input": [[2] + [100 + i] * 99 for i in range(40)]}).encode()
    req = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    sv = Server("--parallel", "2", "--test-step-ms", "50", "--drain-timeout", "1")
    try:
        s = socket.create_connection(("127.0.0.1", sv.port))
        s.sendall(req)
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and sv.metrics().get("g4_slots_active") != 1:
            time.sleep(0.02)
        s.close()
        while time.time() < deadline and sv.metrics().get("g4_requests_cancelled_total") != 1:
            time.sleep(0.05)
        m = sv.metrics()
        check(m.get("g4_requests_cancelled_total") == 1 and m.get("g4_slots_active") == 0 and m.get("g4_embedding_inputs_total") == 0,
              "a client leaving mid-way stops its embedding job and frees the slot", m)
        status, body_ok = sv.http("POST", "/v1/embeddings", {"model": MODEL_ID, "input": "after"})
        check(status == 200 and len(body_ok["data"]) == 1, "the next embedding request is answered", status)
        result = {}

        def long_one():
            result["r"] = sv.http("POST", "/v1/embeddings", json.loads(body))

        t = threading.Thread(target=long_one)
        t.start()
        while time.time() < deadline and sv.metrics().get("g4_slots_active") != 1:
            time.sleep(0.02)
        sv.proc.send_signal(signal.SIGTERM)
        t.join(TIMEOUT)
        status, out = result.get("r", (None, None))
        check(status == 503 and is_error_shape(out, 503), "a drain past --drain-timeout ends a running embedding job with a 503", (status, out))
    finally:
        check(sv.stop() == 0, "the server exits 0 after the drain", "".join(sv.log[-5:]))


def run():
    sv = Server("--ctx", "2048", "--parallel", "4")
    try:
        test_routes(sv)
        test_no_cors(sv)
        test_tokenize(sv)
        test_embeddings(sv)
    finally:
        check(sv.stop() == 0, "the endpoints server stops cleanly", "".join(sv.log[-5:]))
    test_cors()
    test_props()
    test_embeddings_golden()
    test_embeddings_cancel_and_drain()
