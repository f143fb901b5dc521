#!/usr/bin/env python3
r"""Train a small Gemma 4 MTP drafter (`gemma4_assistant`, the architecture of google/gemma-4-E2B-it-assistant)
for models/gemma4-tiny-math, with the target FROZEN, and export it as transformers'
Gemma4AssistantForCausalLM (config.json + BF16 model.safetensors).

Subcommands:

  train  --out DIR     generate problems (train_tiny_qat.make_problem, a fresh seed, test questions removed),
                       decode them greedily with the frozen target (exported checkpoint, full fake-quant
                       "litert" profile = g4 --act fake: int8 linears, int8 KV cache, PMP quantization), train
                       one or more drafter variants side by side on the target's own continuations, evaluate
                       each on held-out test.jsonl problems, export the chosen variant (--export) and check the
                       export in transformers (hfcheck); writes config.json, model.safetensors, metrics.json,
                       train_log.txt to DIR (and every variant to DIR/variants/NAME when --export-all)
  check  --drafter DIR re-run the transformers check and the acceptance evaluation of an exported drafter
                       (CPU is fine: --n 50)

Reproduce models/gemma4-tiny-math-drafter (one H200, ~450 s; the chosen variant h128_SF lands in OUT):
  python3 tools/train/train_drafter.py train --out OUT --n-train 80000 --gen-bs 2048 --gen-budget 100 \
      --bs 256 --steps 4000 --time-steps 50 --train-budget 320 --deadline 545 --reserve 55 --K 6 --export-all --hf-n 3
  python3 tools/train/train_drafter.py check --drafter OUT --n 40 --ref-out OUT/reference_drafts.json   # CPU

Semantics (transformers' SinglePositionMultiTokenCandidateGenerator, as g4 implements it): a draft round starts
after the target has fed tokens 0..p-1 and predicted token x_p at position p (not fed yet). Drafter step 1 input =
concat(target's scaled input embedding of x_p, target's post-final-norm hidden state of row p-1) ->
pre_projection -> drafter layers (all KV-shared: read-only attention to the target's K/V of its last
non-shared layer of the same type, here layer 2 for sliding and layer 3 for full attention; query at the
constant position p; full attention sees target positions [0, p-1], sliding attention the last
sliding_window+1 positions [p-1-W, p-1]) -> final norm -> logits (tied embedding, no softcap) and
post_projection = the hidden carried to step 2, whose token input is the step-1 token; same position, same
cache; and so on.

Training runs every round position p of a sequence in parallel: step j of the round at p reads token x_{p+j-1}
(teacher-forced: the target's own greedy tokens) and the carried hidden of step j-1 (step 1: the target's
row p-1), and is trained with cross-entropy (optionally plus KL) against the target's greedy token / distribution
at row p+j-1 (the row that predicts x_{p+j}), from the same frozen target forward pass. Only rounds that
occur in decoding count: P0 <= p <= len-2 (P0 = prompt length), and step j needs p+j <= len-1.
"""

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_tiny_qat as TQ  # noqa: E402

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


# ----------------------------------------------------------------------------------------------
# frozen target
# ----------------------------------------------------------------------------------------------


def load_target(model_dir, device):
    m = TQ.load_export(model_dir, device)
    TQ.set_mode(m, "full")  # every quantizer on: linears, int8 KV cache, PMP (= g4 --act fake / int defaults)
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@torch.no_grad()
def target_forward(m, ids):
    """ids [B,T] (right padding). Returns (h [B,T,H] post-final-norm hidden, logits [B,T,V] (softcapped),
    kv {type: (K [B,1,T,hd], V)}: the K/V of the last non-shared layer of each type, as the int8 cache holds them
    (dequantized)). Same arithmetic as TinyGemma4.forward."""
    B, T = ids.shape
    dev = ids.device
    e = F.embedding(ids, m.embed.get()) * float(math.sqrt(m.H))
    ple = F.embedding(ids, m.embed_ple.get()) * float(math.sqrt(m.P))
    z = F.linear(m.pmp_in(e), m.pmp) * (m.H ** -0.5)
    z = m.pmp_out(z)
    z = m.ple_norm(z.view(B, T, m.L, m.P))
    pli = (z + ple.view(B, T, m.L, m.P)) * (2.0 ** -0.5)
    pos = torch.arange(T, device=dev)[None].expand(B, T)
    qi = torch.arange(T, device=dev)
    causal = qi[None, :] <= qi[:, None]
    slide = causal & (qi[:, None] - qi[None, :] < m.window)
    masks = {"full_attention": causal, "sliding_attention": slide}
    rope = {}
    for t in ("sliding_attention", "full_attention"):
        fr = pos[..., None].float() * getattr(m, f"inv_{t}")[None, None, :]
        emb = torch.cat([fr, fr], -1)
        rope[t] = (emb.cos(), emb.sin())
    h = e
    shared = {}
    for i, layer in enumerate(m.layers):
        c, s = rope[layer.type]
        h = layer(h, pli[:, :, i], c, s, masks[layer.type], shared, None, 0)
    h = m.norm(h)
    logits = m.lm_head(h)
    logits = m.softcap * torch.tanh(logits / m.softcap)
    return h, logits, dict(shared)


def target_embed_table(m):
    """The target's scaled input embedding table: embed_tokens(t) * sqrt(hidden), dequantized (2-bit codes x scale)."""
    return (m.embed.get().detach().float() * float(math.sqrt(m.H))).clone()


# ----------------------------------------------------------------------------------------------
# drafter (transformers' own modules)
# ----------------------------------------------------------------------------------------------


def drafter_config(target_cfg, hidden, intermediate, layer_types, heads):
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig
    tc = target_cfg["text_config"]
    text = Gemma4TextConfig(
        vocab_size=tc["vocab_size"], hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=len(layer_types), layer_types=list(layer_types), num_attention_heads=heads,
        num_key_value_heads=tc["num_key_value_heads"], head_dim=tc["head_dim"], global_head_dim=tc["global_head_dim"],
        num_global_key_value_heads=tc.get("num_global_key_value_heads"),
        hidden_activation=tc["hidden_activation"], max_position_embeddings=tc["max_position_embeddings"],
        initializer_range=0.02, rms_norm_eps=tc["rms_norm_eps"], pad_token_id=tc["pad_token_id"],
        eos_token_id=tc["eos_token_id"], bos_token_id=tc["bos_token_id"], tie_word_embeddings=True,
        rope_parameters=tc["rope_parameters"], attention_bias=False, attention_dropout=0.0,
        sliding_window=tc["sliding_window"], final_logit_softcapping=None, use_bidirectional_attention=None,
        vocab_size_per_layer_input=0, hidden_size_per_layer_input=0, attention_k_eq_v=False,
        num_kv_shared_layers=len(layer_types), enable_moe_block=False, use_double_wide_mlp=False,
    )
    return Gemma4AssistantConfig(text_config=text, backbone_hidden_size=tc["hidden_size"],
                                 use_ordered_embeddings=False, tie_word_embeddings=True)


def new_drafter(cfg, device, seed, attn="sdpa"):
    from transformers import Gemma4AssistantForCausalLM
    torch.manual_seed(seed)
    cfg._attn_implementation = attn
    d = Gemma4AssistantForCausalLM(cfg).to(device).float()
    return d


def parallel_masks(T, q_off, window, device, dtype=torch.float32):
    """Additive masks [1,1,T-q_off,T] for queries at positions p = q_off..T-1 against target K/V positions
    0..T-1: full attention sees [0, p-1], sliding attention [p-1-W, p-1] (W+1 entries: transformers'
    bidirectional sliding mask |q-kv| <= W, flipped). Position 0 (no visible key) gets key 0 so the softmax
    stays finite; it is never a round position."""
    p = torch.arange(q_off, T, device=device)[:, None]
    k = torch.arange(T, device=device)[None, :]
    full = (k <= p - 1) | ((p == 0) & (k == 0))
    slide = full & (k >= p - 1 - window)
    neg = torch.finfo(dtype).min
    mk = lambda b: torch.zeros(b.shape, dtype=dtype, device=device).masked_fill(~b, neg)[None, None]
    return {"full_attention": mk(full), "sliding_attention": mk(slide)}


def drafter_unroll(d, tok_emb, h0, kv, masks, q_off, K, tokens_in):
    """Runs K drafter steps for every round position p in [q_off, T) at once.
    tok_emb: [V,Hb] target scaled embedding table; h0 [B,T,Hb] target post-norm hidden (row r);
    kv: target K/V {type: (K,V)} of all T positions; tokens_in: [B,T] the sequence tokens (teacher forcing).
    Step j (1-based) of the round at p reads token x_{p+j-1} and returns logits predicting x_{p+j}.
    Returns a list of K logits tensors [B, T-q_off, V]."""
    B, T = tokens_in.shape
    dev = tokens_in.device
    P = torch.arange(q_off, T, device=dev)
    hprev = h0[:, (P - 1).clamp_min(0)]  # row p-1
    pos = P[None].expand(B, -1)
    out = []
    for j in range(1, K + 1):
        idx = (P + j - 1).clamp_max(T - 1)
        x = tok_emb[tokens_in[:, idx]]
        inp = torch.cat([x, hprev], dim=-1)
        e = d.pre_projection(inp)
        o = d.model(inputs_embeds=e, attention_mask=masks, position_ids=pos, shared_kv_states=kv, use_cache=False)
        last = o.last_hidden_state
        out.append(d.lm_head(last))
        hprev = d.post_projection(last)
    return out


def step_targets(labels, lens, P0, q_off, K):
    """labels [B,T]: target argmax at row r (predicts x_{r+1}). For round p and step j: label at row p+j-1,
    valid iff P0 <= p <= len-2 and p+j <= len-1. Returns lists (label_j [B,T'], valid_j [B,T'])."""
    B, T = labels.shape
    dev = labels.device
    P = torch.arange(q_off, T, device=dev)[None]
    base = (P >= P0[:, None]) & (P <= lens[:, None] - 2)
    outl, outv = [], []
    for j in range(1, K + 1):
        idx = (P[0] + j - 1).clamp_max(T - 1)
        outl.append(labels[:, idx])
        outv.append(base & (P + j <= lens[:, None] - 1))
    return outl, outv, base


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------


def encode_prompts(tok, questions):
    return [tok.encode(TQ.chat_prompt(q), add_special_tokens=False).ids for q in questions]


def decode_target(target, prompts, device, max_new, bs, deadline=None):
    """Greedy continuations of the target (full fake-quant, K/V cache). Returns list of (prompt, gen)."""
    out = []
    t0 = time.time()
    for b0 in range(0, len(prompts), bs):
        if deadline is not None and time.time() > deadline and out:
            log(f"  generation deadline reached after {len(out)} sequences")
            break
        chunk = prompts[b0:b0 + bs]
        gens = TQ.greedy_batch(target, chunk, max_new, {TQ.EOS, TQ.TURN_END}, device, bs=bs)
        out.extend(zip(chunk, gens))
        log(f"  decoded {len(out)} sequences, {time.time() - t0:.1f}s")
    return out


def make_batch(seqs, device):
    """seqs: list of (prompt, gen). Right-padded ids [B,T], lens [B], P0 [B]."""
    lens = [len(p) + len(g) for p, g in seqs]
    T = max(lens)
    ids = torch.full((len(seqs), T), TQ.PAD, dtype=torch.long)
    for i, (p, g) in enumerate(seqs):
        ids[i, :lens[i]] = torch.tensor(p + g)
    return (ids.to(device), torch.tensor(lens, device=device), torch.tensor([len(p) for p, _ in seqs], device=device))


def length_batches(seqs, bs, rng):
    idx = list(range(len(seqs)))
    rng.shuffle(idx)
    mega = bs * 32
    batches = []
    for m0 in range(0, len(idx), mega):
        chunk = sorted(idx[m0:m0 + mega], key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
        for b0 in range(0, len(chunk), bs):
            b = chunk[b0:b0 + bs]
            if len(b) == bs:
                batches.append(b)
    rng.shuffle(batches)
    return batches


# ----------------------------------------------------------------------------------------------
# evaluation: acceptance of the target's greedy tokens
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def correctness(d, target, tok_emb, seqs, device, K, bs=64):
    """Per round (p) and step j: drafted argmax == target greedy token (teacher-forced = conditional on the
    earlier steps having matched). Returns list per sequence of bool arrays [n_rounds, K] (rounds p = P0..len-2;
    steps past the sequence end count as not accepted) and the share of target greedy tokens (teacher-forced
    argmax) equal to the decoded continuation."""
    res = []
    agree_n, agree_d = 0, 0
    W = d.config.text_config.sliding_window
    for b0 in range(0, len(seqs), bs):
        chunk = seqs[b0:b0 + bs]
        ids, lens, P0 = make_batch(chunk, device)
        B, T = ids.shape
        h, logits, kv = target_forward(target, ids)
        labels = logits.argmax(-1)
        q_off = int(P0.min())
        masks = parallel_masks(T, q_off, W, device)
        outs = drafter_unroll(d, tok_emb, h, kv, masks, q_off, K, ids)
        labs, vals, base = step_targets(labels, lens, P0, q_off, K)
        corr = torch.stack([(o.argmax(-1) == l) & v for o, l, v in zip(outs, labs, vals)], -1)  # [B,T',K]
        for i in range(B):
            a, n = int(P0[i]), int(lens[i])
            res.append(corr[i, a - q_off:n - 1 - q_off].cpu().numpy())
            # decoded token x_{r+1} vs teacher-forced argmax of row r, over the generated part
            agree_n += int((labels[i, a - 1:n - 1] == ids[i, a:n]).sum())
            agree_d += n - a
    return res, agree_n / max(1, agree_d)


def acceptance_stats(corr, K):
    """corr: list of [n_rounds, K] bool. Per-step conditional acceptance, expected accepted tokens per round
    (every position a round start), and a simulated greedy speculative decode for each draft length k."""
    C = np.concatenate([c for c in corr if len(c)], 0).astype(bool)
    cum = np.cumprod(C, axis=1).astype(bool)
    n = len(C)
    stats = {"rounds_all_positions": int(n)}
    cond = []
    for j in range(K):
        prev = cum[:, j - 1].sum() if j else n
        cond.append(float(cum[:, j].sum() / max(1, prev)))
    stats["step_acceptance_conditional"] = cond
    stats["step_acceptance_cumulative"] = [float(cum[:, j].mean()) for j in range(K)]
    stats["expected_accepted_per_round"] = {str(k): float(cum[:, :k].sum(1).mean()) for k in range(1, K + 1)}
    sim = {}
    for k in range(1, K + 1):
        rounds = toks = 0
        for c in corr:
            cc = np.cumprod(c[:, :k], axis=1).sum(1) if len(c) else []
            p = 0
            while p < len(c):
                a = int(cc[p])
                rounds += 1
                toks += min(a + 1, len(c) - p)  # an accepted stop token ends the reply: no bonus token after it
                p += a + 1
        sim[str(k)] = {"rounds": rounds, "tokens": toks, "tokens_per_round": toks / max(1, rounds),
                       "target_forwards_saved_ratio": (toks + len(corr)) / max(1, rounds + len(corr))}
    stats["simulated_decode"] = sim
    return stats


def fmt_stats(name, st, K):
    s = [f"[{name}] per-step conditional acceptance: " + " ".join(f"{a:.3f}" for a in st["step_acceptance_conditional"])]
    s.append(f"[{name}] E[accepted]/round (all positions), K=1..{K}: " +
             " ".join(f"{st['expected_accepted_per_round'][str(k)]:.3f}" for k in range(1, K + 1)))
    s.append(f"[{name}] simulated greedy decode tokens/round, K=1..{K}: " +
             " ".join(f"{st['simulated_decode'][str(k)]['tokens_per_round']:.3f}" for k in range(1, K + 1)))
    return "\n".join(s)


def drafter_cost(cfg):
    """MACs per drafter step excluding attention over the cache, attention MACs per visible cached position,
    and the parameter count."""
    tc = cfg.text_config
    H, I, V, Hb = tc.hidden_size, tc.intermediate_size, tc.vocab_size, cfg.backbone_hidden_size
    nh = tc.num_attention_heads
    macs = 2 * Hb * H + H * Hb + V * H  # pre_projection, post_projection, lm_head (tied embedding)
    nparams = macs + H  # + final norm
    attn = {}
    for i, t in enumerate(tc.layer_types):
        hd = tc.per_layer_config[i].head_dim
        macs += 2 * H * nh * hd + 3 * H * I
        nparams += 2 * H * nh * hd + 3 * H * I + 4 * H + hd
        attn[f"layer{i}_{t}"] = 2 * nh * hd
    return {"weight_macs_per_step": int(macs), "attention_macs_per_visible_position": attn, "params": int(nparams)}


# ----------------------------------------------------------------------------------------------
# transformers check
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def hfcheck(drafter_dir, d_ref, target, tok_emb, seqs, K, positions_per_seq=6):
    """Loads the export with transformers' Gemma4AssistantForCausalLM (fp32, eager) and compares, per round,
    transformers' own forward (its masks, K/V truncated to [0, p-1], one query at position p, the candidate
    generator's 2D attention mask) with this file's parallel training path (d_ref, float32 copy of the
    BF16 weights), K steps, teacher-forced token inputs."""
    from transformers import Gemma4AssistantForCausalLM
    hf = Gemma4AssistantForCausalLM.from_pretrained(drafter_dir, dtype=torch.float32, attn_implementation="eager").eval()
    dev = torch.device("cpu")
    d_ref = d_ref.to(dev)
    target = target.to(dev)
    tok_emb = tok_emb.to(dev)
    W = hf.config.text_config.sliding_window
    worst = 0.0
    argmax_same = tot = 0
    rng = random.Random(0)
    for prompt, gen in seqs:
        ids, lens, P0 = make_batch([(prompt, gen)], dev)
        T = ids.shape[1]
        h, logits, kv = target_forward(target, ids)
        masks = parallel_masks(T, 1, W, dev)
        outs = drafter_unroll(d_ref, tok_emb, h, kv, masks, 1, K, ids)
        a, n = int(P0[0]), int(lens[0])
        cand = list(range(a, n - 1))
        ps = sorted(set([a, n - 2] + rng.sample(cand, min(len(cand), positions_per_seq - 2))))
        for p in ps:
            shared = {t: (kv[t][0][:, :, :p], kv[t][1][:, :, :p]) for t in kv}
            hprev = h[:, p - 1:p]
            am = torch.ones(1, p + 1, dtype=torch.long)
            for j in range(1, K + 1):
                tj = ids[:, min(p + j - 1, T - 1)][:, None]
                inp = torch.cat([tok_emb[tj], hprev], dim=-1)
                o = hf(inputs_embeds=inp, attention_mask=am, position_ids=torch.tensor([[p]]), shared_kv_states=shared)
                ref = outs[j - 1][0, p - 1]
                worst = max(worst, float((o.logits[0, 0] - ref).abs().max()))
                argmax_same += int(o.logits[0, 0].argmax() == ref.argmax())
                tot += 1
                hprev = o.last_hidden_state
    return {"max_abs_logit_diff": worst, "argmax_identical": argmax_same, "compared": tot}


# ----------------------------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------------------------

DEFAULT_VARIANTS = [
    {"name": "h128_SF", "hidden": 128, "intermediate": 512, "layers": ["sliding_attention", "full_attention"], "heads": 4},
    {"name": "h64_SF", "hidden": 64, "intermediate": 256, "layers": ["sliding_attention", "full_attention"], "heads": 4},
    {"name": "h96_SF_2h", "hidden": 96, "intermediate": 384, "layers": ["sliding_attention", "full_attention"], "heads": 2},
    {"name": "h128_F", "hidden": 128, "intermediate": 512, "layers": ["full_attention"], "heads": 4},
]


def clean_config(path, tcfg):
    """Rewrites save_pretrained's config.json in the target's style: text_config with head_dim and
    global_head_dim (instead of transformers 5.17's per_layer_config), without the generic PretrainedConfig
    fields, keys sorted. transformers loads it to the same model (hfcheck runs on this file)."""
    c = json.load(open(path))
    tc = c["text_config"]
    tc.pop("per_layer_config", None)
    tc["global_head_dim"] = tcfg["text_config"]["global_head_dim"]
    tc["num_global_key_value_heads"] = tcfg["text_config"].get("num_global_key_value_heads")
    for k in ("id2label", "label2id", "_name_or_path", "architectures", "chunk_size_feed_forward", "is_encoder_decoder",
              "output_attentions", "output_hidden_states", "problem_type", "return_dict", "dtype"):
        tc.pop(k, None)
    with open(path, "w") as f:
        f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")


def bf16_copy(d, cfg, device):
    """A float32 drafter holding d's weights rounded to BF16 (what the export stores)."""
    e = new_drafter(cfg, device, 0, attn=d.config._attn_implementation)
    sd = {k: v.detach().to(torch.bfloat16).float() for k, v in d.state_dict().items()}
    e.load_state_dict(sd)
    e.tie_weights()
    return e.eval()


def cmd_train(args):
    t_start = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if dev.type == "cuda":
        # fp32 without TF32 everywhere: the target's int8 fake-quant rounding must see fp32 sums (as in g4 and in
        # train_tiny_qat.py's evaluation), and the drafter is small enough not to need TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    deadline = t_start + args.deadline
    log(f"device {dev}, torch {torch.__version__}")
    tcfg = json.load(open(os.path.join(args.model, "config.json")))
    tok = TQ.load_tokenizer(args.model)
    # ---- data: fresh problems (seed args.seed), the target's own greedy continuations
    test = TQ.read_test(args.model)
    test_q = set(q for q, _, _ in test)
    t0 = time.time()
    probs = TQ.gen_problems_parallel(args.seed, args.n_train, exclude=test_q)  # (forks workers: before CUDA)
    log(f"generated {len(probs)} problems (seed {args.seed}) in {time.time() - t0:.1f}s")
    target = load_target(args.model, dev)
    tok_emb = target_embed_table(target).to(dev)
    if args.data_cache and os.path.exists(args.data_cache):
        train_seqs, eval_seqs = json.load(open(args.data_cache))
        train_seqs, eval_seqs = [tuple(x) for x in train_seqs], [tuple(x) for x in eval_seqs]
        log(f"loaded decoded sequences from {args.data_cache}")
    else:
        train_seqs = decode_target(target, encode_prompts(tok, [q for q, _, _ in probs]), dev, args.max_new,
                                   args.gen_bs, deadline=t_start + args.gen_budget)
        eval_seqs = decode_target(target, encode_prompts(tok, [q for q, _, _ in test[:args.n_eval]]), dev,
                                  args.max_new, args.gen_bs)
        if args.data_cache:
            json.dump([train_seqs, eval_seqs], open(args.data_cache, "w"))
    n_gen = sum(len(g) for _, g in train_seqs)
    log(f"train: {len(train_seqs)} sequences, {n_gen} generated tokens ({n_gen / len(train_seqs):.1f}/seq); "
        f"eval: {len(eval_seqs)} held-out sequences; {time.time() - t_start:.1f}s so far")

    # ---- drafters
    variants = json.loads(args.variants) if args.variants else DEFAULT_VARIANTS
    K = args.K
    W = tcfg["text_config"]["sliding_window"]
    ds, opts, cfgs = [], [], []
    for vi, v in enumerate(variants):
        cfg = drafter_config(tcfg, v["hidden"], v["intermediate"], v["layers"], v["heads"])
        d = new_drafter(cfg, dev, args.torch_seed + vi)
        d.train()
        decay = [p for n, p in d.named_parameters() if p.ndim >= 2]
        nodecay = [p for n, p in d.named_parameters() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": nodecay, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
        ds.append(d)
        opts.append(opt)
        cfgs.append(cfg)
        log(f"variant {v['name']}: {json.dumps(v)}; cost {json.dumps(drafter_cost(cfg))}; "
            f"torch params {sum(p.numel() for p in d.parameters())}")
    step_w = torch.tensor([args.step_decay ** j for j in range(K)])
    step_w = (step_w / step_w.sum() * K).tolist()

    rng = random.Random(args.seed)
    batches = []
    step = 0
    total_steps = args.steps
    t_train0 = time.time()
    hist = []
    train_budget = args.train_budget
    timed = False
    while True:
        if not batches:
            batches = length_batches(train_seqs, args.bs, rng)
        bidx = batches.pop()
        ids, lens, P0 = make_batch([train_seqs[i] for i in bidx], dev)
        T = ids.shape[1]
        h, logits, kv = target_forward(target, ids)
        labels = logits.argmax(-1)
        q_off = int(P0.min())
        masks = parallel_masks(T, q_off, W, dev)
        labs, vals, _ = step_targets(labels, lens, P0, q_off, K)
        if args.kl > 0:
            tprob = [F.log_softmax(logits[:, (torch.arange(q_off, T, device=dev) + j).clamp_max(T - 1)].float(), -1)
                     for j in range(K)]
        # schedule
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            fr = min(1.0, (step - args.warmup) / max(1, total_steps - args.warmup))
            lr = args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * fr)))
        row = {"step": step}
        for vi, (d, opt) in enumerate(zip(ds, opts)):
            for g in opt.param_groups:
                g["lr"] = lr
            outs = drafter_unroll(d, tok_emb, h, kv, masks, q_off, K, ids)
            loss = 0.0
            accs = []
            for j in range(K):
                v = vals[j]
                lj = outs[j][v]
                ce = F.cross_entropy(lj, labs[j][v])
                lt = ce
                if args.kl > 0:
                    lt = (1 - args.kl) * ce + args.kl * F.kl_div(F.log_softmax(lj, -1), tprob[j][v], log_target=True,
                                                                  reduction="batchmean")
                loss = loss + step_w[j] * lt / K
                accs.append(float((lj.argmax(-1) == labs[j][v]).float().mean()) if step % args.log_every == 0 else 0.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
            opt.step()
            row[variants[vi]["name"]] = {"loss": float(loss.detach()), "acc": accs}
        if step % args.log_every == 0:
            hist.append(row)
            el = time.time() - t_train0
            log(f"step {step}/{total_steps} lr {lr:.2e} {el:.1f}s " + " | ".join(
                f"{variants[vi]['name']} loss {row[variants[vi]['name']]['loss']:.3f} acc(step1..K, unconditional) "
                + ",".join(f"{a:.2f}" for a in row[variants[vi]['name']]['acc']) for vi in range(len(ds))))
        step += 1
        if not timed and step == args.time_steps and args.time_budget_steps:
            # fix the step count from the measured speed so the cosine schedule ends inside the budget
            per = (time.time() - t_train0) / step
            total_steps = max(step + 1, min(args.steps, int(train_budget / per)))
            timed = True
            log(f"  {per * 1000:.0f} ms/step -> {total_steps} steps in the {train_budget:.0f}s training budget")
        if step >= total_steps:
            break
        if time.time() > deadline - args.reserve:
            log(f"  deadline: stopping at step {step}")
            break
    train_s = time.time() - t_train0
    log(f"trained {step} steps x batch {args.bs} in {train_s:.1f}s")

    # ---- evaluation on held-out problems (BF16-rounded weights = the export)
    results = {}
    for vi, (d, cfg) in enumerate(zip(ds, cfgs)):
        name = variants[vi]["name"]
        d.eval()
        e = bf16_copy(d, cfg, dev)
        try:
            corr, agree = correctness(e, target, tok_emb, eval_seqs, dev, K)
        except Exception as ex:  # keep the other variants and the export going
            log(f"[{name}] evaluation failed: {ex!r}")
            continue
        st = acceptance_stats(corr, K)
        corr32, _ = correctness(d, target, tok_emb, eval_seqs, dev, K)
        st32 = acceptance_stats(corr32, K)
        st["fp32_weights_step_acceptance_conditional"] = st32["step_acceptance_conditional"]
        st["fp32_weights_expected_accepted_per_round"] = st32["expected_accepted_per_round"]
        st["cost"] = drafter_cost(cfg)
        st["variant"] = variants[vi]
        results[name] = st
        log(fmt_stats(name + " bf16", st, K))
        log(f"[{name}] fp32 weights: conditional " + " ".join(f"{a:.3f}" for a in st32["step_acceptance_conditional"]))
        log(f"  teacher-forced target argmax == decoded continuation on {agree * 100:.2f} % of generated tokens")
    # ---- export
    os.makedirs(args.out, exist_ok=True)
    names = [v["name"] for v in variants]
    chosen = args.export if args.export else names[0]
    exports = names if args.export_all else [chosen]
    hfres = {}
    for name in exports:
        vi = names.index(name)
        outd = args.out if name == chosen else os.path.join(args.out, "variants", name)
        e = bf16_copy(ds[vi], cfgs[vi], dev)
        eb = bf16_copy(ds[vi], cfgs[vi], torch.device("cpu"))
        eb = eb.to(torch.bfloat16)
        eb.config._attn_implementation = "eager"
        eb.save_pretrained(outd)
        clean_config(os.path.join(outd, "config.json"), tcfg)
        from safetensors import safe_open
        with safe_open(os.path.join(outd, "model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
        log(f"exported {name} to {outd}: {len(keys)} tensors, {os.path.getsize(os.path.join(outd, 'model.safetensors'))} bytes")
        ecpu = bf16_copy(ds[vi], cfgs[vi], torch.device("cpu"))
        ecpu.config._attn_implementation = "eager"
        hfres[name] = hfcheck(outd, ecpu, load_target(args.model, torch.device("cpu")), tok_emb.cpu(), eval_seqs[:args.hf_n], K)
        log(f"hfcheck[{name}]: {json.dumps(hfres[name])}")
        results[name]["hfcheck"] = hfres[name]
        results[name]["safetensors_keys"] = keys
    metrics = {
        "target": args.model, "chosen": chosen, "K": K,
        "data": {"seed": args.seed, "train_sequences": len(train_seqs), "train_generated_tokens": n_gen,
                 "eval_sequences": len(eval_seqs), "eval_source": "test.jsonl (first n_eval)", "max_new": args.max_new,
                 "target_mode": "full fake-quant (litert profile: int8 linears + int8 KV + PMP) = g4 --act fake"},
        "train": {"steps": step, "batch": args.bs, "seconds": train_s, "lr": args.lr, "wd": args.wd, "kl": args.kl,
                  "step_weights": step_w, "warmup": args.warmup, "min_lr_frac": args.min_lr_frac},
        "results": results, "history": hist, "args": vars(args), "total_seconds": time.time() - t_start,
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    with open(os.path.join(args.out, "train_log.txt"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    log(f"done in {time.time() - t_start:.1f}s")


@torch.no_grad()
def reference_drafts(hf, target, tok_emb, seqs, items, offsets, K):
    """Free-running drafts through transformers' own forward, as SinglePositionMultiTokenCandidateGenerator
    drafts them (each step's token input = the previous step's argmax), at round positions P0 + offset of
    held-out replies: for g4's C drafter to compare with. Target: full fake-quant (g4 --act fake)."""
    out = []
    for it in items:
        prompt, gen = seqs[it]
        ids, lens, P0 = make_batch([(prompt, gen)], torch.device("cpu"))
        h, logits, kv = target_forward(target, ids)
        n = int(lens[0])
        for off in offsets:
            p = int(P0[0]) + off
            if p > n - 2:
                continue
            shared = {t: (kv[t][0][:, :, :p], kv[t][1][:, :, :p]) for t in kv}
            hprev = h[:, p - 1:p]
            tok = ids[:, p:p + 1]
            drafts, top = [], []
            for _ in range(K):
                inp = torch.cat([tok_emb[tok], hprev], dim=-1)
                o = hf(inputs_embeds=inp, position_ids=torch.tensor([[p]]), shared_kv_states=shared)
                lg = o.logits[0, 0]
                tok = lg.argmax()[None, None]
                drafts.append(int(tok))
                top.append(round(float(lg.max()), 4))
                hprev = o.last_hidden_state
            out.append({"item": it, "ids": ids[0, :n].tolist(), "prompt_len": int(P0[0]), "p": p,
                        "token_at_p": int(ids[0, p]), "drafts": drafts, "draft_max_logit": top,
                        "target_greedy_next": ids[0, p + 1:p + 1 + K].tolist()})
    return out


def cmd_check(args):
    from transformers import Gemma4AssistantForCausalLM
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    dev = torch.device("cpu")
    tok = TQ.load_tokenizer(args.model)
    target = load_target(args.model, dev)
    tok_emb = target_embed_table(target)
    test = TQ.read_test(args.model)
    seqs = decode_target(target, encode_prompts(tok, [q for q, _, _ in test[:args.n]]), dev, args.max_new, 64)
    d = Gemma4AssistantForCausalLM.from_pretrained(args.drafter, dtype=torch.float32, attn_implementation="eager").eval()
    res = hfcheck(args.drafter, d, target, tok_emb, seqs[:args.hf_n], args.K)
    log(f"hfcheck: {json.dumps(res)}")
    corr, agree = correctness(d, target, tok_emb, seqs, dev, args.K, bs=16)
    st = acceptance_stats(corr, args.K)
    log(fmt_stats("check", st, args.K))
    if args.ref_out:
        ref = reference_drafts(d, target, tok_emb, seqs, range(min(5, len(seqs))), (0, 7, 23, 41), args.K)
        with open(args.ref_out, "w") as f:
            json.dump({"about": reference_drafts.__doc__.strip(), "K": args.K, "rounds": ref}, f)
            f.write("\n")
        log(f"wrote {len(ref)} reference rounds to {args.ref_out}")
    print(json.dumps({"hfcheck": res, "acceptance": st}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("train")
    a.add_argument("--model", default="models/gemma4-tiny-math")
    a.add_argument("--out", required=True)
    a.add_argument("--seed", type=int, default=3, help="problem seed (the target was trained on seed 1, test is seed 2)")
    a.add_argument("--torch-seed", type=int, default=1)
    a.add_argument("--n-train", type=int, default=60000)
    a.add_argument("--n-eval", type=int, default=1000)
    a.add_argument("--max-new", type=int, default=192)
    a.add_argument("--gen-bs", type=int, default=2048)
    a.add_argument("--gen-budget", type=float, default=120.0, help="stop decoding training sequences after this many s")
    a.add_argument("--variants", help="JSON list of {name, hidden, intermediate, layers, heads}")
    a.add_argument("--export", help="variant to export to --out (default: the first)")
    a.add_argument("--export-all", action="store_true")
    a.add_argument("--K", type=int, default=6)
    a.add_argument("--bs", type=int, default=128)
    a.add_argument("--steps", type=int, default=3000)
    a.add_argument("--time-budget-steps", type=int, default=1, help="1: set the step count from the measured speed")
    a.add_argument("--time-steps", type=int, default=30)
    a.add_argument("--train-budget", type=float, default=300.0)
    a.add_argument("--lr", type=float, default=3e-3)
    a.add_argument("--min-lr-frac", type=float, default=0.05)
    a.add_argument("--wd", type=float, default=0.01)
    a.add_argument("--warmup", type=int, default=100)
    a.add_argument("--kl", type=float, default=0.0, help="weight of KL(target || drafter) mixed with the CE")
    a.add_argument("--step-decay", type=float, default=0.85, help="loss weight of step j ~ decay^(j-1)")
    a.add_argument("--log-every", type=int, default=100)
    a.add_argument("--hf-n", type=int, default=3)
    a.add_argument("--deadline", type=float, default=1e9)
    a.add_argument("--reserve", type=float, default=60.0, help="seconds kept for evaluation and export")
    a.add_argument("--data-cache", help="JSON file: load the decoded sequences from it if it exists, else write them")
    a.add_argument("--cpu", action="store_true")
    a = sub.add_parser("check")
    a.add_argument("--model", default="models/gemma4-tiny-math")
    a.add_argument("--drafter", required=True)
    a.add_argument("--n", type=int, default=20)
    a.add_argument("--hf-n", type=int, default=3)
    a.add_argument("--K", type=int, default=6)
    a.add_argument("--max-new", type=int, default=192)
    a.add_argument("--ref-out", help="write free-running reference drafts (transformers' forward) to this JSON file")
    args = ap.parse_args()
    {"train": cmd_train, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
