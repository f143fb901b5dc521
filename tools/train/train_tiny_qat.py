#!/usr/bin/env python3
r"""Train a tiny Gemma 4 (text) with the mobile QAT recipe on synthetic GSM8K-shape word problems and
export it in the on-disk format of google/gemma-4-E2B-it-qat-mobile-transformers.

Subcommands (all deterministic for a given seed; see --help of each):

  tokenizer  --out DIR           train the small BPE (HF `tokenizers`) on problems of the training seed
                                 and write tokenizer.json (HF Gemma layout), tokenizer_config.json,
                                 chat_template.jinja, generation_config.json
  train      --out DIR           generate data, float warm-up, calibrate, QAT with every quantizer in the
                                 loop, export (config.json + model.safetensors), write test.jsonl, then
                                 evaluate the EXPORTED checkpoint (full fake-quant, linear clamps only, float
                                 KV, float per_layer_model_projection, float activations) and the float
                                 master weights on the held-out set; writes metrics.json and
                                 torch_answers.json (each mode's answer per question, for tests/test_quality.c)
  eval       --model DIR         re-evaluate an exported checkpoint (PyTorch, fake-quant or float acts;
                                 --write-answers adds the modes' answers to torch_answers.json)
  greedy     --model DIR         print prompt ids and the PyTorch greedy continuation (fake-quant, LR
                                 profile = g4 --act fake defaults) for a few held-out problems, as JSON
  hfcheck    --model DIR         load the export with transformers' GemmaQuantizer and compare its
                                 logits ("hf" profile and float activations) with this file's model
  g4check    --model DIR         run g4 (build/release/g4) on held-out prompts in --act fake/int/float and
                                 --profile hf; compare greedy ids (40 tokens) and prefill logits with
                                 PyTorch (--torch-ref metrics.json: the GPU greedy ids of the training run)

Reproduce the shipped model (one H200, ~5.5 min):
  python3 tools/train/train_tiny_qat.py tokenizer --out models/gemma4-tiny-math
  python3 tools/train/train_tiny_qat.py train --out /tmp/w/gemma4-tiny-math --tokenizer models/gemma4-tiny-math \
      --scratch /tmp/w --n-train 300000 --time-budget 200 --deadline 330

Tasks (--task of tokenizer/train): math (the default: the word problems above, data unchanged) or json
(tools/train/task_json.py: reply with an instance of a JSON schema given in the prompt the way instructor
Mode.JSON / LangChain json_mode send it; models/gemma4-tiny-json, its MODEL_CARD.md has the command). The
json task's evaluation scores validity against each held-out schema (and JSON-object rate, key order).

The model is written out here (not transformers' module) so that every quantization point of
shared/spec/activation-quant.md sits exactly where the spec puts it; `hfcheck` proves that the float
math equals transformers' Gemma4ForConditionalGeneration on the exported file.

Quantization (QAT): per-output-channel weights with LSQ-style learned scales and STE
(int4 attention + early MLP, int2 late MLP + lm_head, int8 per_layer_input_gate/projection, int2
token embedding, int4 PLE table with one scale per row per layer block), static int8 fake-quant with
STE at every linear input and output (scales calibrated at a percentile of |x|, --calib-tail: 1e-4 = the
99.99th, then learned), q/k/v
sharing one input scale and gate/up sharing one, int8 K (calibrated, learned) and V (fixed 6/127)
cache quantization after k_norm+RoPE / v_norm, per_layer_model_projection input/output quantization
with g4's default static scales (0.038878, 0.002353; output after the x H^-1/2), BF16 rounding (STE)
of the norms and of per_layer_model_projection. lm_head activations stay float (scales 0).
"""

import argparse
import json
import math
import os
import random
import re
import time
from collections import OrderedDict

import numpy as np

# ----------------------------------------------------------------------------------------------
# constants
# ----------------------------------------------------------------------------------------------

PMP_S_IN = 0.038878
PMP_S_OUT = 0.002353
V_CACHE_SCALE = 6.0 / 127.0

PROMPT_TEMPLATE = (
    "Solve the following math problem. Reason step by step, and end your reply with a final line of the form "
    "\"The final answer is N\", where N is just the number.\n\nProblem: {question}"
)

# Special / added tokens (id order). Newline runs are non-special added tokens as in Gemma's file.
SPECIAL_TOKENS = [
    ("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True), ("<mask>", False),
    ("<|turn>", True), ("<turn|>", True), ("<|think|>", True), ("<|channel>", True), ("<channel|>", True),
    ("<|tool>", True), ("<tool|>", True), ("<|tool_call>", True), ("<tool_call|>", True),
    ("<|tool_response>", True), ("<tool_response|>", True), ("<|\"|>", True),
    ("\n", False), ("\n\n", False),
]
SP = {t: i for i, (t, _) in enumerate(SPECIAL_TOKENS)}
PAD, EOS, BOS = SP["<pad>"], SP["<eos>"], SP["<bos>"]
TURN_START, TURN_END = SP["<|turn>"], SP["<turn|>"]
BYTE_BASE = len(SPECIAL_TOKENS)  # <0x00> .. <0xFF>

DEFAULT_ARCH = dict(
    vocab_size=768, hidden_size=256, layer_pattern="SSSFSSSF", sliding_window=64, num_attention_heads=4,
    num_key_value_heads=1, head_dim=64, global_head_dim=128, num_kv_shared_layers=4, intermediate_size=768,
    hidden_size_per_layer_input=32, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
)

CHAT_TEMPLATE = r"""{#- Gemma 4 E2B-style chat template (text only): optional system turn (with <|think|> when
    enable_thinking), user/model turns, thought blocks stripped from earlier model turns, and the
    thinking-off generation prompt "<|turn>model\n" (no empty thought block). -#}
{%- macro strip_thinking(text) -%}
    {%- set ns = namespace(result='') -%}
    {%- for part in text.split('<channel|>') -%}
        {%- if '<|channel>' in part -%}
            {%- set ns.result = ns.result + part.split('<|channel>')[0] -%}
        {%- else -%}
            {%- set ns.result = ns.result + part -%}
        {%- endif -%}
    {%- endfor -%}
    {{- ns.result | trim -}}
{%- endmacro -%}
{%- set loop_messages = messages -%}
{%- set enable_thinking = enable_thinking | default(false) -%}
{{- bos_token -}}
{%- if enable_thinking or (messages and messages[0]['role'] in ['system', 'developer']) -%}
    {{- '<|turn>system\n' -}}
    {%- if enable_thinking -%}
        {{- '<|think|>\n' -}}
    {%- endif -%}
    {%- if messages and messages[0]['role'] in ['system', 'developer'] -%}
        {{- messages[0]['content'] | trim -}}
        {%- set loop_messages = messages[1:] -%}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + role + '\n' -}}
    {%- if role == 'model' -%}
        {{- strip_thinking(message['content']) -}}
    {%- else -%}
        {{- message['content'] | trim -}}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\n' -}}
{%- endif -%}
"""

LOG_LINES = []


def log(*a):
    s = " ".join(str(x) for x in a)
    LOG_LINES.append(s)
    print(s, flush=True)


# ----------------------------------------------------------------------------------------------
# synthetic GSM8K-shape problems
# ----------------------------------------------------------------------------------------------

NAMES = [("Mia", "she"), ("Leo", "he"), ("Ava", "she"), ("Noah", "he"), ("Emma", "she"), ("Liam", "he"),
         ("Zoe", "she"), ("Omar", "he"), ("Lucy", "she"), ("Ben", "he"), ("Nina", "she"), ("Sam", "he"),
         ("Ivy", "she"), ("Max", "he"), ("Rosa", "she"), ("Tom", "he"), ("Aria", "she"), ("Eli", "he"),
         ("Maya", "she"), ("Jack", "he"), ("Lily", "she"), ("Ravi", "he"), ("Sara", "she"), ("Owen", "he")]
ITEMS = ["stickers", "marbles", "apples", "books", "coins", "cards", "pencils", "shells", "stamps", "beads",
         "cookies", "buttons", "candies", "flowers", "eggs", "toys", "rocks", "balloons", "muffins", "ribbons"]
CONTAINERS = [("box", "boxes"), ("bag", "bags"), ("pack", "packs"), ("jar", "jars"), ("crate", "crates"),
              ("basket", "baskets")]
PLACES = ["park", "school", "library", "beach", "market", "museum", "farm", "lake"]


def _amount(rng, small=False):
    r = rng.random()
    if small or r < 0.35:
        return rng.randint(2, 99)
    return rng.randint(100, 999)


def make_problem(rng):
    """One word problem: returns (question, solution_lines, answer)."""
    (name, pron), (friend, fpron) = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    other_item = rng.choice([x for x in ITEMS if x != item])
    obj = "her" if pron == "she" else "him"
    poss = "her" if pron == "she" else "his"
    n_ops = rng.choices([2, 3, 4, 5], weights=[2, 3, 3, 2])[0]
    r0 = rng.random()
    cur = rng.randint(10, 99) if r0 < 0.2 else (rng.randint(100, 999) if r0 < 0.8 else rng.randint(1000, 4999))
    sents = [f"{name} has {cur} {item}."]
    lines = []

    def who():
        return name if rng.random() < 0.5 else pron.capitalize()

    for _ in range(n_ops):
        ops = ["add", "sub", "muladd", "mulsub", "mul", "half"]
        weights = [3, 3, 3, 2, 1.5, 1.5]
        while True:
            op = rng.choices(ops, weights=weights)[0]
            if op == "sub" and cur < 5:
                continue
            if op == "mulsub" and cur < 10:
                continue
            if op == "mul" and cur > 5000:
                continue
            if op == "half" and (cur % 2 or cur < 4):
                continue
            if op in ("add", "muladd") and cur > 15000:
                continue
            break
        if op == "add":
            n = _amount(rng)
            s = rng.choice([f"{who()} buys {n} more {item}.", f"{who()} finds {n} {item}.",
                            f"{friend} gives {obj} {n} {item}.", f"{who()} gets {n} more {item}."])
            lines.append(f"{cur}+{n}={cur + n}.")
            cur += n
        elif op == "sub":
            n = rng.randint(1, cur - 1) if rng.random() < 0.5 else rng.randint(max(1, cur // 3), cur - 1)
            s = rng.choice([f"{who()} gives {n} {item} to {friend}.", f"{who()} sells {n} {item}.",
                            f"{who()} loses {n} {item}.", f"{who()} uses {n} {item}."])
            lines.append(f"{cur}-{n}={cur - n}.")
            cur -= n
        elif op == "muladd":
            a = rng.randint(2, 9)
            b = rng.randint(2, 99) if rng.random() < 0.6 else rng.randint(100, 999)
            c1, cn = rng.choice(CONTAINERS)
            s = rng.choice([f"{who()} buys {a} {cn} with {b} {item} in each {c1}.",
                            f"{friend} gives {obj} {a} {cn} of {item} with {b} {item} in each {c1}."])
            lines.append(f"{a}*{b}={a * b}.")
            lines.append(f"{cur}+{a * b}={cur + a * b}.")
            cur += a * b
        elif op == "mulsub":
            c1, cn = rng.choice(CONTAINERS)
            for _t in range(50):
                a = rng.randint(2, 9)
                b = rng.randint(2, 99) if rng.random() < 0.6 else rng.randint(100, 999)
                if a * b < cur:
                    break
            else:
                a, b = 2, (cur - 1) // 2
            s = rng.choice([f"{who()} fills {a} {cn} with {b} {item} each and sells them.",
                            f"{who()} puts {b} {item} in each of {a} {cn} and gives the {cn} away."])
            lines.append(f"{a}*{b}={a * b}.")
            lines.append(f"{cur}-{a * b}={cur - a * b}.")
            cur -= a * b
        elif op == "mul":
            k = 2 if rng.random() < 0.6 else 3
            word = "doubles" if k == 2 else "triples"
            s = f"{who()} {word} the number of {item}."
            lines.append(f"{cur}*{k}={cur * k}.")
            cur *= k
        else:  # half
            s = rng.choice([f"{who()} gives half of {poss} {item} to {friend}.", f"{who()} sells half of {poss} {item}."])
            lines.append(f"{cur}/2={cur // 2}.")
            cur //= 2
        sents.append(s)
    # distractor sentences (irrelevant numbers), inserted anywhere after the first sentence
    n_dis = rng.choices([0, 1, 2, 3], weights=[2, 4, 3, 2])[0]
    for _ in range(n_dis):
        d = rng.choice([
            f"{friend} has {_amount(rng)} {item}.",
            f"{friend} has {_amount(rng)} {other_item}.",
            f"{name} is {rng.randint(6, 80)} years old.",
            f"The {rng.choice(PLACES)} is {rng.randint(2, 99)} miles away.",
            f"{friend} buys {_amount(rng)} {other_item}.",
            f"Each of the {item} costs {rng.randint(2, 20)} dollars.",
        ])
        sents.insert(rng.randint(1, len(sents)), d)
    sents.append(rng.choice([f"How many {item} does {name} have now?", f"How many {item} does {name} have at the end?"]))
    return " ".join(sents), lines, cur


def gsm8k_answer(lines, ans):
    return "\n".join(lines) + f"\n#### {ans}"


def model_reply(lines, ans):
    """Training target (the model turn content): worked solution, GSM8K '#### N' line, and the protocol's
    closing phrase."""
    return gsm8k_answer(lines, ans) + f"\nThe final answer is {ans}"


def user_prompt(question):
    return PROMPT_TEMPLATE.format(question=question)


def chat_prompt(question):
    return "<bos><|turn>user\n" + user_prompt(question) + "<turn|>\n<|turn>model\n"


CHUNK = 10000


def _gen_chunk(args):
    seed, k, n = args[:3]
    make = args[3] if len(args) > 3 else make_problem
    rng = random.Random(seed * 1000003 + k)
    return [make(rng) for _ in range(n)]


def gen_problems_parallel(seed, n, exclude=None, workers=None, make=None, key=None):
    """Training data: fixed chunks of CHUNK problems, chunk k from Random(seed*1000003+k), so the result does
    not depend on the number of worker processes; duplicates and excluded questions are dropped. make/key: another
    task's example maker and dedup key (default: the math problems, keyed by question)."""
    import multiprocessing as mp
    key = key or (lambda prob: prob[0])
    nchunks = (n + CHUNK - 1) // CHUNK
    jobs = [(seed, k, CHUNK) + ((make,) if make else ()) for k in range(nchunks)]
    workers = workers or min(16, os.cpu_count() or 1)
    if workers > 1:
        with mp.get_context("fork").Pool(workers) as pool:
            chunks = pool.map(_gen_chunk, jobs)
    else:
        chunks = [_gen_chunk(j) for j in jobs]
    out, seen = [], set(exclude or ())
    for ch in chunks:
        for prob in ch:
            if key(prob) not in seen:
                seen.add(key(prob))
                out.append(prob)
    return out[:n]


def gen_problems(seed, n, exclude=None):
    rng = random.Random(seed)
    out, seen = [], set()
    exclude = exclude or set()
    while len(out) < n:
        q, lines, a = make_problem(rng)
        if q in seen or q in exclude:
            continue
        seen.add(q)
        out.append((q, lines, a))
    return out


# ----------------------------------------------------------------------------------------------
# tasks (--task): what the examples are, how a prompt and reply are written, how a reply is scored
# ----------------------------------------------------------------------------------------------

# trainer-side pre-split of the math task (see build_tokenizer)
MATH_PRESPLIT = "\n+|[0-9]|\u2581?[^\u2581\n0-9]+|\u2581"


class MathTask:
    """The synthetic GSM8K-shape word problems (the default; the shipped gemma4-tiny-math). An example is
    (question, solution_lines, answer)."""
    name = "math"
    presplit = MATH_PRESPLIT

    def gen_test(self, seed, n):
        return gen_problems(seed, n)

    def gen_train(self, seed, n, exclude):
        return gen_problems_parallel(seed, n, exclude=exclude)

    def key(self, ex):
        return ex[0]

    def prompt(self, ex):
        return chat_prompt(ex[0])

    def reply(self, ex):
        return model_reply(ex[1], ex[2])

    def corpus(self, seed, n):
        corpus = []
        for q, lines, a in gen_problems(seed, n):
            corpus.append(user_prompt(q))
            corpus.append(model_reply(lines, a))
        return corpus

    def messages(self, ex):
        return [{"role": "user", "content": user_prompt(ex[0])}]

    def write_test(self, path, test):
        with open(path, "w") as f:
            for q, lines, a in test:
                f.write(json.dumps({"question": q, "answer": gsm8k_answer(lines, a)}) + "\n")

    def gold(self, ex):
        return ex[2]

    def score(self, ex, text):
        """(prediction, correct, whole reply exact)"""
        pred = extract_answer(text)
        return pred, pred == ex[2], text.strip() == model_reply(ex[1], ex[2])


class JsonTask:
    """Follow a JSON schema given in the prompt (tools/train/task_json.py). An example is a dict (form, system,
    user, schema, reply); the score is whether the reply validates against its schema."""
    name = "json"
    # digits alone, newline runs, runs of spaces (the indent=2 schemas), "▁word" pieces
    presplit = "\n+|[0-9]|\u2581\u2581+|\u2581?[^\u2581\n0-9]+|\u2581"

    def __init__(self):
        import importlib.util
        spec = importlib.util.spec_from_file_location("task_json", os.path.join(os.path.dirname(os.path.abspath(__file__)), "task_json.py"))
        self.t = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.t)

    def gen_test(self, seed, n):
        return self.t.gen_examples(seed, n)

    def gen_train(self, seed, n, exclude):
        return gen_problems_parallel(seed, n, exclude=exclude, make=_json_example, key=self.t.example_key)

    def key(self, ex):
        return self.t.example_key(ex)

    def prompt(self, ex):
        return self.t.chat_prompt(ex)

    def reply(self, ex):
        return ex["reply"]

    def corpus(self, seed, n):
        corpus = []
        for ex in self.t.gen_examples(seed, n):
            corpus += [ex["system"] or "", ex["user"], ex["reply"]]
        return corpus

    def messages(self, ex):
        return ([{"role": "system", "content": ex["system"]}] if ex["system"] is not None else []) + \
            [{"role": "user", "content": ex["user"]}]

    def write_test(self, path, test):
        with open(path, "w") as f:
            for ex in test:
                f.write(json.dumps(ex, ensure_ascii=False) + "\n")

    def gold(self, ex):
        return ex["reply"]

    def score(self, ex, text):
        is_obj, valid, ordered = self.t.check_reply(text.strip(), ex["schema"])
        return {"object": is_obj, "valid": valid, "keys_in_order": ordered}, valid, text.strip() == ex["reply"]


def _json_example(rng):
    return TASKS["json"].t.make_example(rng)


TASKS = {}


def get_task(name):
    if name not in TASKS:
        TASKS[name] = {"math": MathTask, "json": JsonTask}[name]()
    return TASKS[name]


# ----------------------------------------------------------------------------------------------
# tokenizer (HF tokenizers BPE trainer for the merges; Gemma-layout tokenizer.json)
# ----------------------------------------------------------------------------------------------


def build_tokenizer(out_dir, vocab_size, seed, n_corpus, task=None):
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    task = task or get_task("math")
    corpus = task.corpus(seed, n_corpus)
    corpus += ["user", "model", "system", "thought"] * 50
    # Trainer-side pre-split only (the shipped file has Gemma's no-op Split): newline runs, single digits,
    # a lone "▁", and "▁word" pieces, so no merge ever mixes digits, newlines, or crosses a word start.
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.Replace(" ", "\u2581")
    t.pre_tokenizer = pre_tokenizers.Split(Regex(task.presplit), behavior="isolated")
    n_base = BYTE_BASE + 256
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_base, min_frequency=2, show_progress=False,
                                  special_tokens=[], limit_alphabet=200)
    t.train_from_iterator(corpus, trainer=trainer)
    tj = json.loads(t.to_str())
    tv = tj["model"]["vocab"]
    merges = tj["model"]["merges"]
    merges = [m if isinstance(m, list) else m.split(" ") for m in merges]
    vocab = OrderedDict()
    for tok, _ in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for tok, _i in sorted(tv.items(), key=lambda kv: kv[1]):
        if "\n" in tok:
            continue
        if tok not in vocab:
            vocab[tok] = len(vocab)
    merges = [m for m in merges if "\n" not in m[0] + m[1] and (m[0] + m[1]) in vocab and m[0] in vocab and m[1] in vocab]
    for m in merges:
        assert not any(ch.isdigit() for ch in m[0] + m[1]) and "\n" not in m[0] + m[1], m
    assert len(vocab) <= vocab_size, len(vocab)
    added = [dict(id=i, content=tok, single_word=False, lstrip=False, rstrip=False, normalized=False, special=sp)
             for i, (tok, sp) in enumerate(SPECIAL_TOKENS)]
    tokj = OrderedDict([
        ("version", "1.0"), ("truncation", None), ("padding", None), ("added_tokens", added),
        ("normalizer", {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}),
        ("pre_tokenizer", {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}),
        ("post_processor", {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                     {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BOS], "tokens": ["<bos>"]}}}),
        ("decoder", {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}),
        ("model", OrderedDict([("type", "BPE"), ("dropout", None), ("unk_token", "<unk>"), ("continuing_subword_prefix", None),
                               ("end_of_word_suffix", None), ("fuse_unk", True), ("byte_fallback", True),
                               ("ignore_merges", False), ("vocab", vocab), ("merges", merges)])),
    ])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    tc = OrderedDict([
        ("add_bos_token", True), ("add_eos_token", False), ("bos_token", "<bos>"), ("eos_token", "<eos>"),
        ("pad_token", "<pad>"), ("unk_token", "<unk>"), ("padding_side", "left"), ("model_max_length", 1024),
        ("tokenizer_class", "GemmaTokenizer"), ("clean_up_tokenization_spaces", False), ("spaces_between_special_tokens", False),
    ])
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    gc = OrderedDict([("bos_token_id", BOS), ("do_sample", True), ("eos_token_id", [EOS, TURN_END]), ("pad_token_id", PAD),
                      ("temperature", 1.0), ("top_k", 64), ("top_p", 0.95), ("transformers_version", "5.17.0")])
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gc, f, indent=2)
        f.write("\n")
    # self-checks: round trip through the shipped file, chat template rendering, split-invariance
    tok = load_tokenizer(out_dir)
    probs = task.gen_test(seed, 2000)
    import jinja2
    for ex in probs[:50]:
        p = task.prompt(ex)
        rendered = jinja2.Environment().from_string(CHAT_TEMPLATE).render(
            messages=task.messages(ex), bos_token="<bos>", add_generation_prompt=True)
        assert rendered == p, (rendered, p)
        ids_p = tok.encode(p, add_special_tokens=False).ids
        r = task.reply(ex)
        ids_r = tok.encode(r, add_special_tokens=False).ids
        assert tok.encode(p + r + "<turn|>", add_special_tokens=False).ids == ids_p + ids_r + [TURN_END]
        assert tok.decode(ids_p + ids_r, skip_special_tokens=False) == p + r
    ids_p = tok.encode(task.prompt(probs[0]), add_special_tokens=False).ids
    lens = [len(tok.encode(task.prompt(ex) + task.reply(ex), add_special_tokens=False).ids) for ex in probs]
    log(f"tokenizer: vocab {len(vocab)} (specials {len(SPECIAL_TOKENS)}, bytes 256, BPE {len(vocab) - n_base}), "
        f"merges {len(merges)}; example sequence lengths mean {np.mean(lens):.1f} max {max(lens)}")
    log("prompt ids of problem 0:", ids_p)
    return tok


def load_tokenizer(model_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


# ----------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class QFlags:
    """Which quantizers are active. deploy: weights hold exact dequantized values and activation
    quantizers use fixed scales with true division and round-half-even (= g4 --act fake)."""

    def __init__(self):
        self.w = False
        self.act = False
        self.kv = False
        self.pmp = False
        self.bf16 = False
        self.deploy = False
        self.calib = False
        self.calib_tail = 1e-4  # share of |x| above the calibration point (1e-4: the 99.99th percentile)
        self.stats = None  # dict name -> [clipped, total] (tensors) when collecting
        self.stat_mask = None  # [B,T] bool: positions that count in the statistics


def qrange(bits):
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def bf16_ste(w):
    return w + (w.to(torch.bfloat16).float() - w).detach()


class ActQ(nn.Module):
    """Static per-tensor int8 quantizer. kind: 'act' | 'kv' | 'pmp'; learn: scale learned (log-param)."""

    def __init__(self, flags, name, kind="act", fixed=None, learn=True):
        super().__init__()
        self.f, self.name, self.kind = flags, name, kind
        self.fixed = fixed
        self.learn = learn and fixed is None
        init = fixed if fixed is not None else 0.05
        self.log_s = nn.Parameter(torch.tensor([math.log(init)]), requires_grad=self.learn)
        self.register_buffer("s_exact", torch.tensor([init], dtype=torch.float32))
        self.calib_vals = []
        self.zero = False  # deploy: a scale of 0 means "do not quantize"

    def enabled(self):
        return {"act": self.f.act, "kv": self.f.kv, "pmp": self.f.pmp}[self.kind]

    def scale_value(self):
        """The scale as exported (f32)."""
        if self.fixed is not None:
            return float(np.float32(self.fixed))
        return float(torch.exp(self.log_s.detach().float()).item())

    def forward(self, x):
        if self.f.calib and self.learn:
            a = x.detach().abs().flatten().float()
            k = max(1, int(math.ceil(a.numel() * self.f.calib_tail)))
            self.calib_vals.append(torch.topk(a, k).values[-1])
        if not self.enabled():
            return x
        if self.f.deploy:
            if self.zero:
                return x
            s = self.s_exact
            q = torch.round(x / s)
            if self.f.stats is not None:
                self._stat(q)
            return torch.clamp(q, -128, 127) * s
        if self.fixed is not None:
            s = self.s_exact
        else:
            s = torch.exp(self.log_s)
        if self.f.stats is not None:
            self._stat(torch.round(x.detach() / s.detach()))
        if self.learn:
            return torch._fake_quantize_learnable_per_tensor_affine(x, s, torch.zeros_like(s), -128, 127, 1.0)
        return torch.fake_quantize_per_tensor_affine(x, float(self.fixed), 0, -128, 127)

    def _stat(self, q):
        if self.f.stat_mask is not None:
            q = q[self.f.stat_mask]
        e = self.f.stats.setdefault(self.name, [0, 0])
        e[0] = e[0] + ((q > 127) | (q < -128)).sum()
        e[1] = e[1] + q.numel()


def init_weight_scale(w, bits):
    """Per-row scale minimising the quantization MSE over a grid of multiples of the row RMS."""
    qmin, qmax = qrange(bits)
    rms = w.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-8)
    best_s, best_e = None, None
    for c in torch.logspace(math.log10(0.05), math.log10(4.0), 48, device=w.device):
        s = rms * c
        e = (torch.clamp(torch.round(w / s), qmin, qmax) * s - w).pow(2).sum(-1, keepdim=True)
        if best_s is None:
            best_s, best_e = s.clone(), e
        else:
            better = e < best_e
            best_s = torch.where(better, s, best_s)
            best_e = torch.where(better, e, best_e)
    return best_s.squeeze(-1)


class QWeight(nn.Module):
    """A weight matrix [rows, cols] quantized per row (or per row-block of `cols // nblocks`)."""

    def __init__(self, flags, rows, cols, bits, std, nblocks=1):
        super().__init__()
        self.f, self.rows, self.cols, self.bits, self.nblocks = flags, rows, cols, bits, nblocks
        self.weight = nn.Parameter(torch.randn(rows, cols) * std)
        self.log_ws = nn.Parameter(torch.zeros(rows * nblocks))

    def init_scales(self):
        with torch.no_grad():
            w = self.weight.detach().float().reshape(self.rows * self.nblocks, -1)
            self.log_ws.copy_(torch.log(init_weight_scale(w, self.bits)))

    def scales(self):
        return torch.exp(self.log_ws.detach().float())

    def get(self):
        if self.bits >= 16 or not self.f.w or self.f.deploy:
            return self.weight
        qmin, qmax = qrange(self.bits)
        w = self.weight.reshape(self.rows * self.nblocks, -1)
        s = torch.exp(self.log_ws)
        wq = torch._fake_quantize_learnable_per_channel_affine(w, s, torch.zeros_like(s), 0, qmin, qmax, 1.0)
        return wq.reshape(self.rows, self.cols)

    def codes(self):
        """Integer codes and f32 scales exactly as the forward pass (x * (1/s), round half even)."""
        qmin, qmax = qrange(self.bits)
        w = self.weight.detach().float().reshape(self.rows * self.nblocks, -1)
        s = self.scales()
        inv = 1.0 / s
        c = torch.clamp(torch.round(w * inv[:, None]), qmin, qmax)
        return c.reshape(self.rows, self.cols).to(torch.int8), s.reshape(self.rows, self.nblocks)


class QLinear(nn.Module):
    def __init__(self, flags, name, din, dout, bits, std=0.02, act=True):
        super().__init__()
        self.f, self.name, self.din, self.dout, self.bits = flags, name, din, dout, bits
        self.w = QWeight(flags, dout, din, bits, std)
        self.has_act = act
        self.aq_in = ActQ(flags, name + ".in")
        self.aq_out = ActQ(flags, name + ".out")

    def forward(self, xq):
        y = F.linear(xq, self.w.get())
        return self.aq_out(y) if self.has_act else y


def rms_norm(x, w, eps):
    x = x.float()
    y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return y * w if w is not None else y


class Norm(nn.Module):
    def __init__(self, flags, dim, eps):
        super().__init__()
        self.f, self.eps = flags, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        w = bf16_ste(self.weight) if (self.f.bf16 and not self.f.deploy) else self.weight
        return rms_norm(x, w, self.eps)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, flags, cfg, i):
        super().__init__()
        H, P = cfg["hidden_size"], cfg["hidden_size_per_layer_input"]
        self.i = i
        self.f = flags
        self.type = cfg["layer_types"][i]
        self.hd = cfg["global_head_dim"] if self.type == "full_attention" else cfg["head_dim"]
        self.nh = cfg["num_attention_heads"]
        self.shared = i >= cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
        mlp = cfg["intermediate_size"] * (2 if self.shared else 1)
        mbits = 2 if self.shared else 4
        eps = cfg["rms_norm_eps"]
        p = f"L{i}."
        self.q = QLinear(flags, p + "q_proj", H, self.nh * self.hd, 4)
        if not self.shared:
            self.k = QLinear(flags, p + "k_proj", H, self.hd, 4)
            self.v = QLinear(flags, p + "v_proj", H, self.hd, 4)
            self.k_norm = Norm(flags, self.hd, eps)
            self.kq = ActQ(flags, p + "k_cache", kind="kv")
            self.vq = ActQ(flags, p + "v_cache", kind="kv", fixed=V_CACHE_SCALE)
        self.o = QLinear(flags, p + "o_proj", self.nh * self.hd, H, 4)
        self.q_norm = Norm(flags, self.hd, eps)
        self.gate = QLinear(flags, p + "gate_proj", H, mlp, mbits)
        self.up = QLinear(flags, p + "up_proj", H, mlp, mbits)
        self.down = QLinear(flags, p + "down_proj", mlp, H, mbits)
        self.plg = QLinear(flags, p + "per_layer_input_gate", H, P, 8)
        self.plp = QLinear(flags, p + "per_layer_projection", P, H, 8)
        self.ln_in = Norm(flags, H, eps)
        self.ln_post_attn = Norm(flags, H, eps)
        self.ln_pre_ffw = Norm(flags, H, eps)
        self.ln_post_ffw = Norm(flags, H, eps)
        self.ln_post_pli = Norm(flags, H, eps)
        self.register_buffer("layer_scalar", torch.ones(1))
        self.eps = eps

    def forward(self, h, pli, cos, sin, mask, shared, cache=None, t0=0):
        """cache (evaluation only): dict layer index -> preallocated (K, V) [B,1,Tmax,hd] plus "tmax"; the new
        tokens' K/V are written at [t0, t0+T) and attention reads [0, t0+T)."""
        B, T, _ = h.shape
        x = self.q.aq_in(self.ln_in(h))  # A1 (shared by q/k/v)
        q = self.q(x).view(B, T, self.nh, self.hd)  # A2
        q = self.q_norm(q)
        q = (q * cos[:, :, None] + rotate_half(q) * sin[:, :, None]).transpose(1, 2)
        if not self.shared:
            k = self.k(x).view(B, T, 1, self.hd)  # A3
            k = self.k_norm(k)
            k = k * cos[:, :, None] + rotate_half(k) * sin[:, :, None]
            k = self.kq(k).transpose(1, 2)  # A5
            v = rms_norm(self.v(x).view(B, T, 1, self.hd), None, self.eps)  # A4, v_norm
            v = self.vq(v).transpose(1, 2)  # A6
            if cache is not None:
                if self.i not in cache:
                    cache[self.i] = (k.new_zeros(B, 1, cache["tmax"], self.hd), v.new_zeros(B, 1, cache["tmax"], self.hd))
                kb, vb = cache[self.i]
                kb[:, :, t0:t0 + T] = k
                vb[:, :, t0:t0 + T] = v
                k, v = kb[:, :, :t0 + T], vb[:, :, :t0 + T]
            shared[self.type] = (k, v)
        else:
            k, v = shared[self.type]
        if self.f.deploy or not self.training:
            # eager attention (transformers' eager path and g4; scaling 1.0) everywhere outside training:
            # on CUDA, scaled_dot_product_attention with the batched [B,1,T,T] left-padding mask gave
            # wrong results in evaluation (first H200 run), eager does not.
            # one K/V head: the query heads' rows side by side against it (a [B,heads,T,hd] x [B,1,...]
            # matmul would copy K and V once per head)
            nq = q.shape[1] * q.shape[2]
            sc = torch.matmul(q.reshape(B, 1, nq, self.hd), k.transpose(-1, -2)).view(B, self.nh, T, -1)
            sc = sc.masked_fill(~mask, float("-inf"))
            p = torch.softmax(sc, dim=-1, dtype=torch.float32)
            a = torch.matmul(p.reshape(B, 1, nq, -1), v).view(B, self.nh, T, self.hd)
        else:
            a = F.scaled_dot_product_attention(q, k.expand(B, self.nh, T, self.hd), v.expand(B, self.nh, T, self.hd),
                                               attn_mask=mask, scale=1.0)
        a = a.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        o = self.o(self.o.aq_in(a))  # A7, A8
        h = h + self.ln_post_attn(o)
        y = self.gate.aq_in(self.ln_pre_ffw(h))  # A9 (shared by gate/up)
        m = F.gelu(self.gate(y), approximate="tanh") * self.up(y)  # A10, A11
        d = self.down(self.down.aq_in(m))  # A12, A13
        h = h + self.ln_post_ffw(d)
        g = F.gelu(self.plg(self.plg.aq_in(h)), approximate="tanh") * pli  # A14, A15
        pp = self.plp(self.plp.aq_in(g))  # A16, A17
        h = (h + self.ln_post_pli(pp)) * self.layer_scalar
        return h


class TinyGemma4(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.f = QFlags()
        H, V, L, P = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["hidden_size_per_layer_input"]
        self.H, self.V, self.L, self.P = H, V, L, P
        self.embed = QWeight(self.f, V, H, 2, 0.02)
        self.embed_ple = QWeight(self.f, V, L * P, 4, 0.02, nblocks=L)
        self.pmp = nn.Parameter(torch.randn(L * P, H) * 0.02)
        self.pmp_in = ActQ(self.f, "pmp.in", kind="pmp", fixed=PMP_S_IN)
        self.pmp_out = ActQ(self.f, "pmp.out", kind="pmp", fixed=PMP_S_OUT)
        self.ple_norm = Norm(self.f, P, cfg["rms_norm_eps"])
        self.layers = nn.ModuleList([Layer(self.f, cfg, i) for i in range(L)])
        self.norm = Norm(self.f, H, cfg["rms_norm_eps"])
        self.lm_head = QLinear(self.f, "lm_head", H, V, 2, act=False)
        self.softcap = cfg["final_logit_softcapping"]
        self.window = cfg["sliding_window"]
        for t, hd in (("sliding_attention", cfg["head_dim"]), ("full_attention", cfg["global_head_dim"])):
            rp = cfg["rope_parameters"][t]
            if rp.get("rope_type", "default") == "proportional":
                n_rot = int(rp["partial_rotary_factor"] * hd // 2)
                inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, 2 * n_rot, 2, dtype=torch.int64).float() / hd))
                inv = torch.cat([inv, torch.zeros(hd // 2 - n_rot)])
            else:
                inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
            self.register_buffer(f"inv_{t}", inv.float(), persistent=False)

    def qweights(self):
        out = [("embed", self.embed), ("embed_ple", self.embed_ple), ("lm_head", self.lm_head.w)]
        for m in self.modules():
            if isinstance(m, QLinear) and m.name != "lm_head":
                out.append((m.name, m.w))
        return out

    def actqs(self):
        return [m for m in self.modules() if isinstance(m, ActQ)]

    def forward(self, ids, pos=None, key_valid=None, out_positions=None, cache=None, t0=0):
        """ids [B,T]; pos [B,T] rope positions (default arange); key_valid [B,t0+T] bool (left padding);
        out_positions: None -> logits for all positions, 'last' -> last position only, or a bool mask [B,T].
        cache (evaluation): the K/V of positions [0, t0) from earlier calls (Layer.forward); ids are positions
        [t0, t0+T)."""
        B, T = ids.shape
        dev = ids.device
        f = self.f
        e = F.embedding(ids, self.embed.get()) * float(math.sqrt(self.H))
        ple = F.embedding(ids, self.embed_ple.get()) * float(math.sqrt(self.P))
        W = self.pmp
        if f.bf16 and not f.deploy:
            W = bf16_ste(W)
        z = F.linear(self.pmp_in(e), W) * (self.H ** -0.5)  # G1
        z = self.pmp_out(z)  # G2 ("scaled" placement)
        z = self.ple_norm(z.view(B, T, self.L, self.P))
        pli = (z + ple.view(B, T, self.L, self.P)) * (2.0 ** -0.5)
        if pos is None:
            pos = torch.arange(T, device=dev)[None].expand(B, T)
        qi = torch.arange(t0, t0 + T, device=dev)  # query and key indices in the whole (padded) sequence
        ki = torch.arange(t0 + T, device=dev)
        causal = ki[None, :] <= qi[:, None]
        slide = causal & (qi[:, None] - ki[None, :] < self.window)
        eye = ki[None, :] == qi[:, None]
        if key_valid is not None:
            full_m = ((causal[None] & key_valid[:, None, :]) | eye[None])[:, None]
            slide_m = ((slide[None] & key_valid[:, None, :]) | eye[None])[:, None]
        else:
            full_m, slide_m = causal, slide
        masks = {"full_attention": full_m, "sliding_attention": slide_m}
        rope = {}
        for t in ("sliding_attention", "full_attention"):
            fr = pos[..., None].float() * getattr(self, f"inv_{t}")[None, None, :]
            emb = torch.cat([fr, fr], -1)
            rope[t] = (emb.cos(), emb.sin())
        h = e
        shared = {}
        for i, layer in enumerate(self.layers):
            c, s = rope[layer.type]
            h = layer(h, pli[:, :, i], c, s, masks[layer.type], shared, cache, t0)
        if out_positions is not None:
            h = h[:, -1] if isinstance(out_positions, str) else h[out_positions]
        h = self.norm(h)
        logits = self.lm_head(h)
        return self.softcap * torch.tanh(logits / self.softcap)


def make_cfg(arch):
    types = ["sliding_attention" if c == "S" else "full_attention" for c in arch["layer_pattern"]]
    cfg = dict(arch)
    cfg["layer_types"] = types
    cfg["num_hidden_layers"] = len(types)
    cfg["rope_parameters"] = {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    }
    return cfg


# ----------------------------------------------------------------------------------------------
# export / import in the mobile checkpoint format
# ----------------------------------------------------------------------------------------------

ZP = {2: 2, 4: 8}


def pack_codes(codes, bits):
    codes = np.asarray(codes).astype(np.int16)
    if bits == 8:
        return codes.astype(np.int8)
    per = 8 // bits
    n = codes.shape[-1]
    nbytes = (n + per - 1) // per
    u = (codes + ZP[bits]).astype(np.uint16)
    if nbytes * per - n:
        u = np.concatenate([u, np.full(u.shape[:-1] + (nbytes * per - n,), ZP[bits], np.uint16)], axis=-1)
    u = u.reshape(u.shape[:-1] + (nbytes, per))
    out = np.zeros(u.shape[:-1], np.uint16)
    for k in range(per):
        out |= u[..., k] << (bits * k)
    return out.astype(np.uint8)


def unpack_codes(packed, bits, n):
    packed = np.asarray(packed)
    if bits == 8:
        return packed.astype(np.int8)[..., :n]
    per = 8 // bits
    p = packed.astype(np.uint8)
    parts = [((p >> (bits * k)) & ((1 << bits) - 1)).astype(np.int16) - ZP[bits] for k in range(per)]
    return np.stack(parts, -1).reshape(p.shape[:-1] + (p.shape[-1] * per,))[..., :n].astype(np.int8)


def quant_config(cfg):
    n_prod = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    assert 1 <= n_prod <= 10
    mlp4 = "language_model\\.layers\\.[0-%d]\\.mlp\\." % (n_prod - 1)
    mqc = OrderedDict([
        ("^lm_head$", {"num_bits": 2}),
        ("audio_tower(?!.*lconv1d\\.linear_start)", {"num_bits": 2}),
        ("audio_tower\\.layers\\.\\d+\\.lconv1d\\.linear_start\\.", {"num_bits": 4}),
        ("language_model\\.embed_tokens$", {"num_bits": 2}),
        ("language_model\\.embed_tokens_per_layer$", {"num_bits": 4}),
        (mlp4, {"num_bits": 4}),
        ("language_model\\.layers\\.\\d+\\.mlp\\.", {"num_bits": 2}),
        ("language_model\\.layers\\.\\d+\\.per_layer_input_gate$", {"num_bits": 8}),
        ("language_model\\.layers\\.\\d+\\.per_layer_projection$", {"num_bits": 8}),
        ("language_model\\.layers\\.\\d+\\.self_attn\\.", {"num_bits": 4}),
        ("vision_tower", {"num_bits": 8}),
    ])
    assert list(mqc) == sorted(mqc), "config.json is written with sorted keys; evaluation order must match"
    return OrderedDict([
        ("module_quant_configs", mqc),
        ("modules_to_not_convert", ["model.vision_tower.patch_embedder", "model.audio_tower.subsample_conv_projection",
                                    "model.audio_tower.output_proj", "relative_k_proj", "model.embed_audio",
                                    "model.embed_vision", "per_layer_model_projection"]),
        ("num_bits", 4), ("quant_method", "gemma"), ("quantize_embeddings", True),
    ])


def config_json(cfg):
    tc = OrderedDict(
        attention_bias=False, attention_dropout=0.0, attention_k_eq_v=False, bos_token_id=BOS, dtype="bfloat16",
        enable_moe_block=False, eos_token_id=EOS, final_logit_softcapping=cfg["final_logit_softcapping"],
        global_head_dim=cfg["global_head_dim"], head_dim=cfg["head_dim"], hidden_activation="gelu_pytorch_tanh",
        hidden_size=cfg["hidden_size"], hidden_size_per_layer_input=cfg["hidden_size_per_layer_input"],
        initializer_range=0.02, intermediate_size=cfg["intermediate_size"], layer_types=cfg["layer_types"],
        max_position_embeddings=131072, model_type="gemma4_text", moe_intermediate_size=None,
        num_attention_heads=cfg["num_attention_heads"], num_experts=None, num_global_key_value_heads=None,
        num_hidden_layers=cfg["num_hidden_layers"], num_key_value_heads=cfg["num_key_value_heads"],
        num_kv_shared_layers=cfg["num_kv_shared_layers"], pad_token_id=PAD, rms_norm_eps=cfg["rms_norm_eps"],
        rope_parameters=cfg["rope_parameters"], sliding_window=cfg["sliding_window"], tie_word_embeddings=False,
        top_k_experts=None, use_bidirectional_attention=None, use_cache=True, use_double_wide_mlp=True,
        vocab_size=cfg["vocab_size"], vocab_size_per_layer_input=cfg["vocab_size"],
    )
    return OrderedDict(
        architectures=["Gemma4ForConditionalGeneration"], audio_config=None, dtype="bfloat16",
        eos_token_id=[EOS, TURN_END], initializer_range=0.02, model_type="gemma4",
        quantization_config=quant_config(cfg), text_config=tc, tie_word_embeddings=False,
        transformers_version="5.17.0", vision_config=None,
    )


def bf16_bits(t):
    return t.detach().float().cpu().to(torch.bfloat16)


def export_model(model, out_dir):
    """Writes config.json + model.safetensors. Returns a dict of sizes."""
    from safetensors.torch import save_file
    cfg = model.cfg
    T = OrderedDict()
    pre = "model.language_model."

    def f32s(v):
        return torch.tensor(np.float32(v), dtype=torch.float32).reshape(())

    def put_linear(name, lin, s_in, s_out):
        c, s = lin.w.codes()
        packed = pack_codes(c.cpu().numpy(), lin.bits)
        T[name + ".weight"] = torch.from_numpy(packed)
        T[name + ".weight_scale"] = s.float().cpu().reshape(-1, 1).contiguous()
        T[name + ".input_activation_scale"] = f32s(s_in)
        T[name + ".output_activation_scale"] = f32s(s_out)

    for nm, qw in (("embed_tokens", model.embed), ("embed_tokens_per_layer", model.embed_ple)):
        c, s = qw.codes()
        T[pre + nm + ".embedding_quantized"] = torch.from_numpy(pack_codes(c.cpu().numpy(), qw.bits))
        T[pre + nm + ".embedding_scale"] = s.float().cpu().contiguous()
    T[pre + "per_layer_model_projection.weight"] = bf16_bits(model.pmp)
    T[pre + "per_layer_projection_norm.weight"] = bf16_bits(model.ple_norm.weight)
    T[pre + "norm.weight"] = bf16_bits(model.norm.weight)
    prod = {}
    for ly in model.layers:
        if not ly.shared:
            prod[ly.type] = ly
    for ly in model.layers:
        p = pre + f"layers.{ly.i}."
        for nm, mod in (("input_layernorm", ly.ln_in), ("post_attention_layernorm", ly.ln_post_attn),
                        ("pre_feedforward_layernorm", ly.ln_pre_ffw), ("post_feedforward_layernorm", ly.ln_post_ffw),
                        ("post_per_layer_input_norm", ly.ln_post_pli)):
            T[p + nm + ".weight"] = bf16_bits(mod.weight)
        T[p + "layer_scalar"] = bf16_bits(ly.layer_scalar).reshape(1)
        T[p + "self_attn.q_norm.weight"] = bf16_bits(ly.q_norm.weight)
        s_qkv = ly.q.aq_in.scale_value()
        put_linear(p + "self_attn.q_proj", ly.q, s_qkv, ly.q.aq_out.scale_value())
        src = ly if not ly.shared else prod[ly.type]
        # KV-shared layers: the real checkpoint still ships (dead) k/v projections; write the producer's.
        put_linear(p + "self_attn.k_proj", src.k, s_qkv if not ly.shared else src.q.aq_in.scale_value(), src.k.aq_out.scale_value())
        put_linear(p + "self_attn.v_proj", src.v, s_qkv if not ly.shared else src.q.aq_in.scale_value(), src.v.aq_out.scale_value())
        if not ly.shared:
            T[p + "self_attn.k_norm.weight"] = bf16_bits(ly.k_norm.weight)
        T[p + "self_attn.k_cache_scale"] = f32s(src.kq.scale_value())
        T[p + "self_attn.v_cache_scale"] = f32s(src.vq.scale_value())
        put_linear(p + "self_attn.o_proj", ly.o, ly.o.aq_in.scale_value(), ly.o.aq_out.scale_value())
        s_gu = ly.gate.aq_in.scale_value()
        put_linear(p + "mlp.gate_proj", ly.gate, s_gu, ly.gate.aq_out.scale_value())
        put_linear(p + "mlp.up_proj", ly.up, s_gu, ly.up.aq_out.scale_value())
        put_linear(p + "mlp.down_proj", ly.down, ly.down.aq_in.scale_value(), ly.down.aq_out.scale_value())
        put_linear(p + "per_layer_input_gate", ly.plg, ly.plg.aq_in.scale_value(), ly.plg.aq_out.scale_value())
        put_linear(p + "per_layer_projection", ly.plp, ly.plp.aq_in.scale_value(), ly.plp.aq_out.scale_value())
    put_linear("lm_head", model.lm_head, 0.0, 0.0)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        f.write(json.dumps(config_json(cfg), indent=2, sort_keys=True) + "\n")
    T = OrderedDict((k, v.contiguous()) for k, v in T.items())
    save_file(T, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    nbytes = sum(v.numel() * v.element_size() for v in T.values())
    return {"tensors": len(T), "payload_bytes": int(nbytes),
            "file_bytes": os.path.getsize(os.path.join(out_dir, "model.safetensors"))}


def load_export(model_dir, device="cpu"):
    """Builds a deploy-mode TinyGemma4 from an exported checkpoint (dequantized weights in f32, exact scales)."""
    from safetensors.torch import load_file
    cj = json.load(open(os.path.join(model_dir, "config.json")))
    tc = cj["text_config"]
    pattern = "".join("S" if t == "sliding_attention" else "F" for t in tc["layer_types"])
    arch = dict(vocab_size=tc["vocab_size"], hidden_size=tc["hidden_size"], layer_pattern=pattern,
                sliding_window=tc["sliding_window"], num_attention_heads=tc["num_attention_heads"],
                num_key_value_heads=tc["num_key_value_heads"], head_dim=tc["head_dim"], global_head_dim=tc["global_head_dim"],
                num_kv_shared_layers=tc["num_kv_shared_layers"], intermediate_size=tc["intermediate_size"],
                hidden_size_per_layer_input=tc["hidden_size_per_layer_input"],
                final_logit_softcapping=tc["final_logit_softcapping"], rms_norm_eps=tc["rms_norm_eps"])
    cfg = make_cfg(arch)
    cfg["rope_parameters"] = tc["rope_parameters"]
    m = TinyGemma4(cfg)
    St = load_file(os.path.join(model_dir, "model.safetensors"))
    St = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in St.items()}
    pre = "model.language_model."

    def bf(name):
        return torch.from_numpy(np.array(St[name], dtype=np.float32))

    def deq_lin(name, lin):
        s = torch.from_numpy(St[name + ".weight_scale"].astype(np.float32)).reshape(-1)
        c = torch.from_numpy(unpack_codes(St[name + ".weight"], lin.bits, lin.din).astype(np.float32))
        lin.w.weight.data = c * s[:, None]
        lin.w.log_ws.data = torch.log(s)
        for aq, leaf in ((lin.aq_in, "input_activation_scale"), (lin.aq_out, "output_activation_scale")):
            v = float(St[name + "." + leaf].reshape(()))
            aq.s_exact.fill_(v)
            aq.zero = v == 0.0
        return lin

    def deq_emb(name, qw):
        s = torch.from_numpy(St[name + ".embedding_scale"].astype(np.float32))
        c = torch.from_numpy(unpack_codes(St[name + ".embedding_quantized"], qw.bits, qw.cols).astype(np.float32))
        B = qw.cols // s.shape[1]
        qw.weight.data = c * s.repeat_interleave(B, dim=1)

    with torch.no_grad():
        deq_emb(pre + "embed_tokens", m.embed)
        deq_emb(pre + "embed_tokens_per_layer", m.embed_ple)
        m.pmp.data = bf(pre + "per_layer_model_projection.weight")
        m.ple_norm.weight.data = bf(pre + "per_layer_projection_norm.weight")
        m.norm.weight.data = bf(pre + "norm.weight")
        for ly in m.layers:
            p = pre + f"layers.{ly.i}."
            for nm, mod in (("input_layernorm", ly.ln_in), ("post_attention_layernorm", ly.ln_post_attn),
                            ("pre_feedforward_layernorm", ly.ln_pre_ffw), ("post_feedforward_layernorm", ly.ln_post_ffw),
                            ("post_per_layer_input_norm", ly.ln_post_pli)):
                mod.weight.data = bf(p + nm + ".weight")
            ly.layer_scalar.data = bf(p + "layer_scalar").reshape(1)
            ly.q_norm.weight.data = bf(p + "self_attn.q_norm.weight")
            deq_lin(p + "self_attn.q_proj", ly.q)
            if not ly.shared:
                deq_lin(p + "self_attn.k_proj", ly.k)
                deq_lin(p + "self_attn.v_proj", ly.v)
                ly.k_norm.weight.data = bf(p + "self_attn.k_norm.weight")
                ly.kq.s_exact.fill_(float(St[p + "self_attn.k_cache_scale"].reshape(())))
                ly.vq.s_exact.fill_(float(St[p + "self_attn.v_cache_scale"].reshape(())))
            deq_lin(p + "self_attn.o_proj", ly.o)
            deq_lin(p + "mlp.gate_proj", ly.gate)
            deq_lin(p + "mlp.up_proj", ly.up)
            deq_lin(p + "mlp.down_proj", ly.down)
            deq_lin(p + "per_layer_input_gate", ly.plg)
            deq_lin(p + "per_layer_projection", ly.plp)
        deq_lin("lm_head", m.lm_head)
    m.f.deploy = True
    return m.to(device).eval()


# ----------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------


def set_mode(model, mode):
    """mode: 'full' (every quantizer: linears + KV + PMP, = g4 --act fake / int defaults),
    'hf' (linears only, = g4 --act fake --profile hf), 'nokv' (linears + PMP, = g4 --act fake --kv f32),
    'nopmp' (linears + KV, = g4 --act fake --pmp-quant off), 'wonly' (quantized weights, float
    activations, = g4 --act float), 'float' (master weights, nothing quantized; training model only)."""
    assert mode in EVAL_MODES, mode
    f = model.f
    f.act = mode in ("full", "hf", "nokv", "nopmp")
    f.kv = mode in ("full", "nopmp")
    f.pmp = mode in ("full", "nokv")
    if not f.deploy:
        f.w = f.bf16 = mode != "float"


EVAL_MODES = ("full", "hf", "nokv", "nopmp", "wonly", "float")
# metrics.json / torch_answers.json key of each mode run on the exported checkpoint
EXPORT_MODE_KEYS = {"full": "export_full_fakequant", "hf": "export_hf_profile", "nokv": "export_no_kv_quant",
                    "nopmp": "export_no_pmp_quant", "wonly": "export_weights_only_float_acts"}
JSON_ANSWERS_ABOUT = ("PyTorch greedy replies to test.jsonl in file order, per mode (keys as in metrics.json accuracy): "
                      "answers[i] = {object, valid, keys_in_order} of replies[i] against the item's schema; gold: the generator's replies")
ANSWERS_ABOUT = ("PyTorch greedy answers (extract_answer; null: no number) to test.jsonl in file order, per mode "
                 "(keys as in metrics.json accuracy); tests/test_quality.c compares g4's answers with them")


def write_answers(model_dir, answers):
    with open(os.path.join(model_dir, "torch_answers.json"), "w") as f:
        json.dump(answers, f, separators=(",", ":"))
        f.write("\n")


def extract_answer(text):
    m = re.findall(r"The final answer is\s*\$?\s*(-?[\d,]*\.?\d+)", text)
    if m:
        s = m[-1]
    else:
        nums = re.findall(r"-?[\d,]*\.?\d+", text)
        if not nums:
            return None
        s = nums[-1]
    s = s.replace(",", "").rstrip(".")
    try:
        v = float(s)
    except ValueError:
        return None
    return int(v) if v == int(v) else v


@torch.no_grad()
def greedy_batch(model, prompts, max_new, stop_ids, device, bs=500):
    """Greedy continuations of left-padded prompt batches, with a K/V cache (one prefill, then one token a
    step); rows that stopped are dropped from the batch once they are half of it."""
    outs = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    stop = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    for b0 in range(0, len(order), bs):
        idxs = order[b0:b0 + bs]
        B = len(idxs)
        Lmax = max(len(prompts[i]) for i in idxs)
        ids = torch.full((B, Lmax + max_new), PAD, dtype=torch.long, device=device)
        valid = torch.zeros((B, Lmax + max_new), dtype=torch.bool, device=device)
        pads = []
        for r, i in enumerate(idxs):
            p = prompts[i]
            ids[r, Lmax - len(p):Lmax] = torch.tensor(p, device=device)
            valid[r, Lmax - len(p):Lmax] = True
            pads.append(Lmax - len(p))
        padt = torch.tensor(pads, device=device)
        pos = (torch.arange(Lmax + max_new, device=device)[None] - padt[:, None]).clamp_min(0)
        rows = torch.arange(B, device=device)  # batch rows still in the cache
        done = torch.zeros(B, dtype=torch.bool, device=device)
        cache = {"tmax": Lmax + max_new}
        logits = model(ids[:, :Lmax], pos[:, :Lmax], valid[:, :Lmax], out_positions="last", cache=cache, t0=0)
        for step in range(max_new):
            cur = Lmax + step
            nxt = logits.argmax(-1)
            live = ~done[rows]
            ids[rows[live], cur] = nxt[live]
            valid[rows, cur] = True
            done[rows[live & torch.isin(nxt, stop)]] = True
            if bool(done.all()) or step == max_new - 1:
                break
            keep = ~done[rows]
            if int(keep.sum()) * 2 <= rows.numel():
                for k in list(cache):
                    if k != "tmax":
                        cache[k] = (cache[k][0][keep], cache[k][1][keep])
                rows = rows[keep]
            logits = model(ids[rows, cur:cur + 1], pos[rows, cur:cur + 1], valid[rows, :cur + 1], out_positions="last",
                           cache=cache, t0=cur)
        gen = ids[:, Lmax:].tolist()
        for r, i in enumerate(idxs):
            outl = []
            for t in gen[r][:max_new]:
                outl.append(t)
                if t in stop_ids:
                    break
            outs[i] = outl
    return outs


def evaluate(model, tok, test, device, max_new=192, bs=500, collect_stats=False, tag="", task=None):
    task = task or get_task("math")
    prompts = [tok.encode(task.prompt(ex), add_special_tokens=False).ids for ex in test]
    if collect_stats:
        model.f.stats = {}
    t0 = time.time()
    gens = greedy_batch(model, prompts, max_new, {EOS, TURN_END}, device, bs=bs)
    stats = None
    if collect_stats:
        stats = {k: (float(c) / float(t) if float(t) else 0.0) for k, (c, t) in model.f.stats.items()}
        model.f.stats = None
    correct, strict, stopped = 0, 0, 0
    preds = []
    for ex, g in zip(test, gens):
        text = tok.decode([t for t in g if t not in (EOS, TURN_END)], skip_special_tokens=False)
        pred, ok, exact = task.score(ex, text)
        preds.append(pred)
        correct += int(ok)
        strict += int(exact)
        stopped += int(bool(g) and g[-1] in (EOS, TURN_END))
    n = len(test)
    res = {"n": n, "accuracy": correct / n, "exact_solution_match": strict / n, "stopped": stopped / n,
           "seconds": time.time() - t0}
    if task.name == "json":  # validity by prompt form, and the share that parses as a JSON object at all
        res["json_object"] = sum(p["object"] for p in preds) / n
        res["keys_in_order"] = sum(p["keys_in_order"] for p in preds) / n
        by = OrderedDict()
        for ex, p in zip(test, preds):
            c = by.setdefault(ex["form"] + ("/prose" if _has_values(ex) else "/example"), [0, 0])
            c[0] += p["valid"]
            c[1] += 1
        res["valid_by_form"] = OrderedDict((k, "%d/%d" % tuple(v)) for k, v in sorted(by.items()))
        res["texts"] = [tok.decode([t for t in g if t not in (EOS, TURN_END)], skip_special_tokens=False) for g in gens]
        log(f"  json[{tag}]: object {res['json_object']:.4f}, keys in order {res['keys_in_order']:.4f}; valid by form "
            f"{json.dumps(res['valid_by_form'])}")
    log(f"eval[{tag}]: accuracy {res['accuracy']:.4f} ({correct}/{n}), whole-solution match {res['exact_solution_match']:.4f}, "
        f"stopped {res['stopped']:.3f}, {res['seconds']:.1f}s")
    return res, stats, gens, preds


@torch.no_grad()
def clip_stats(model, tok, test, device, bs=250, task=None):
    """Clip fraction P(|round(x/s)| beyond the int8 range) per quantization site, teacher-forced on
    prompt + reference reply of every test problem (real tokens only)."""
    seqs, _ = encode_dataset(tok, test, task)
    model.f.stats = {}
    for b0 in range(0, len(seqs), bs):
        ch = seqs[b0:b0 + bs]
        T = max(len(x) for x in ch)
        ids = torch.full((len(ch), T), PAD, dtype=torch.long, device=device)
        for r, x in enumerate(ch):
            ids[r, :len(x)] = torch.tensor(x, device=device)
        lens = torch.tensor([len(x) for x in ch], device=device)
        model.f.stat_mask = torch.arange(T, device=device)[None] < lens[:, None]
        model(ids, out_positions="last")
    model.f.stat_mask = None
    stats = {k: (float(c) / float(t) if float(t) else 0.0) for k, (c, t) in model.f.stats.items()}
    model.f.stats = None
    return stats


def summarize_clip(stats):
    """Per-site clip fractions grouped by quantization point (max and mean over layers)."""
    groups = OrderedDict()
    for k, v in sorted(stats.items()):
        site = re.sub(r"^L\d+\.", "", k)
        groups.setdefault(site, []).append(v)
    return OrderedDict((s, {"max": max(v), "mean": sum(v) / len(v), "layers": len(v)}) for s, v in groups.items())


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------


def _has_values(ex):
    """A JSON example whose user turn gives the values (prose) rather than asking for an example."""
    return not any(w in ex["user"] for w in ("Describe ", "Give me an example", "Make up ", "Create ", "Return a sample",
                                             "Generate ", "Invent "))


def encode_dataset(tok, probs, task=None):
    task = task or get_task("math")
    prompts = [task.prompt(ex) for ex in probs]
    replies = [task.reply(ex) + "<turn|>" for ex in probs]
    ep = tok.encode_batch(prompts, add_special_tokens=False)
    er = tok.encode_batch(replies, add_special_tokens=False)
    seqs, starts = [], []
    for a, b in zip(ep, er):
        seqs.append(a.ids + b.ids)
        starts.append(len(a.ids))
    return seqs, starts


def to_tensor(seqs, starts, device):
    n = len(seqs)
    T = max(len(s) for s in seqs)
    ids = np.full((n, T), PAD, dtype=np.int32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    st = torch.tensor(starts, dtype=torch.int32)
    return torch.from_numpy(ids).to(device), lens.to(device), st.to(device)


def batch_loss(model, ids, lens, starts):
    T = int(lens.max().item())
    x = ids[:, :T].long()
    tpos = torch.arange(1, T, device=x.device)[None]
    m = (tpos >= starts[:, None]) & (tpos < lens[:, None])  # target positions t+1 in the reply
    inp = x[:, :-1]
    tgt = x[:, 1:][m]
    logits = model(inp, out_positions=m)
    return F.cross_entropy(logits.float(), tgt), int(m.sum().item())


def calibrate(model, data, device, n_batches, bs, gen):
    f = model.f
    f.calib = True
    with torch.no_grad():
        for _ in range(n_batches):
            sel = torch.randint(0, data[0].shape[0], (bs,), device=device, generator=gen)
            ids, lens = data[0][sel], data[1][sel]
            T = int(lens.max().item())
            model(ids[:, :T].long(), out_positions="last")
    f.calib = False
    out = {}
    for aq in model.actqs():
        if aq.learn and aq.calib_vals:
            p = torch.stack(aq.calib_vals).mean().item()
            s = max(p / 127.0, 1e-6)
            aq.log_s.data.fill_(math.log(s))
            out[aq.name] = s
        aq.calib_vals = []
    return out


def rescale_pmp(model, data, device, bs, gen):
    """per_layer_model_projection is followed by an RMSNorm, so its output scale is free: put the 99.99th
    percentile of |z| (after x H^-1/2) at 100 codes of the fixed s_out. Also reports the input range."""
    f = model.f
    with torch.no_grad():
        sel = torch.randint(0, data[0].shape[0], (bs,), device=device, generator=gen)
        ids, lens = data[0][sel], data[1][sel]
        T = int(lens.max().item())
        x = ids[:, :T].long()
        e = F.embedding(x, model.embed.get()) * float(math.sqrt(model.H))
        en = f.pmp
        f.pmp = True
        z = F.linear(model.pmp_in(e), model.pmp) * (model.H ** -0.5)
        f.pmp = en
        a = z.abs().flatten()
        p = torch.topk(a, max(1, int(a.numel() * 1e-4))).values[-1].item()
        fac = 100.0 * PMP_S_OUT / max(p, 1e-12)
        model.pmp.data.mul_(fac)
        ea = e.abs().flatten()
        pe = torch.topk(ea, max(1, int(ea.numel() * 1e-4))).values[-1].item()
    return {"z_p9999_before": p, "factor": fac, "e_p9999": pe, "e_max": float(ea.max()), "pmp_in_range": 127 * PMP_S_IN}


def cmd_train(args):
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    t_all = time.time()
    os.makedirs(args.out, exist_ok=True)
    if args.scratch:
        os.makedirs(args.scratch, exist_ok=True)  # train_state.pt and the log are written there
    tok_dir = args.tokenizer or args.out
    tok = load_tokenizer(tok_dir)
    if os.path.abspath(tok_dir) != os.path.abspath(args.out):
        import shutil
        for fn in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            shutil.copy(os.path.join(tok_dir, fn), os.path.join(args.out, fn))
    arch = dict(DEFAULT_ARCH)
    if args.arch_json:
        arch.update(json.loads(args.arch_json))
    assert tok.get_vocab_size() <= arch["vocab_size"], (tok.get_vocab_size(), arch["vocab_size"])
    cfg = make_cfg(arch)
    log("config:", json.dumps(cfg))
    log("device:", device, torch.cuda.get_device_name(0) if device.type == "cuda" else "")

    # ---- data
    task = get_task(args.task)
    t0 = time.time()
    test = task.gen_test(args.test_seed, args.n_test)
    test_q = {task.key(ex) for ex in test}
    train = task.gen_train(args.seed, args.n_train, test_q)
    seqs, starts = encode_dataset(tok, train, task)
    data = to_tensor(seqs, starts, device)
    lens_np = np.array([len(s) for s in seqs])
    log(f"data: {len(train)} train problems (seed {args.seed}), {len(test)} test problems (seed {args.test_seed}); "
        f"seq len mean {lens_np.mean():.1f} max {lens_np.max()}; answer tokens mean {np.mean([len(s) - st for s, st in zip(seqs, starts)]):.1f}; "
        f"{time.time() - t0:.1f}s")
    task.write_test(os.path.join(args.out, "test.jsonl"), test)

    # ---- model
    model = TinyGemma4(cfg).to(device)
    model.f.calib_tail = args.calib_tail
    n_params = sum(p.numel() for n, p in model.named_parameters() if "log_" not in n)
    log(f"parameters: {n_params}")
    decay, no_decay, scales = [], [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if "log_" in n:
            scales.append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:
            no_decay.append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0},
                             {"params": scales, "weight_decay": 0.0, "lr_mult": args.scale_lr_mult}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    step_based = args.float_steps is not None and args.qat_steps is not None
    by_length = torch.argsort(data[1], stable=True) if args.length_batches else None
    budget = args.time_budget
    total_steps = (args.float_steps + args.qat_steps) if step_based else None
    model.train()
    phase = "float"
    step, qat_step, float_steps_done = 0, 0, 0
    t_train = time.time()
    hist = []
    calib_info, pmp_info = None, None
    ema = None
    while True:
        el = time.time() - t_train
        if step_based:
            prog = step / total_steps
            if step >= total_steps:
                break
            want_qat = step >= args.float_steps
        else:
            prog = el / budget
            if el >= budget:
                break
            want_qat = prog >= args.float_frac
        if want_qat and phase == "float":
            float_steps_done = step
            model.eval()
            pmp_info = rescale_pmp(model, data, device, args.calib_bs, gen)
            log("pmp rescale:", json.dumps(pmp_info))
            for _, qw in model.qweights():
                qw.init_scales()
            set_mode(model, "full")
            model.f.act = model.f.kv = model.f.pmp = False
            calib_info = calibrate(model, data, device, args.calib_batches, args.calib_bs, gen)
            log(f"calibrated {len(calib_info)} activation scales at the {100 * (1 - args.calib_tail):g}th percentile "
                f"(min {min(calib_info.values()):.3g}, max {max(calib_info.values()):.3g})")
            set_mode(model, "full")
            model.train()
            phase = "qat"
            log(f"-- QAT from step {step} ({el:.0f}s)")
        warm = min(1.0, (step + 1) / args.warmup)
        lr = args.lr * warm * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(prog, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_mult", 1.0)
        if by_length is not None:  # a window of the length order: little padding (long prompts, short replies)
            w0 = int(torch.randint(0, data[0].shape[0] - args.bs + 1, (1,), device=device, generator=gen))
            sel = by_length[w0:w0 + args.bs]
            sel = sel[:max(8, min(args.bs, args.max_batch_tokens // int(data[1][sel[-1]])))]  # the longest: fewer rows
        else:
            sel = torch.randint(0, data[0].shape[0], (args.bs,), device=device, generator=gen)
        loss, ntok = batch_loss(model, data[0][sel], data[1][sel], data[2][sel])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        step += 1
        if phase == "qat":
            qat_step += 1
        if step % args.log_every == 0 or step == 1:
            log(f"step {step} [{phase}] loss {lv:.4f} ema {ema:.4f} gnorm {float(gn):.3f} lr {lr:.2e} tokens {ntok} "
                f"t {time.time() - t_train:.0f}s")
            hist.append((step, phase, lv, ema))
    if phase == "float":  # never reached QAT: still export a valid (post-training quantized) model
        float_steps_done = step
        for _, qw in model.qweights():
            qw.init_scales()
        calib_info = calibrate(model, data, device, args.calib_batches, args.calib_bs, gen)
    train_s = time.time() - t_train
    log(f"training done: {step} steps ({float_steps_done} float + {qat_step} QAT) x batch {args.bs} in {train_s:.1f}s")
    model.eval()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    # learned vs calibrated activation scales
    drift = []
    if calib_info:
        for aq in model.actqs():
            if aq.name in calib_info:
                drift.append(aq.scale_value() / calib_info[aq.name])
    # ---- export
    sizes = export_model(model, args.out)
    log("export:", json.dumps(sizes))
    torch.save({"state_dict": model.state_dict(), "cfg": cfg}, os.path.join(args.scratch or args.out, "train_state.pt"))
    if args.after_export_hook:
        os.system(args.after_export_hook)

    # ---- evaluation
    metrics = OrderedDict()
    metrics["config"] = cfg
    metrics["seed"] = args.seed
    metrics["test_seed"] = args.test_seed
    metrics["n_train_problems"] = len(train)
    metrics["parameters"] = n_params
    metrics["export"] = sizes
    metrics["steps"] = {"float": float_steps_done, "qat": qat_step, "batch": args.bs, "train_seconds": train_s}
    metrics["pmp_rescale"] = pmp_info
    metrics["scale_drift_learned_over_calibrated"] = ({"min": min(drift), "max": max(drift), "n": len(drift)} if drift else None)
    metrics["loss_history"] = hist
    test_eval = test[:args.n_eval]
    metrics["accuracy"] = OrderedDict()
    scratch = args.scratch or args.out

    def flush():
        metrics["total_seconds"] = time.time() - t_all
        with open(os.path.join(args.out, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
            f.write("\n")
        with open(os.path.join(scratch, "train_log.txt"), "w") as f:
            f.write("\n".join(LOG_LINES) + "\n")
        if args.after_export_hook:
            os.system(args.after_export_hook)

    last = [0.0]

    def time_left():
        ok = time.time() - t_all + last[0] * 1.2 < args.deadline
        if not ok:
            log(f"skipping further evaluations: deadline {args.deadline}s")
        return ok

    def run_eval(key, m, mode, tag):
        t0 = time.time()
        set_mode(m, mode)
        res, _, gens, preds = evaluate(m, tok, test_eval, device, tag=tag, bs=args.eval_bs, task=task)
        texts = res.pop("texts", None)
        metrics["accuracy"][key] = res
        answers["modes"][key] = {"mode": mode, "accuracy": res["accuracy"], "answers": preds}
        if texts is not None:
            answers["modes"][key]["replies"] = texts
        write_answers(args.out, answers)
        last[0] = time.time() - t0
        flush()
        return gens

    # per-question extracted answers of every evaluated mode (tests/test_quality.c compares g4's with them)
    answers = OrderedDict([("about", ANSWERS_ABOUT if task.name == "math" else JSON_ANSWERS_ABOUT),
                           ("gold", [task.gold(ex) for ex in test_eval]), ("modes", OrderedDict())])
    dm = load_export(args.out, device)
    gens = run_eval("export_full_fakequant", dm, "full", "export, full fake-quant = g4 --act fake defaults")
    metrics["first_generations_full"] = gens[:8]
    stats = clip_stats(dm, tok, test_eval, device, task=task)
    metrics["clip_fraction_by_site"] = summarize_clip(stats)
    metrics["clip_fraction_per_tensor"] = stats
    metrics["clip_fraction_overall_max"] = max(stats.values()) if stats else None
    log("clip fraction by site:", json.dumps(metrics["clip_fraction_by_site"]))
    flush()
    # reference greedy ids for the g4 comparison (g4check --torch-ref): first items of test.jsonl, n=40
    tg = OrderedDict()
    items = list(range(min(args.n_greedy_ref, len(test))))
    prompts = [tok.encode(task.prompt(test[i]), add_special_tokens=False).ids for i in items]
    for mode in ("full", "hf", "wonly"):
        set_mode(dm, mode)
        g = greedy_batch(dm, prompts, 40, {EOS, TURN_END}, device, bs=len(prompts))
        tg[mode] = [{"item": i, "prompt_ids": p, "gen_ids": x} for i, p, x in zip(items, prompts, g)]
    metrics["torch_greedy_n40"] = tg
    flush()
    if time_left():
        run_eval("export_weights_only_float_acts", dm, "wonly", "export, quantized weights + float activations = g4 --act float")
    if time_left():
        run_eval("export_hf_profile", dm, "hf", "export, hf profile (linear clamps only) = g4 --act fake --profile hf")
    if time_left():
        run_eval("export_no_kv_quant", dm, "nokv", "export, linears + per_layer_model_projection, float KV = g4 --act fake --kv f32")
    if time_left():
        run_eval("export_no_pmp_quant", dm, "nopmp", "export, linears + int8 KV, float per_layer_model_projection = g4 --act fake --pmp-quant off")
    if time_left():
        run_eval("float_master_weights", model, "float", "float master weights, nothing quantized")
    if time_left():
        run_eval("training_model_full_fakequant", model, "full", "training model (learnable fake-quant), full")
    log(f"total {time.time() - t_all:.1f}s")
    flush()


def cmd_eval(args):
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    task = get_task(args.task)
    tok = load_tokenizer(args.model)
    test = read_test(args.model, task)[:args.n]
    m = load_export(args.model, device)
    about = ANSWERS_ABOUT if task.name == "math" else JSON_ANSWERS_ABOUT
    answers = OrderedDict([("about", about), ("gold", [task.gold(ex) for ex in test]), ("modes", OrderedDict())])
    for mode in args.modes.split(","):
        set_mode(m, mode)
        res, _, _, preds = evaluate(m, tok, test, device, tag=mode, bs=args.eval_bs, task=task)
        texts = res.pop("texts", None)
        answers["modes"][EXPORT_MODE_KEYS[mode]] = {"mode": mode, "accuracy": res["accuracy"], "answers": preds}
        if texts is not None:
            answers["modes"][EXPORT_MODE_KEYS[mode]]["replies"] = texts
        if mode == "full":
            log(json.dumps(summarize_clip(clip_stats(m, tok, test, device, task=task))))
    if args.write_answers:  # merged into the file's other modes (a mode may cover fewer questions than gold)
        path = os.path.join(args.model, "torch_answers.json")
        if os.path.exists(path):
            old = json.load(open(path), object_pairs_hook=OrderedDict)
            if len(old["gold"]) > len(answers["gold"]):
                assert old["gold"][:len(answers["gold"])] == answers["gold"], "torch_answers.json is of another test.jsonl"
                answers["gold"] = old["gold"]
            for k, v in old["modes"].items():
                answers["modes"].setdefault(k, v)
        write_answers(args.model, answers)


def read_test(model_dir, task=None):
    """MODEL/test.jsonl as the task's examples (math: (question, solution_lines, answer); json: the dicts)."""
    out = []
    for line in open(os.path.join(model_dir, "test.jsonl")):
        d = json.loads(line, object_pairs_hook=OrderedDict)
        if task is not None and task.name == "json":
            out.append(d)
            continue
        sol, ans = d["answer"].rsplit("\n#### ", 1)
        out.append((d["question"], sol.split("\n"), int(ans)))
    return out


def cmd_greedy(args):
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = load_tokenizer(args.model)
    test = read_test(args.model)
    m = load_export(args.model, "cpu")
    set_mode(m, args.mode)
    res = []
    for i in [int(x) for x in args.items.split(",")]:
        q, lines, a = test[i]
        p = tok.encode(chat_prompt(q), add_special_tokens=False).ids
        g = greedy_batch(m, [p], args.n, set() if args.no_stop else {EOS, TURN_END}, torch.device("cpu"), bs=1)[0]
        res.append({"item": i, "prompt_ids": p, "gen_ids": g, "text": tok.decode(g, skip_special_tokens=False), "gold": a})
    print(json.dumps(res))


def cmd_g4check(args):
    """Runs g4 on held-out prompts and compares with this file's PyTorch model on the exported checkpoint:
    prefill logits (g4 --logits-npy) in each mode, and greedy ids (g4 run --ids ... -n N)."""
    import subprocess
    import tempfile
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = load_tokenizer(args.model)
    test = read_test(args.model)
    m = load_export(args.model, "cpu")
    modes = [("fake", [], "full"), ("int", [], "full"), ("fake", ["--profile", "hf"], "hf"), ("float", [], "wonly")]
    ref = None
    if args.torch_ref:
        ref = json.load(open(args.torch_ref))["torch_greedy_n40"]
        assert args.n == 40
    report = {"items": [], "summary": {}}
    agree = {k[0] + ("-hf" if k[1] else ""): [0, 0, 0] for k in modes}  # identical, same-answer, total
    for i in [int(x) for x in args.items.split(",")]:
        q, lines, a = test[i]
        p = tok.encode(chat_prompt(q), add_special_tokens=False).ids
        item = {"item": i, "gold": a, "prompt_len": len(p)}
        if args.check_g4_tokenizer:
            r = subprocess.run([args.g4, "tokenize", "-m", args.model], input=json.dumps(chat_prompt(q)) + "\n",
                               capture_output=True, text=True)
            try:
                item["g4_tokenize_equal"] = json.loads(r.stdout.strip().splitlines()[-1]) == p
            except Exception:  # noqa: BLE001
                item["g4_tokenize_equal"] = "error: " + (r.stderr.strip()[-200:] or r.stdout.strip()[-200:])
        for act, extra, mymode in modes:
            key = act + ("-hf" if extra else "")
            set_mode(m, mymode)
            if ref is not None:
                r_ = [x for x in ref[mymode] if x["item"] == i][0]
                assert r_["prompt_ids"] == p
                mine = r_["gen_ids"]
            else:
                mine = greedy_batch(m, [p], args.n, {EOS, TURN_END}, torch.device("cpu"), bs=1)[0]
            with tempfile.TemporaryDirectory() as td:
                npy = os.path.join(td, "l.npy")
                cmd = [args.g4, "run", "-m", args.model, "--ids", ",".join(map(str, p)), "-n", str(args.n), "--act", act,
                       "--logits-npy", npy] + extra
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    raise SystemExit(f"g4 failed: {' '.join(cmd[:6])}...: {r.stderr}")
                g4ids = []
                for x in r.stdout.split():  # `g4 run --ids` does not stop at the stop ids: cut after the first
                    g4ids.append(int(x))
                    if int(x) in (EOS, TURN_END):
                        break
                g4log = np.load(npy)
            if args.no_logits:
                dl = None
            else:
                with torch.no_grad():
                    mylog = m(torch.tensor([p]))[0].numpy()
                dl = float(np.abs(g4log - mylog).max())
            same_prefix = 0
            for x, y in zip(mine, g4ids):
                if x != y:
                    break
                same_prefix += 1
            t_me = tok.decode([t for t in mine if t not in (EOS, TURN_END)], skip_special_tokens=False)
            t_g4 = tok.decode([t for t in g4ids if t not in (EOS, TURN_END)], skip_special_tokens=False)
            ident = mine == g4ids
            same_ans = extract_answer(t_me) == extract_answer(t_g4)
            agree[key][0] += int(ident)
            agree[key][1] += int(same_ans)
            agree[key][2] += 1
            item[key] = {"identical": ident, "common_prefix": same_prefix, "len_torch": len(mine), "len_g4": len(g4ids),
                         "prefill_logits_max_abs_diff": dl, "answer_torch": extract_answer(t_me), "answer_g4": extract_answer(t_g4)}
            if not ident:
                item[key]["torch_ids"] = mine
                item[key]["g4_ids"] = g4ids
        log(json.dumps(item))
        report["items"].append(item)
    report["summary"] = {k: {"identical_greedy": v[0], "same_extracted_answer": v[1], "n": v[2]} for k, v in agree.items()}
    report["pytorch_reference_mode"] = {"fake": "full", "int": "full (fake-quant in f32)", "fake-hf": "hf", "float": "wonly"}
    log(json.dumps(report["summary"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


def cmd_tokenizer(args):
    build_tokenizer(args.out, args.vocab_size, args.seed, args.n_corpus, get_task(args.task))


def cmd_hfcheck(args):
    """Loads the export with transformers (GemmaQuantizer) in fp32 and compares logits with load_export()."""
    from transformers import Gemma4ForConditionalGeneration
    tok = load_tokenizer(args.model)
    task = get_task(args.task)
    if task.name == "json":
        with open(os.path.join(args.model, "test.jsonl"), encoding="utf-8") as f:
            test = [json.loads(line) for line in f]
    else:
        test = read_test(args.model)
    hf = Gemma4ForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager").eval()
    m = load_export(args.model, "cpu")
    worst = {}
    for mode in ("hf", "wonly"):
        set_mode(m, mode)
        if mode == "wonly":
            from transformers.integrations.gemma_quant import QuantizedLinear
            for mod in hf.modules():
                if isinstance(mod, QuantizedLinear):
                    mod.input_activation_scale.data.zero_()
                    mod.output_activation_scale.data.zero_()
        d = 0.0
        agree = 0
        for i in range(args.n):
            ids = tok.encode(task.prompt(test[i]) + task.reply(test[i]), add_special_tokens=False).ids
            x = torch.tensor([ids])
            with torch.no_grad():
                l_hf = hf(input_ids=x).logits[0]
                l_me = m(x)[0]
            d = max(d, float((l_hf - l_me).abs().max()))
            agree += int((l_hf.argmax(-1) == l_me.argmax(-1)).float().mean() == 1.0)
        worst[mode] = d
        log(f"hfcheck[{mode}]: max |logit diff| over {args.n} sequences = {d:.3e}; argmax identical on {agree}/{args.n}")
    print(json.dumps(worst))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("tokenizer")
    a.add_argument("--out", required=True)
    a.add_argument("--vocab-size", type=int, default=1024)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--n-corpus", type=int, default=20000)
    a.add_argument("--task", choices=("math", "json"), default="math", help="math: word problems; json: follow a JSON schema")
    a = sub.add_parser("train")
    a.add_argument("--out", required=True)
    a.add_argument("--tokenizer", help="directory with tokenizer.json etc. (default: --out)")
    a.add_argument("--scratch", help="where train_state.pt and the log go (default: --out)")
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--test-seed", type=int, default=2)
    a.add_argument("--n-train", type=int, default=400000)
    a.add_argument("--n-test", type=int, default=1000)
    a.add_argument("--n-eval", type=int, default=1000)
    a.add_argument("--arch-json")
    a.add_argument("--bs", type=int, default=256)
    a.add_argument("--lr", type=float, default=2e-3)
    a.add_argument("--min-lr-frac", type=float, default=0.05)
    a.add_argument("--wd", type=float, default=0.01)
    a.add_argument("--scale-lr-mult", type=float, default=1.0)
    a.add_argument("--warmup", type=int, default=100)
    a.add_argument("--time-budget", type=float, default=330.0, help="seconds of training (float + QAT)")
    a.add_argument("--float-frac", type=float, default=0.15, help="share of the time budget trained in float")
    a.add_argument("--float-steps", type=int, help="step-based schedule instead of the time budget")
    a.add_argument("--qat-steps", type=int)
    a.add_argument("--calib-batches", type=int, default=4)
    a.add_argument("--calib-tail", type=float, default=1e-4,
                   help="share of |x| above each static activation scale's calibration point (1e-4: 99.99th percentile, 5e-3: 99.5th)")
    a.add_argument("--calib-bs", type=int, default=256)
    a.add_argument("--eval-bs", type=int, default=500)
    a.add_argument("--log-every", type=int, default=50)
    a.add_argument("--n-greedy-ref", type=int, default=20)
    a.add_argument("--deadline", type=float, default=1e9, help="skip further evaluations past this many seconds")
    a.add_argument("--after-export-hook", help="shell command run right after the export (e.g. tar the files)")
    a.add_argument("--cpu", action="store_true")
    a.add_argument("--task", choices=("math", "json"), default="math", help="math: word problems; json: follow a JSON schema")
    a.add_argument("--length-batches", action="store_true",
                   help="each batch a random window of the sequences sorted by length (less padding; the json task)")
    a.add_argument("--max-batch-tokens", type=int, default=98304, help="with --length-batches: rows x length at most this")
    a = sub.add_parser("eval")
    a.add_argument("--model", required=True)
    a.add_argument("--n", type=int, default=1000)
    a.add_argument("--modes", default="full,hf,nokv,nopmp,wonly")
    a.add_argument("--write-answers", action="store_true", help="write the per-question answers to MODEL/torch_answers.json")
    a.add_argument("--eval-bs", type=int, default=500)
    a.add_argument("--cpu", action="store_true")
    a.add_argument("--task", choices=("math", "json"), default="math", help="the model's task (its test.jsonl's shape)")
    a = sub.add_parser("greedy")
    a.add_argument("--model", required=True)
    a.add_argument("--items", default="0,1,2,3,4")
    a.add_argument("--n", type=int, default=40)
    a.add_argument("--mode", default="full")
    a.add_argument("--no-stop", action="store_true")
    a = sub.add_parser("g4check")
    a.add_argument("--model", required=True)
    a.add_argument("--g4", default="./build/release/g4")
    a.add_argument("--items", default="0,1,2,3,4,5,6,7,8,9")
    a.add_argument("--n", type=int, default=40)
    a.add_argument("--out")
    a.add_argument("--check-g4-tokenizer", action="store_true")
    a.add_argument("--torch-ref", help="metrics.json of the training run: use its GPU greedy ids instead of CPU decoding")
    a.add_argument("--no-logits", action="store_true", help="skip the prefill-logit comparison")
    a = sub.add_parser("hfcheck")
    a.add_argument("--model", required=True)
    a.add_argument("--task", choices=("math", "json"), default="math")
    a.add_argument("--n", type=int, default=4)
    args = ap.parse_args()
    {"tokenizer": cmd_tokenizer, "train": cmd_train, "eval": cmd_eval, "greedy": cmd_greedy,
     "hfcheck": cmd_hfcheck, "g4check": cmd_g4check}[args.cmd](args)


if __name__ == "__main__":
    main()
