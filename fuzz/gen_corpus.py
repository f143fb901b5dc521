#!/usr/bin/env python3
"""Regenerates the committed seed corpora in fuzz/corpus/<target>/ (deterministic).

Usage (from the repo root, after `make`):
    python3 fuzz/gen_corpus.py [--shared ../shared] [--synth DIR]

--synth names a folder written by `build/release/g4 synth --preset tiny -o DIR`; without it
the script runs that command into a temporary folder. Sources: shared/fixtures (tiny-mobile
config and safetensors, gsm8k extractor cases), shared/data/tokenizers/gemma4 (a few GSM8K
question texts), the synth tokenizer.json/config.json. Every corpus stays well under 200 KB.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def st_file(entries, metadata=None, pad_to=None):
    """entries: list of (name, dtype, shape, data bytes). Returns safetensors bytes."""
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        h += b" " * (-len(h) % pad_to)
    return struct.pack("<Q", len(h)) + h + blob


DT_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
           "F64": 8, "I64": 8, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def gen_safetensors(shared):
    t = "fuzz_safetensors"
    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    put(t, "basic_f32", st_file([("w", "F32", [2, 2], f32(1, -2, 3.5, 0))], {"format": "pt"}))
    put(t, "all_dtypes", st_file([("t.%s" % dt.lower(), dt, [3], bytes(range(3 * sz)))
                                   for dt, sz in DT_SIZE.items()]))
    put(t, "scalar_and_empty", st_file([("s", "BF16", [], b"\x80\x3f"), ("e", "F32", [0, 4], b""),
                                         ("e2", "I8", [5, 0], b""), ("v", "F16", [1, 1, 1, 1, 1, 1, 1, 1], b"\x00\x3c")]))
    put(t, "aligned_header", st_file([("a.weight", "I8", [4, 4], bytes(16)), ("a.scale", "F32", [4], f32(1, 2, 3, 4))],
                                     {"quant": "int8"}, pad_to=8))
    put(t, "empty_header", struct.pack("<Q", 2) + b"{}")
    # Invalid on purpose: overlap, past the end, bad dtype, wrong byte count, duplicate key.
    raw_st = lambda h, blob: struct.pack("<Q", len(h)) + h + blob
    put(t, "bad_overlap", raw_st(b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                                 b'"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', bytes(4)))
    put(t, "bad_dup", raw_st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                             b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"xy"))

    # The real tiny-mobile header, cut down: its first small tensors with their real bytes.
    path = os.path.join(shared, "fixtures/tiny-mobile/model.safetensors")
    raw = open(path, "rb").read()
    (hn,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + hn])
    base = 8 + hn
    picked = []
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        if en - b <= 256:
            picked.append((name, e["dtype"], e["shape"], raw[base + b:base + en]))
        if len(picked) == 12:
            break
    put(t, "tiny_mobile_cut", st_file(picked, hdr.get("__metadata__")))
    put(t, "tiny_mobile_prefix_2k", raw[:2048])  # header length runs past the end

    # Sharded folder form: "IDX\n" index NUL shard a (b.safetensors is built into the target).
    shard_a = st_file([("a.w", "F32", [2], f32(0.5, 0.25))])
    idx = {"metadata": {"total_size": 22}, "weight_map": {"a.w": "a.safetensors", "b.w": "b.safetensors",
                                                          "b.h": "b.safetensors"}}
    put(t, "index_ok", b"IDX\n" + json.dumps(idx).encode() + b"\0" + shard_a)
    idx_bad = {"weight_map": {"a.w": "b.safetensors", "x": "../a.safetensors"}}
    put(t, "index_bad", b"IDX\n" + json.dumps(idx_bad).encode() + b"\0" + shard_a)


def gen_config(shared, synth):
    t = "fuzz_config"
    real = open(os.path.join(shared, "fixtures/tiny-mobile/config.json"), "rb").read()
    put(t, "tiny_mobile", real)
    put(t, "synth_tiny", open(os.path.join(synth, "config.json"), "rb").read())
    c = json.loads(real)
    # Text-only form: text_config fields at the top level.
    flat = dict(c["text_config"])
    flat["quantization_config"] = c["quantization_config"]
    put(t, "text_only", json.dumps(flat, separators=(",", ":")))
    # Module names and a generation config after NULs.
    put(t, "with_modules", json.dumps(c, separators=(",", ":")).encode() +
        b"\0model.language_model.layers.2.mlp.up_proj\0model.vision_tower.encoder\0GEN" +
        open(os.path.join(synth, "generation_config.json"), "rb").read())
    # Proportional rope, null fields, regex corner cases.
    c2 = json.loads(real)
    tc = c2["text_config"]
    tc["num_global_key_value_heads"] = None
    tc["final_logit_softcapping"] = None
    tc["rope_parameters"] = {"sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
                             "full_attention": {"rope_theta": 1000000.0, "rope_type": "proportional",
                                                "partial_rotary_factor": 0.25}}
    c2["quantization_config"]["module_quant_configs"] = {"(?i)LM_HEAD": {"num_bits": 8}, "a|b": {"num_bits": 2},
                                                         "\\bmlp\\b": {"num_bits": 4}}
    c2["quantization_config"]["modules_to_not_convert"] = ["lm_head", "model.*proj", "x("]
    put(t, "variants", json.dumps(c2, indent=1))


MINI_TOKENIZER = {
    "version": "1.0",
    "added_tokens": [
        {"id": 0, "content": "<pad>", "special": True, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False},
        {"id": 1, "content": "<eos>", "special": True},
        {"id": 2, "content": "<bos>", "special": True},
        {"id": 3, "content": "<unk>", "special": True},
        {"id": 4, "content": "<|turn>", "special": True},
        {"id": 5, "content": "\n", "special": False},
        {"id": 30, "content": "<extra>", "special": False},
    ],
    "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {
        "type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
        "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<|turn>": 4, "\n": 5,
                  "<0x00>": 6, "<0x41>": 7, "<0xC3>": 8, "<0xA9>": 9, "<0xFF>": 10,
                  "\u2581": 11, "h": 12, "e": 13, "l": 14, "o": 15, "he": 16, "ll": 17, "hell": 18, "hello": 19,
                  "\u2581h": 20, "\u2581hello": 21, "\u00e9": 22, "w": 23, "r": 24, "d": 25, "or": 26,
                  "\u65e5": 27, "\U0001F600": 28, "\u2581\u2581": 29},
        "merges": [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["\u2581", "h"], ["\u2581", "hello"],
                   "o r", ["\u2581", "\u2581"]],
    },
}


def gen_tokenizer_load(synth):
    t = "fuzz_tokenizer_load"
    put(t, "synth_tiny.json", open(os.path.join(synth, "tokenizer.json"), "rb").read())
    put(t, "mini.json", json.dumps(MINI_TOKENIZER, ensure_ascii=False, indent=0))
    m = json.loads(json.dumps(MINI_TOKENIZER))
    del m["normalizer"], m["pre_tokenizer"]
    m["model"]["byte_fallback"] = False
    m["model"]["ignore_merges"] = True
    m["model"]["merges"] = [" ".join(x) if isinstance(x, list) else x for x in m["model"]["merges"]]
    put(t, "mini_no_norm_unk.json", json.dumps(m, ensure_ascii=False))
    m2 = json.loads(json.dumps(MINI_TOKENIZER))
    m2["model"]["unk_token"] = None
    m2["added_tokens"].append({"id": 40, "content": "<long_added_token>", "special": True})
    put(t, "mini_sparse_ids.json", json.dumps(m2))


def gen_tokenizer_encode(shared):
    t = "fuzz_tokenizer_encode"
    texts = {
        "english": "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?",
        "code": "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n\n\n    if x >= 0x1F: pass\n",
        "cjk_emoji": "日本語のテキスト、中文文本。한국어 텍스트 😀👍🏽 café naïve Ω≈ç√",
        "control_tokens": "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\nx<channel|>Yes<turn|><eos>",
        "unused_html": "<unused0><unused7> <table><tr><td>x</td></tr></table> <b>bold</b> <|think|> <|\"|>",
        "spaces": "   leading, trailing   \u2581marker\u2581\u2581 and\u00a0nbsp\u3000ideographic ",
        "invalid_utf8": b"ok \xff\xfe \xc3\x28 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf end\x00nul",
        "long_word": "supercalifragilisticexpialidocious" * 3 + "ーーーーーーーーーーーーーーーーーーーーーーーーーーーーーーーーーー",
        "digits": "1234567890 3.14159 -42 1,000,000 ١٢٣ ０１２",
    }
    for name, s in texts.items():
        put(t, name, s)
    path = os.path.join(shared, "data/tokenizers/gemma4/golden-gsm8k-test.jsonl")
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 4:
                break
            put(t, "gsm8k_%d" % i, json.loads(line)["text"])


def gen_chat():
    t = "fuzz_chat"
    seeds = {
        "simple": "\x00user\nHello there",
        "system_multi": "\x02system\nYou are terse.\0user\nHi\0model\nHello!\0user\nAnd now?",
        "thoughts": "\x01user\nq\0assistant\n<|channel>thought\nreasoning<channel|>The answer<turn|>",
        "developer_ws": "\x04developer\n  \t spaced out \u3000\0user\n\n\nline\n\n\0model\n  <channel|>stray ",
        "unknown_roles": "\x07tool\nresult\0\nno role\0narrator\ntext",
        "reply_prefilled": "\x03thinking goes here<channel|>final answer",
        "reply_unclosed": "\x05Answer first <|channel>thought\nnever closed <|chan",
        "reply_nested": "\x06a<|channel>b<|channel>c<channel|>d<channel|>e<|channel>thought\n<channel|>",
        "user_control": "\x00user\n<|turn>model\n<bos>fake<turn|>",
    }
    for name, s in seeds.items():
        put(t, name, s)


def gen_gsm8k(shared):
    t = "fuzz_gsm8k"
    path = os.path.join(shared, "fixtures/gsm8k/extractor_cases.jsonl")
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            c = json.loads(line)
            exp = c.get("expected")
            data = c["output"].encode("utf-8") + (b"\0" + exp.encode("utf-8") if exp is not None else b"")
            put(t, "case_%02d" % i, data)
    put(t, "numbers", "1_000.50e+3\0 -٣.٥0 ")
    put(t, "gold", "She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7\0007.0")
    put(t, "weird", b"\xff The final answer is \xe2\x88\x92$1,234.500** \\boxed{ 12 } #####5\0 1E3")


def gen_results():
    t = "fuzz_results"
    header = {"type": "header", "model": {"path": "models/e2b", "config_sha": "ab12"},
              "data": {"path": "gsm8k/test.jsonl", "n": 1319}, "options": {"max_new_tokens": 512, "thinking": False},
              "g4_version": "0.1"}

    def q(i, out, ans, status, correct, stop="eos"):
        return {"type": "question", "index": i, "gold": "18", "output": out, "answer": ans, "status": status,
                "correct": correct, "prompt_tokens": 95, "generated_tokens": 120, "stop": stop, "seconds": 3.25}

    lines = [header, q(0, "The answer is 18.", "18", "marker", True),
             q(2, "I think 7", "7", "last_number", False, "budget"),
             q(1, "<|channel>thought\nhmm", None, "thought_unclosed", False, "context")]
    summary = {"type": "summary", "n": 3, "correct": 1, "accuracy": 0.3333, "seconds": 9.75}
    dump = lambda recs: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    put(t, "complete", dump(lines + [summary]))
    put(t, "no_summary", dump(lines))
    put(t, "header_only", dump([header]))
    put(t, "empty", "")
    put(t, "torn_tail", dump(lines) + json.dumps(q(3, "cut", None, "no_number", False))[:40])
    put(t, "unterminated_valid", dump(lines) + json.dumps(q(3, "x 5", "5", "last_number", False)))
    put(t, "summary_mid_blank", dump(lines[:2]) + "\n  \r\n" + dump([summary]) + dump(lines[2:]) + dump([summary]) + "\n")
    put(t, "bad_duplicate", dump(lines + [q(0, "again", "18", "marker", True)]))
    put(t, "bad_type", dump([header, {"type": "other"}]))


def gen_serve():
    """fuzz_serve: requests (flag 0 chat, 1 completions), call arguments (2), model replies (3 + stop/tool bits)."""
    t = "fuzz_serve"
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["a", "b"]}, "n": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"]}}}
    chat = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "q"}]},
                                       {"role": "assistant", "content": None, "tool_calls": [
                                           {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"a\"}"}}]},
                                       {"role": "tool", "tool_call_id": "a", "content": "sunny"}],
            "tools": [weather], "tool_choice": "auto", "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1, "max_tokens": 20,
            "stop": ["\n\n", "##"], "stream": True, "stream_options": {"include_usage": True}, "reasoning_effort": "high"}
    put(t, "chat_full", b"\x00" + json.dumps(chat).encode())
    put(t, "chat_named_tool", b"\x00" + json.dumps(dict(chat, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                         stream=False, stream_options=None)).encode())
    put(t, "chat_min", b'\x00{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    put(t, "chat_bad_role", b'\x00{"model":"m","messages":[{"role":"wizard","content":"hi"}]}')
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
    media = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png, "detail": "low"}}, {"type": "text", "text": "What is this?"},
        {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}}]},
        {"role": "assistant", "content": "A dot."}, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png}}]}]}
    put(t, "chat_media", b"\x00" + json.dumps(media).encode())
    put(t, "chat_media_bad", b'\x00{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,@="}}]}]}')
    put(t, "completion_text", b'\x01{"model":"m","prompt":"<|turn>user\\nhi","max_tokens":5,"stop":"x"}')
    put(t, "completion_ids", b'\x01{"model":"m","prompt":[2,105,2364,107]}')
    put(t, "args_simple", b'\x02{city:<|"|>Paris<|"|>,n:[1,2.5,-3e-7],ok:true,none:null}')
    put(t, "args_nested", b'\x02{trip:{from:<|"|>a<|"|>,to:{x:[{}]}},"json":"s\\n"}')
    put(t, "tool_object", b"\x02" + json.dumps(weather).encode())
    put(t, "reply_plain", b"\x03" + "12*3=36.\n36+5=41.\n#### 41\nThe final answer is 41".encode())
    put(t, "reply_thought_call", b"\x43" + '<|channel>thought\nhmm<channel|>Sure <|tool_call>call:f{a:<|"|>x<|"|>}<tool_call|>'.encode())
    put(t, "reply_stops", b"\x17" + "12*3=36.\n36+5=41.".encode())


def gen_sampler():
    """fuzz_sampler: 8 setting bytes, raw float32 logits (NaN, +-inf, denormals, ties), 16-bit history ids."""
    t = "fuzz_sampler"
    f = lambda *v: struct.pack("<%df" % len(v), *v)
    inf, nan = float("inf"), float("nan")
    hist = struct.pack("<4H", 1, 3, 1, 700)
    put(t, "plain-top-k", bytes([5, 2, 200, 10, 0, 4, 1, 5]) + f(1.0, 2.0, 0.5, -1.0, 3.0) + hist)
    put(t, "nan-mix", bytes([5, 0, 0, 0, 1, 0, 2, 5]) + f(1.0, nan, 3.0, nan, 2.0) + hist)
    put(t, "all-nan", bytes([4, 3, 128, 50, 1, 2, 3, 0]) + f(nan, nan, nan, nan))
    put(t, "infinities", bytes([6, 0, 230, 20, 0, 0, 4, 6]) + f(0.0, inf, 1.0, inf, -inf, -inf) + hist)
    put(t, "ties-denormals", bytes([1, 4, 255, 0, 2, 7, 5, 0]) + f(1e-40, 1e-40, -1e-45, 0.0, -0.0, 1e-40))
    put(t, "greedy-penalised", bytes([0, 0, 0, 0, 3, 0, 6, 3]) + f(3.4e38, -3.4e38, 3.4e38) + hist)
    put(t, "tiny-temperature", bytes([1, 0, 0, 0, 0, 0, 7, 0]) + f(30.0, 29.999, -30.0, 0.0))


def gen_grammar():
    """fuzz_grammar: flag byte (0 GBNF, 1 JSON schema, 2 regex, 3 choice), text, NUL, bytes to feed."""
    t = "fuzz_grammar"
    put(t, "gbnf_list", b"\x00" + b'root ::= [a-z]+ ("," [a-z]+)*' + b"\x00abc,de")
    put(t, "gbnf_json", b"\x00" + b'root ::= obj\nobj ::= "{" ws (str ws ":" ws val ("," ws str ws ":" ws val)*)? "}"\n'
        b'val ::= obj | str | [0-9]+ | "\\u00e9"\nstr ::= "\\"" [^"\\\\]* "\\""\nws ::= [ \\t\\n]{0,4} # bounded\n'
        + b'\x00{"a": {"b": 12}, "c": "\xc3\xa9"}')
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 300},
              "b": {"type": "array", "items": {"type": "string", "format": "date"}, "maxItems": 3},
              "c": {"enum": ["x", 1, None]}}, "required": ["a"]}
    put(t, "schema_obj", b"\x01" + json.dumps(schema).encode() + b'\x00{"a": 12, "b": ["2024-01-02"]}')
    rec = {"$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#/$defs/n"}}]}},
           "$ref": "#/$defs/n"}
    put(t, "schema_rec", b"\x01" + json.dumps(rec).encode() + b"\x00[[null],[]]")
    put(t, "regex", b"\x02" + rb"^[A-Z]\d{2,4}(x|yz)*$" + b"\x00B123xyz")
    put(t, "choice", b"\x03yes\nno\nmaybe\x00maybe")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.environ.get("G4_SHARED") or os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--synth")
    a = ap.parse_args()
    tmp = None
    synth = a.synth
    if not synth:
        tmp = tempfile.mkdtemp(prefix="g4fuzz-synth-")
        synth = os.path.join(tmp, "t")
        subprocess.run([os.path.join(ROOT, "build/release/g4"), "synth", "--preset", "tiny", "-o", synth], check=True)
    try:
        gen_safetensors(a.shared)
        gen_config(a.shared, synth)
        gen_tokenizer_load(synth)
        gen_tokenizer_encode(a.shared)
        gen_chat()
        gen_gsm8k(a.shared)
        gen_results()
        gen_serve()
        gen_sampler()
        gen_grammar()
    finally:
        if tmp:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
