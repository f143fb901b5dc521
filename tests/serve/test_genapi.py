"""g4 serve's generation features (issue 33): logprobs / top_logprobs against the transformers goldens
of the tiny-mobile fixture and in OpenAI's shapes through the official client; n choices against
g4 run and against single requests with the per-choice seeds; frequency / presence penalties and
logit_bias against g4 run's flags and by their definition; the server's sampling and budget defaults.
test_serve.py's main() calls run()."""
import json
import math
import os
import struct
import tempfile

from serve_util import MODEL, MODEL_ID, ROOT, Server, check, chat_body, g4_run, g4_tokens, problem, sse_events, raw_stream

SHARED = os.environ.get("G4_SHARED") or os.path.join(ROOT, "..", "shared")
TINY = os.path.join(SHARED, "fixtures", "tiny-mobile")
# Float mode against transformers' float32 goldens: the fixture's README measures the logits of an
# independent float64 run within 1.4e-5 of them; a log-softmax moves by at most twice a logit's
# error, and float32 rounding of the reported values adds ~1e-6. The band is 10x that.
LOGPROB_BAND = 3e-4


def safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            a, b = t["data_offsets"]
            out[name] = (t["dtype"], t["shape"], data[a:b])
    return out


def rows_f32(t):
    dtype, shape, raw = t
    assert dtype == "F32"
    vals = struct.unpack("<%df" % (len(raw) // 4), raw)
    width = shape[-1]
    return [vals[i:i + width] for i in range(0, len(vals), width)]


def log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def test_logprobs_golden():
    """The tiny-mobile fixture served in float mode, its golden prompt as token ids, greedy: each
    step's token_logprobs and the values of its top 5 are the log-softmax of transformers' logits
    that chose the golden token (step_logits)."""
    if not os.path.exists(os.path.join(TINY, "golden_float.safetensors")):
        check(False, "the tiny-mobile fixture is at " + TINY)
        return
    g = safetensors(os.path.join(TINY, "golden_float.safetensors"))
    prompt = list(struct.unpack("<%di" % (len(g["input_ids"][2]) // 4), g["input_ids"][2]))
    gen = list(struct.unpack("<%di" % (len(g["generated_ids"][2]) // 4), g["generated_ids"][2]))
    steps = [log_softmax(r) for r in rows_f32(g["step_logits"])]
    with tempfile.TemporaryDirectory() as d:
        # the fixture's weights with the built-in model's tokenizer (its first 512 tokens; the
        # prompt goes in as ids, and only the reply's text needs one)
        for name in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(TINY, name), os.path.join(d, name))
        os.symlink(os.path.join(MODEL, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
        sv = Server("-m", d, "--act", "float", "--parallel", "2", "--ctx", "64")
        try:
            status, r = sv.http("POST", "/v1/completions", {"model": os.path.basename(d), "prompt": prompt, "max_tokens": len(gen),
                                                            "temperature": 0, "logprobs": 5})
            lp = r["choices"][0]["logprobs"] if status == 200 else None
            check(lp is not None and len(lp["token_logprobs"]) == len(gen), "a greedy completion of the fixture's prompt with logprobs 5", r)
            if not lp:
                return
            worst_chosen = max(abs(lp["token_logprobs"][i] - steps[i][gen[i]]) for i in range(len(gen)))
            worst_top = 0.0
            for i in range(len(gen)):
                want = sorted(steps[i], reverse=True)[:5]
                got = sorted(lp["top_logprobs"][i].values(), reverse=True)
                worst_top = max([worst_top] + [abs(a - b) for a, b in zip(got, want)] + ([math.inf] if len(got) != 5 else []))
            check(worst_chosen <= LOGPROB_BAND, "each token's logprob is the log-softmax of transformers' logits at the golden token "
                  "(worst %.2g, band %g)" % (worst_chosen, LOGPROB_BAND), lp["token_logprobs"])
            check(worst_top <= LOGPROB_BAND, "each step's top 5 logprobs are transformers' 5 largest (worst %.2g)" % worst_top, lp["top_logprobs"])
            # greedy: the chosen token is the most likely one, so its logprob is the top entry's
            check(all(lp["token_logprobs"][i] == max(lp["top_logprobs"][i].values()) for i in range(len(gen))),
                  "greedy: every chosen token's logprob is its step's largest")
            offsets, text = lp["text_offset"], r["choices"][0]["text"]
            check(offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(text), "text_offset: where each token's text begins",
                  offsets)
        finally:
            check(sv.stop() == 0, "the fixture's server stops cleanly")


def test_logprobs_client(sv):
    c = sv.client()
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(2)}], temperature=0, max_tokens=12,
                                  logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens or (len(content) == r.usage.completion_tokens - 1 and r.choices[0].finish_reason == "stop"),
          "one logprobs entry per generated token (a stop id has none)", (len(content), r.usage))
    check("".join(e.token for e in content) == r.choices[0].message.content, "the entries' tokens join to the content",
          [e.token for e in content])
    check(all(bytes(e.bytes) == e.token.encode() for e in content), "each entry's bytes are its token's UTF-8")
    check(all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob and
              e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob and e.logprob <= 0 for e in content),
          "greedy: each token is its step's most likely, the top 3 in order, logprobs <= 0")
    # sampled: the chosen token's logprob is the one its top list gives it, whenever it is there
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(3)}], temperature=1, seed=7, max_tokens=16,
                                  logprobs=True, top_logprobs=20)
    pairs = [(e.logprob, [t.logprob for t in e.top_logprobs if t.token == e.token]) for e in r.choices[0].logprobs.content]
    check(all(not tops or tops[0] == lp for lp, tops in pairs) and sum(bool(t) for _, t in pairs) > 0,
          "sampled: the chosen token's logprob equals its entry among the top 20", pairs)
    # streamed: the chunks' entries are the whole response's
    whole = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(4)}], temperature=0, max_tokens=10,
                                      logprobs=True, top_logprobs=2)
    chunks = list(c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(4)}], temperature=0, max_tokens=10,
                                            logprobs=True, top_logprobs=2, stream=True))
    streamed = [(e.token, e.logprob) for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    check(streamed == [(e.token, e.logprob) for e in whole.choices[0].logprobs.content], "streamed logprobs equal the whole response's",
          streamed)
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(4)}], temperature=0, max_tokens=4)
    check(r.choices[0].logprobs is None, "no logprobs unless asked")
    # completions through the client: logprobs N, the tokens' text and offsets
    r = c.completions.create(model=MODEL_ID, prompt=problem(5), max_tokens=12, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    check("".join(lp.tokens) == r.choices[0].text and lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))],
          "completions: the tokens join to the text, text_offset where each begins", (lp.tokens, lp.text_offset))
    check(all(len(t) == 2 and max(t.values()) == lp.token_logprobs[i] for i, t in enumerate(lp.top_logprobs)),
          "completions logprobs 2: two entries a step, the greedy token's the largest", lp.top_logprobs)


def test_n(sv):
    c = sv.client()
    want = g4_run(problem(6), extra=["--temp", "0"])
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(6)}], temperature=0, n=3)
    got = [ch.message.content for ch in r.choices]
    check([ch.index for ch in r.choices] == [0, 1, 2] and got == [want] * 3, "n=3 greedy: every choice equals g4 run --temp 0", got)
    # sampled: choice i is the single request with seed + i
    # (an open question at temperature 2 from every token: the tiny model is sure of its sums)
    body = dict(messages=[{"role": "user", "content": "Tell me a story"}], temperature=2.0, top_p=1.0, max_tokens=30, extra_body={"top_k": 0})
    r = c.chat.completions.create(model=MODEL_ID, n=3, seed=500, **body)
    singles = [c.chat.completions.create(model=MODEL_ID, seed=500 + i, **body) for i in range(3)]
    check([ch.message.content for ch in r.choices] == [s.choices[0].message.content for s in singles],
          "n=3 sampled: choice i equals the single request with seed + i", [ch.message.content for ch in r.choices])
    check(r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles) and r.usage.prompt_tokens == singles[0].usage.prompt_tokens,
          "n=3: completion tokens summed over the choices, the prompt counted once", r.usage)
    check(len({s.choices[0].message.content for s in singles}) > 1, "the per-choice seeds give different samples")
    # streamed: each index's deltas join to its choice; one finish per choice
    chunks = list(c.chat.completions.create(model=MODEL_ID, n=3, seed=500, stream=True, **body))
    texts, finishes = ["", "", ""], [0, 0, 0]
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] += choice.finish_reason is not None
    check(texts == [ch.message.content for ch in r.choices] and finishes == [1, 1, 1], "n=3 streamed: the choices by index", texts)
    # a budget of one token: the first choice ends where the others start from its prompt
    one = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(6)}], temperature=0, max_tokens=1)
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(6)}], temperature=0, n=3, max_tokens=1)
    check([ch.message.content for ch in r.choices] == [one.choices[0].message.content] * 3 and r.usage.completion_tokens == 3,
          "n=3 with max_tokens 1: three one-token choices", r)
    # completions, ids in, n=2 greedy
    status, body2 = sv.http("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "2+2=", "max_tokens": 6, "n": 2, "temperature": 0})
    check(status == 200 and [ch["index"] for ch in body2["choices"]] == [0, 1] and body2["choices"][0]["text"] == body2["choices"][1]["text"],
          "completions n=2 greedy: two equal choices", body2)


def test_penalties_and_bias(sv):
    c = sv.client()
    for field, flag in (("frequency_penalty", "--frequency-penalty"), ("presence_penalty", "--presence-penalty")):
        want = g4_run(problem(10), extra=["--temp", "0", flag, "1.5"])
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(10)}], temperature=0, **{field: 1.5})
        check(r.choices[0].message.content == want, "%s equals g4 run %s" % (field, flag), (r.choices[0].message.content, want))
    plain = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(10)}], temperature=0).choices[0].message.content
    pen = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(10)}], temperature=0,
                                    frequency_penalty=2).choices[0].message.content
    check(pen != plain, "a frequency penalty of 2 changes a greedy answer", pen)
    # logit_bias: +100 forces a token at every step, -100 keeps the greedy first token out
    seven = g4_tokens("7")
    status, r = sv.http("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "2+2=", "max_tokens": 5, "temperature": 0,
                                                    "logit_bias": {str(seven[-1]): 100}})
    check(status == 200 and r["choices"][0]["text"] == "77777", "logit_bias +100 forces its token", r)
    status, r = sv.http("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "2+2=", "max_tokens": 1, "temperature": 0})
    first = r["choices"][0]["text"]
    ids = g4_tokens(first)
    status, r = sv.http("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "2+2=", "max_tokens": 1, "temperature": 0,
                                                    "logit_bias": {str(ids[-1]): -100}})
    check(status == 200 and r["choices"][0]["text"] != first, "logit_bias -100 forbids the greedy token %r" % first, r)
    want = g4_run(problem(11), extra=["--temp", "0", "--logit-bias", "%d=5" % seven[-1]])
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(11)}], temperature=0,
                                  logit_bias={str(seven[-1]): 5})
    check(r.choices[0].message.content == want, "logit_bias equals g4 run --logit-bias", r.choices[0].message.content)


def test_server_defaults():
    """--temp 0 makes a request that sets no temperature greedy (the model's own default samples);
    --max-tokens caps a reply that sets no max_tokens."""
    sv = Server("--parallel", "2", "--temp", "0", "--max-tokens", "5")
    try:
        c = sv.client()
        want = g4_run(problem(12), extra=["--temp", "0", "-n", "5"])
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(12)}])
        check(r.choices[0].message.content == want and r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length",
              "--temp 0 --max-tokens 5: a request without them is greedy and stops after 5 tokens", (r.choices[0].message.content, want, r.usage))
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": problem(12)}], max_tokens=7)
        check(r.usage.completion_tokens == 7, "a request's max_tokens wins over --max-tokens", r.usage)
    finally:
        check(sv.stop() == 0, "the defaults' server stops cleanly")


def run():
    test_logprobs_golden()
    sv = Server("--parallel", "4", "--ctx", "2048")
    try:
        test_logprobs_client(sv)
        test_n(sv)
        test_penalties_and_bias(sv)
    finally:
        check(sv.stop() == 0, "the genapi server stops cleanly")
    test_server_defaults()
