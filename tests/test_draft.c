/* Multi-token prediction (g4_draft, g4_drafter, the stepper's drafting rounds):
 *  - the draft step against transformers' Gemma4AssistantForCausalLM: tiny random drafters made
 *    for the two tiny fixtures (tests/fixtures/gen/gen_tiny_assistant.py), their goldens of the
 *    first round after a prompt (SinglePositionMultiTokenCandidateGenerator), in the float and
 *    fakequant-hf modes: drafted ids exactly, logits and next hidden states within the bands below;
 *  - the invariant: greedy decoding with a drafter gives exactly the tokens it gives without, in
 *    every activation mode, on both fixtures and on the built-in model with its trained drafter,
 *    alone and batched, through a stop id, a budget, a context end, a callback stop mid-round and a
 *    follow-up turn (the rolled-back cache must hold what plain decoding leaves);
 *  - the trained drafter's acceptance on the built-in model (a drafter fed wrong states drafts
 *    almost nothing the target accepts);
 *  - under a constraint (g4_generate_params.constraint): greedy decoding with the drafter gives the
 *    tokens it gives without (drafts the grammar leaves out rejected, the ones it allows taken), and
 *    speculative sampling's token is distributed as the constrained target's;
 *  - bad input: drafters that do not fit the target, malformed drafter files, bad flags. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <unistd.h>

#include "cli_util.h"
#include "generate/sampler.h"
#include "testutil.h"
#include "model/feed.h"

#define ASSIST_A "tests/fixtures/tiny-assistant"   /* for ../shared/fixtures/tiny-mobile, ordered embeddings */
#define ASSIST_B "tests/fixtures/tiny-assistant-b" /* for tests/fixtures/tiny-b, dense lm_head */
#define TINY_B "tests/fixtures/tiny-b"
#define BUILTIN "models/gemma4-tiny-math"
#define BUILTIN_DRAFT "models/gemma4-tiny-math-drafter"
#define K_GOLDEN 4

static g4_options opts_for(const char *act, const char *profile) {
    g4_options o;
    g4_options_default(&o);
    CHECK(g4_options_set(&o, "act", act) == 0, "%s", g4_last_error());
    if (profile) CHECK(g4_options_set(&o, "profile", profile) == 0, "%s", g4_last_error());
    o.ctx = 256;
    return o;
}

/* ---- the draft step against transformers ---- */

/* Largest |a - b| over the tokens the reference selected (its logits above the masked fill) and
 * whether both rows put the fill on the same tokens. */
static double selected_diff(const float *got, const float *want, int V, int *same_mask) {
    float fill = INFINITY;
    for (int i = 0; i < V; i++) fill = want[i] < fill ? want[i] : fill;
    double m = 0;
    *same_mask = 1;
    float gfill = INFINITY;
    for (int i = 0; i < V; i++) gfill = got[i] < gfill ? got[i] : gfill;
    for (int i = 0; i < V; i++) {
        int w_sel = want[i] != fill, g_sel = got[i] != gfill;
        if (w_sel != g_sel) *same_mask = 0;
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* One prompt in one mode: the target's prefill (its next token and final-normed hidden state),
 * then K_GOLDEN draft steps from the target's own hidden state; the drafted ids must be the
 * reference's. Bands: float, 1e-4 (test_fixture.c's float band; measured up to 5.5e-5 in the
 * draft logits); fakequant-hf, where one int8 code of the target may round the other way (on
 * tiny-assistant's prompt 1 one does: 0.04 in the hidden state, 0.23 in the draft logits, whose
 * largest are about 11), 0.1 and 0.5; the other prompts agree within 2e-5 there too. */
static void golden_case(const g4_model *m, const g4_draft *d, const g4_safetensors *gs, const cJSON *prompt, int index, const char *mode,
                        const char *name) {
    int fake = strcmp(mode, "float") != 0;
    g4_options o = fake ? opts_for("fake", "hf") : opts_for("float", NULL);
    g4_session *s = g4_session_new(m, &o);
    g4_drafter *dr = s ? g4_drafter_new(d, s) : NULL;
    CHECK(dr != NULL, "%s", g4_last_error());
    if (!dr) {
        g4_session_free(s);
        return;
    }
    int n;
    int32_t *ids = json_ids(cJSON_GetObjectItem(prompt, "prompt_ids"), &n);
    const cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(prompt, "modes"), mode);
    int V = g4_model_vocab_size(m), Hb = g4_model_hidden_size(m);
    g4_batch_row rows[64];
    for (int i = 0; i < n; i++) rows[i] = (g4_batch_row){.seq = 0, .token = ids[i]};
    rows[n - 1].output = G4_OUTPUT_ARGMAX;
    CHECK(g4_decode(s, rows, n) == 0, "%s", g4_last_error());
    int t0 = (int)cJSON_GetObjectItem(want, "t0")->valuedouble;
    CHECK(rows[n - 1].argmax == t0, "%s p%d %s: the target's next token %d, transformers %d", name, index, mode, rows[n - 1].argmax, t0);
    float *h = malloc(sizeof *h * (size_t)Hb), *logits = malloc(sizeof *logits * (size_t)V);
    char key[96];
    CHECK(g4_decode_hidden(s, n - 1, h) == 0, "%s", g4_last_error());
    snprintf(key, sizeof key, "p%d.%s.target_last_hidden", index, mode);
    const float *h_ref = golden_f32(gs, key, NULL);
    double tol = fake ? 0.1 : 1e-4;
    double dh = max_abs_diff(h, h_ref, Hb);
    CHECK(dh <= tol, "%s p%d %s: the target's last hidden state differs by %g (band %g)", name, index, mode, dh, tol);
    snprintf(key, sizeof key, "p%d.%s.draft_logits", index, mode);
    const float *l_ref = golden_f32(gs, key, NULL);
    snprintf(key, sizeof key, "p%d.%s.draft_proj", index, mode);
    const float *p_ref = golden_f32(gs, key, NULL);
    int n_draft;
    int32_t *drafted = json_ids(cJSON_GetObjectItem(want, "drafted_ids"), &n_draft);
    CHECK(n_draft == K_GOLDEN, "%s: %d golden drafts", name, n_draft);
    int seq = 0;
    int32_t token = t0;
    double worst_l = 0, worst_p = 0;
    for (int j = 0; j < n_draft; j++) {
        int32_t next = -1;
        CHECK(g4_drafter_step(dr, 1, &seq, &token, h, &next, logits) == 0, "%s", g4_last_error());
        CHECK(next == drafted[j], "%s p%d %s step %d: drafted %d, transformers %d", name, index, mode, j, next, drafted[j]);
        int same;
        double dl = selected_diff(logits, l_ref + (size_t)j * V, V, &same), dp = max_abs_diff(h, p_ref + (size_t)j * Hb, Hb);
        CHECK(same, "%s p%d %s step %d: the centroid-selected tokens differ from transformers'", name, index, mode, j);
        worst_l = dl > worst_l ? dl : worst_l;
        worst_p = dp > worst_p ? dp : worst_p;
        CHECK(g4_argmax(logits, V) == next, "%s step %d: the greedy draft is not the logits' argmax", name, j);
        token = drafted[j]; /* the reference's path, whatever this step drafted */
    }
    double band = fake ? 0.5 : 1e-4;
    CHECK(worst_l <= band, "%s p%d %s: draft logits differ by up to %g (band %g)", name, index, mode, worst_l, band);
    CHECK(worst_p <= band, "%s p%d %s: next hidden states differ by up to %g (band %g)", name, index, mode, worst_p, band);
    printf("golden %s p%d (%d tokens) %s: hidden %.2e, draft logits %.2e, next hidden %.2e\n", name, index, n, mode, dh, worst_l, worst_p);
    free(drafted);
    free(h);
    free(logits);
    free(ids);
    g4_drafter_free(dr);
    g4_session_free(s);
}

static void test_goldens(const char *target_dir, const char *draft_dir) {
    g4_model *m = g4_model_load(target_dir);
    g4_draft *d = m ? g4_draft_load(draft_dir, m) : NULL;
    CHECK(d != NULL, "%s: %s", draft_dir, g4_last_error());
    char path[4096];
    snprintf(path, sizeof path, "%s/golden.json", draft_dir);
    cJSON *g = read_json(path);
    g4_safetensors gs;
    snprintf(path, sizeof path, "%s/golden.safetensors", draft_dir);
    CHECK(g4_st_open_file(&gs, path) == 0, "%s", g4_last_error());
    const cJSON *prompts = cJSON_GetObjectItem(g, "prompts");
    CHECK(cJSON_GetArraySize(prompts) == 3, "%s: %d prompts", path, cJSON_GetArraySize(prompts));
    for (int i = 0; d && i < cJSON_GetArraySize(prompts); i++) {
        golden_case(m, d, &gs, cJSON_GetArrayItem(prompts, i), i, "float", draft_dir);
        golden_case(m, d, &gs, cJSON_GetArrayItem(prompts, i), i, "fakequant-hf", draft_dir);
    }
    g4_st_close(&gs);
    cJSON_Delete(g);
    g4_draft_free(d);
    g4_model_free(m);
}

/* ---- the invariant ---- */

typedef struct {
    int32_t ids[512];
    int n, stop_at; /* stop_at: the callback stops after this many tokens (0: never) */
} collected;

static int collect(void *user, int32_t t) {
    collected *c = user;
    if (c->n < 512) c->ids[c->n] = t;
    c->n++;
    return c->stop_at && c->n == c->stop_at;
}

/* A generation of up to `budget` tokens (the model's stop ids, or none) from `prompt`, then a
 * follow-up turn of 8 tokens from the last token; with the drafter when dr is not NULL. Returns
 * the session's position after each turn through pos[2]. */
static void generate_two_turns(g4_session *s, g4_drafter *dr, int k, const int32_t *prompt, int n_prompt, int budget, int model_stops,
                               int stop_at, collected *c, int pos[2], g4_generate_result *res) {
    static const int none[1] = {-1};
    g4_generate_params p = {.max_tokens = budget, .draft = dr, .draft_tokens = k};
    g4_sampling_default(&p.sampling);
    if (!model_stops) p.stop_ids = none, p.n_stop_ids = 1;
    g4_session_reset(s);
    memset(c, 0, sizeof *c);
    c->stop_at = stop_at;
    CHECK(g4_generate(s, prompt, n_prompt, &p, collect, c, res) == 0, "%s", g4_last_error());
    pos[0] = g4_session_pos(s);
    int32_t last = c->n > 0 ? c->ids[c->n < 512 ? c->n - 1 : 511] : prompt[n_prompt - 1];
    p.max_tokens = 8;
    p.stop_ids = none, p.n_stop_ids = 1;
    c->stop_at = 0;
    g4_generate_result r2;
    CHECK(g4_generate(s, &last, 1, &p, collect, c, &r2) == 0, "%s", g4_last_error());
    pos[1] = g4_session_pos(s);
}

/* Greedy decoding of a few prompts with and without the drafter, in each activation mode, for
 * draft lengths 1, 3, the default and 8: the same tokens, stop reasons and cache positions. */
static void test_invariant(const char *target_dir, const char *draft_dir, const int32_t *prompt, int n_prompt, int budget) {
    g4_model *m = g4_model_load(target_dir);
    g4_draft *d = m ? g4_draft_load(draft_dir, m) : NULL;
    CHECK(d != NULL, "%s: %s", draft_dir, g4_last_error());
    static const char *const acts[][2] = {{"float", NULL}, {"fake", NULL}, {"int", NULL}, {"fake", "hf"}};
    static const int ks[] = {1, 3, 0, 8};
    long rounds_total = 0;
    for (size_t a = 0; d && a < sizeof acts / sizeof *acts; a++) {
        g4_options o = opts_for(acts[a][0], acts[a][1]);
        o.ctx = n_prompt + budget + 16;
        g4_session *s = g4_session_new(m, &o);
        g4_drafter *dr = s ? g4_drafter_new(d, s) : NULL;
        CHECK(dr != NULL, "%s", g4_last_error());
        if (!dr) {
            g4_session_free(s);
            continue;
        }
        /* every stop: no stop ids and the budget; the model's stop ids; a callback stop at token 7 */
        for (int stops = 0; stops < 3; stops++) {
            collected plain, spec;
            int pp[2], ps[2];
            g4_generate_result rp, rs;
            int stop_at = stops == 2 ? 7 : 0;
            generate_two_turns(s, NULL, 0, prompt, n_prompt, budget, stops == 1, stop_at, &plain, pp, &rp);
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
                generate_two_turns(s, dr, ks[ki], prompt, n_prompt, budget, stops == 1, stop_at, &spec, ps, &rs);
                int same = plain.n == spec.n && !memcmp(plain.ids, spec.ids, sizeof *plain.ids * (size_t)(plain.n < 512 ? plain.n : 512));
                CHECK(same, "%s --act %s%s%s, k %d, stops %d: %d tokens with the drafter, %d without, or different ones", target_dir,
                      acts[a][0], acts[a][1] ? " --profile " : "", acts[a][1] ? acts[a][1] : "", ks[ki], stops, spec.n, plain.n);
                CHECK(rs.stop == rp.stop && rs.n_generated == rp.n_generated, "%s k %d: stop %s after %d, without %s after %d", target_dir,
                      ks[ki], g4_stop_reason_name(rs.stop), rs.n_generated, g4_stop_reason_name(rp.stop), rp.n_generated);
                CHECK(ps[0] == pp[0] && ps[1] == pp[1], "%s k %d stops %d: cache positions %d, %d with the drafter, %d, %d without", target_dir,
                      ks[ki], stops, ps[0], ps[1], pp[0], pp[1]);
            }
        }
        g4_drafter_free(dr);
        g4_session_free(s);
        rounds_total++;
    }
    printf("invariant %s with %s: greedy tokens equal in %ld modes x 4 draft lengths x 3 stops (+ a follow-up turn)\n", target_dir, draft_dir,
           rounds_total);
    g4_draft_free(d);
    g4_model_free(m);
}

/* Several sequences in one stepper, every one drafting (two greedy, one sampling), each giving the
 * tokens it gives alone (greedy: alone without the drafter); and a context that ends mid-round. */
static void test_batched(const char *target_dir, const char *draft_dir) {
    enum { N_SEQ = 3, BUDGET = 40 };
    g4_model *m = g4_model_load(target_dir);
    g4_draft *d = m ? g4_draft_load(draft_dir, m) : NULL;
    CHECK(d != NULL, "%s", g4_last_error());
    if (!d) {
        g4_model_free(m);
        return;
    }
    static const int none[1] = {-1};
    static const int32_t prompts[N_SEQ][6] = {{2, 10, 20, 30, 40, 50}, {2, 7, 9}, {2, 300, 301, 302, 303}};
    static const int lens[N_SEQ] = {6, 3, 5};
    int32_t alone[N_SEQ][BUDGET];
    g4_options o = opts_for("int", NULL);
    for (int q = 0; q < N_SEQ; q++) {
        g4_session *s = g4_session_new(m, &o);
        /* greedy ones alone without the drafter (the invariant); the sampling one alone with it
         * (speculative sampling draws other tokens than plain sampling, from the same distribution) */
        g4_drafter *alone_dr = q == 2 && s ? g4_drafter_new(d, s) : NULL;
        g4_generate_params p = {.max_tokens = BUDGET, .stop_ids = none, .n_stop_ids = 1, .draft = alone_dr, .draft_tokens = 2 + q};
        g4_sampling_default(&p.sampling);
        if (q == 2) p.sampling.temperature = 0.8f, p.sampling.seed = 5;
        collected c = {0};
        g4_generate_result r;
        CHECK(s && g4_generate(s, prompts[q], lens[q], &p, collect, &c, &r) == 0 && c.n == BUDGET, "%s", g4_last_error());
        memcpy(alone[q], c.ids, sizeof alone[q]);
        g4_drafter_free(alone_dr);
        g4_session_free(s);
    }
    o.n_seq = N_SEQ;
    g4_session *s = g4_session_new(m, &o);
    g4_drafter *dr = s ? g4_drafter_new(d, s) : NULL;
    g4_stepper *st = dr ? g4_stepper_new(s, 0) : NULL;
    CHECK(st != NULL, "%s", g4_last_error());
    for (int q = 0; st && q < N_SEQ; q++) {
        g4_generate_params p = {.max_tokens = BUDGET, .stop_ids = none, .n_stop_ids = 1, .draft = dr, .draft_tokens = 2 + q};
        g4_sampling_default(&p.sampling);
        if (q == 2) p.sampling.temperature = 0.8f, p.sampling.seed = 5;
        CHECK(g4_stepper_add(st, q, prompts[q], lens[q], &p) == 0, "%s", g4_last_error());
    }
    g4_step_token *ev = st ? malloc(sizeof *ev * (size_t)g4_stepper_max_tokens(st)) : NULL;
    while (st && ev && g4_stepper_active(st) > 0) CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
    for (int q = 0; st && q < N_SEQ; q++) {
        int n;
        const int32_t *got = g4_stepper_tokens(st, q, &n);
        CHECK(n == BUDGET && !memcmp(got, alone[q], sizeof alone[q]), "%s batched seq %d: %d tokens, not its own %d", target_dir, q, n,
              BUDGET);
    }
    long rounds, drafted, accepted;
    if (st) {
        g4_stepper_draft_stats(st, &rounds, &drafted, &accepted);
        CHECK(rounds > 0 && drafted >= rounds, "%s: %ld rounds, %ld drafts", target_dir, rounds, drafted);
    }
    free(ev);
    g4_stepper_free(st);
    /* the context ends inside what a round would draft: rows past it are never asked for */
    g4_session_free(s);
    o.n_seq = 1;
    o.ctx = lens[0] + 9;
    s = g4_session_new(m, &o);
    g4_drafter_free(dr);
    dr = s ? g4_drafter_new(d, s) : NULL;
    for (int with = 0; dr && with < 2; with++) {
        g4_generate_params p = {.max_tokens = 100, .stop_ids = none, .n_stop_ids = 1, .draft = with ? dr : NULL, .draft_tokens = 8};
        g4_sampling_default(&p.sampling);
        collected c = {0};
        g4_generate_result r;
        g4_session_reset(s);
        CHECK(g4_generate(s, prompts[0], lens[0], &p, collect, &c, &r) == 0, "%s", g4_last_error());
        CHECK(r.stop == G4_STOP_CONTEXT && c.n == 10 && !memcmp(c.ids, alone[0], sizeof *c.ids * 10) && g4_session_pos(s) == o.ctx,
              "context end %s the drafter: %s after %d tokens at position %d", with ? "with" : "without", g4_stop_reason_name(r.stop), c.n,
              g4_session_pos(s));
    }
    g4_drafter_free(dr);
    g4_session_free(s);
    g4_draft_free(d);
    g4_model_free(m);
}

/* The built-in model's example prompt through its chat template (caller frees). */
static int32_t *builtin_prompt(int *n) {
    char *text = slurp(BUILTIN "/example_prompt.txt");
    g4_tokenizer *tok = g4_tokenizer_load(BUILTIN "/tokenizer.json");
    int32_t *ids = NULL;
    size_t len = 0;
    g4_chat_message msg = {.role = G4_CHAT_USER, .content = text};
    g4_chat_options co = g4_chat_default_options();
    co.add_bos = 1;
    co.add_generation_prompt = 1;
    CHECK(*text && tok && g4_chat_encode(tok, &msg, 1, &co, &ids, &len) == 0, "%s", g4_last_error());
    g4_tokenizer_free(tok);
    free(text);
    *n = (int)len;
    return ids;
}

/* The built-in model's trained drafter drafts what the target says most of the time. */
static void test_acceptance(const char *draft_dir) {
    g4_model *m = g4_model_load(BUILTIN);
    g4_draft *d = m ? g4_draft_load(draft_dir, m) : NULL;
    CHECK(d != NULL, "%s: %s", draft_dir, g4_last_error());
    g4_options o = opts_for("int", NULL);
    o.ctx = 512;
    g4_session *s = d ? g4_session_new(m, &o) : NULL;
    g4_drafter *dr = s ? g4_drafter_new(d, s) : NULL;
    g4_stepper *st = dr ? g4_stepper_new(s, 0) : NULL;
    int n = 0;
    int32_t *ids = builtin_prompt(&n);
    if (st && ids) {
        g4_generate_params p = {.max_tokens = 200, .draft = dr};
        g4_sampling_default(&p.sampling);
        CHECK(g4_stepper_add(st, 0, ids, (int)n, &p) == 0, "%s", g4_last_error());
        g4_step_token ev[G4_MAX_DRAFT_TOKENS + 1];
        while (g4_stepper_active(st) > 0) CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
        long rounds, drafted, accepted;
        g4_stepper_draft_stats(st, &rounds, &drafted, &accepted);
        double rate = drafted ? (double)accepted / drafted : 0;
        int n_gen;
        g4_stepper_tokens(st, 0, &n_gen);
        printf("acceptance of %s on the built-in model's example prompt: %ld of %ld drafts (%.3f), %d tokens in %ld rounds\n", draft_dir,
               accepted, drafted, rate, n_gen, rounds);
        CHECK(rate >= 0.8, "the trained drafter's acceptance %.3f is below 0.8 (0.933 measured; drafting from a stale hidden state gives 0.57)", rate);
    }
    free(ids);
    g4_stepper_free(st);
    g4_drafter_free(dr);
    g4_session_free(s);
    g4_draft_free(d);
    g4_model_free(m);
}

/* ---- under a constraint ---- */

typedef struct {
    g4_tokenizer *tok;
    g4_grammar_vocab *vocab;
    g4_grammar *g;
    g4_grammar_state *start;
    uint32_t *mask;
} constraint;

/* A GBNF grammar over the model's tokenizer; 0 (checked) when it cannot be made. */
static int constraint_open(constraint *c, const char *model_dir, const char *gbnf, int V) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    c->tok = g4_tokenizer_load(path);
    c->vocab = c->tok ? g4_grammar_vocab_new(c->tok) : NULL;
    c->g = c->vocab ? g4_grammar_compile(gbnf, strlen(gbnf)) : NULL;
    c->start = c->g ? g4_grammar_start(c->g) : NULL;
    c->mask = calloc(((size_t)V + 31) / 32, sizeof *c->mask);
    CHECK(c->start && c->mask, "%s: %s", gbnf, g4_last_error());
    return c->start && c->mask;
}

static void constraint_close(constraint *c) {
    g4_grammar_state_free(c->start);
    g4_grammar_free(c->g);
    g4_grammar_vocab_free(c->vocab);
    g4_tokenizer_free(c->tok);
    free(c->mask);
}

/* logits with what the grammar leaves out at -infinity, from state `from` advanced by token `then` (-1: none). */
static void constraint_mask(constraint *c, const g4_grammar_state *from, int32_t then, float *logits, int V) {
    g4_grammar_state *st = g4_grammar_state_copy(from);
    CHECK(st && (then < 0 || g4_grammar_accept_token(c->vocab, st, then) == 0) && g4_grammar_mask(c->vocab, st, NULL, 0, c->mask) > 0,
          "mask after %d: %s", then, g4_last_error());
    for (int v = 0; v < V; v++)
        if (!st || (size_t)v >= g4_grammar_vocab_size(c->vocab) || !((c->mask[v >> 5] >> (v & 31)) & 1)) logits[v] = -INFINITY;
    g4_grammar_state_free(st);
}

/* Greedy constrained decoding of the built-in model's example prompt with its trained drafter, for
 * draft lengths 1, 3, the default and 8, gives the tokens it gives without the drafter, each
 * accepted by a fresh state of the grammar. Under grammars that forbid what the model would say
 * (`[^=]*`: no "="), some drafts are taken and some not; under a grammar of one token sequence (a
 * literal of single-digit tokens the model would not write) the drafts, masked by the grammar
 * state the round's earlier drafts leave, are exactly the target's picks: every one is taken. */
static void test_constrained_greedy(void) {
    static const char *const grammars[] = {"root ::= [^=]*", "root ::= [^=+]* \"#### \" [0-9]+ [^0-9=] [^=]*",
                                           "root ::= \"98765432109876543210\""};
    g4_model *m = g4_model_load(BUILTIN);
    g4_draft *d = m ? g4_draft_load(BUILTIN_DRAFT, m) : NULL;
    CHECK(d != NULL, "%s", g4_last_error());
    int V = m ? g4_model_vocab_size(m) : 0, n_prompt = 0;
    int32_t *prompt = builtin_prompt(&n_prompt);
    g4_options o = opts_for("int", NULL);
    o.ctx = 512;
    g4_session *s = d ? g4_session_new(m, &o) : NULL;
    g4_drafter *dr = s ? g4_drafter_new(d, s) : NULL;
    CHECK(dr != NULL, "%s", g4_last_error());
    static const int ks[] = {1, 3, 0, 8};
    for (size_t gi = 0; dr && gi < sizeof grammars / sizeof *grammars; gi++) {
        constraint c = {0};
        if (!constraint_open(&c, BUILTIN, grammars[gi], V)) break;
        int32_t plain[200];
        int n_plain = 0;
        g4_generate_result rp = {0};
        for (int ki = -1; ki < (int)(sizeof ks / sizeof *ks); ki++) {
            g4_generate_params p = {.max_tokens = 200, .draft = ki >= 0 ? dr : NULL, .draft_tokens = ki >= 0 ? ks[ki] : 0,
                                    .constraint = c.start, .constraint_vocab = c.vocab};
            g4_sampling_default(&p.sampling);
            g4_stepper *st = g4_stepper_new(s, 0);
            g4_session_reset(s);
            CHECK(st && g4_stepper_add(st, 0, prompt, n_prompt, &p) == 0, "%s", g4_last_error());
            g4_step_token ev[G4_MAX_DRAFT_TOKENS + 1];
            while (st && g4_stepper_active(st) > 0) CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
            int n = 0;
            const int32_t *ids = st ? g4_stepper_tokens(st, 0, &n) : NULL;
            g4_generate_result r = {0};
            if (st) g4_stepper_result(st, 0, &r);
            long rounds = 0, drafted = 0, accepted = 0;
            if (st) g4_stepper_draft_stats(st, &rounds, &drafted, &accepted);
            if (ki < 0) {
                n_plain = n < 200 ? n : 200;
                memcpy(plain, ids, sizeof *ids * (size_t)n_plain);
                rp = r;
                /* every token in the grammar: a fresh state takes each but a final stop id */
                g4_grammar_state *fresh = g4_grammar_start(c.g);
                int body = r.stop == G4_STOP_EOS && r.stop_id >= 0 ? n - 1 : n, ok = fresh != NULL;
                for (int i = 0; ok && i < body; i++) ok = g4_grammar_accept_token(c.vocab, fresh, ids[i]) == 0;
                CHECK(ok && r.stop != G4_STOP_ERROR, "%s: the plain constrained reply breaks the grammar (%s)", grammars[gi],
                      g4_stop_reason_name(r.stop));
                g4_grammar_state_free(fresh);
            } else {
                CHECK(n == n_plain && !memcmp(ids, plain, sizeof *ids * (size_t)n) && r.stop == rp.stop,
                      "%s, k %d: %d tokens (%s) with the drafter, %d (%s) without, or other ones", grammars[gi], ks[ki], n,
                      g4_stop_reason_name(r.stop), n_plain, g4_stop_reason_name(rp.stop));
                if (gi < 2)
                    CHECK(rounds > 0 && accepted > 0 && drafted > accepted, "%s, k %d: %ld rounds, %ld of %ld drafts taken: expected some taken, some not",
                          grammars[gi], ks[ki], rounds, accepted, drafted);
                else { /* one token sequence: drafts masked by the grammar are the target's own picks, so after the prompt's
                        * token each round gives k + 1 tokens (a drafted stop id ends it, taken but not counted as a draft) */
                    int k = ks[ki] ? ks[ki] : G4_DRAFT_TOKENS_DEFAULT;
                    CHECK(n == 21 && rounds == (n - 1 + k) / (k + 1), "%s, k %d: %d tokens in %ld rounds (%ld of %ld drafts taken): expected every draft "
                          "taken (unmasked drafts, k 3: 1 of 57 in 19 rounds)", grammars[gi], k, n, rounds, accepted, drafted);
                }
                if (ks[ki] == 0)
                    printf("constrained greedy with the drafter (%s): the same %d tokens, %ld of %ld drafts taken in %ld rounds\n", grammars[gi], n,
                           accepted, drafted, rounds);
            }
            g4_stepper_free(st);
        }
        constraint_close(&c);
    }
    free(prompt);
    g4_drafter_free(dr);
    g4_session_free(s);
    g4_draft_free(d);
    g4_model_free(m);
}

/* ---- speculative sampling ---- */

/* Speculative sampling keeps the target's distribution: over many seeds, the second generated
 * token (the first that a round's drafts decide) is distributed as the exact marginal
 * sum_t0 p(t0) p(t1 | t0), computed from the target's logits, within a total-variation distance
 * of 0.05 (N = 4000 draws over at most 16 outcomes: top-k 4 at both positions; sampling noise alone
 * gives about 0.02-0.03); plain sampling is held to the same bound; and the drafter's distribution
 * itself is far from it (so the bound can tell). Deterministic: seeds 1..N, exact arithmetic. */
static void test_spec_sampling(const char *target_dir, const char *draft_dir, const int32_t *prompt, int n_prompt, float temp, int control,
                               const char *gbnf) {
    enum { N = 4000 };
    g4_model *m = g4_model_load(target_dir);
    g4_draft *d = m ? g4_draft_load(draft_dir, m) : NULL;
    CHECK(d != NULL, "%s", g4_last_error());
    if (!d) {
        g4_model_free(m);
        return;
    }
    int V = g4_model_vocab_size(m);
    g4_options o = opts_for("int", NULL);
    g4_session *s = g4_session_new(m, &o);
    g4_drafter *dr = s ? g4_drafter_new(d, s) : NULL;
    g4_sampling sp;
    g4_sampling_default(&sp);
    sp.temperature = temp, sp.top_k = 4;
    /* the exact marginal of the second token */
    g4_sampler *smp = g4_sampler_new(&sp, V);
    double *p0 = calloc((size_t)V, sizeof *p0), *p1 = calloc((size_t)V, sizeof *p1), *marg = calloc((size_t)V, sizeof *marg);
    double *cnt_spec = calloc((size_t)V, sizeof *cnt_spec), *cnt_plain = calloc((size_t)V, sizeof *cnt_plain), *qd = calloc((size_t)V, sizeof *qd);
    float *logits = malloc(sizeof *logits * (size_t)V), *h = malloc(sizeof *h * (size_t)g4_model_hidden_size(m));
    /* under a grammar: the target's distributions are those of its logits with what the grammar
     * leaves out at -infinity (the stepper masks before the sampler's processors) */
    constraint cons = {0};
    int bad = 0;
    if (gbnf && !constraint_open(&cons, target_dir, gbnf, V)) goto done;
    CHECK(dr && smp && logits, "%s", g4_last_error());
    if (!dr || !smp) goto done;
    g4_session_reset(s);
    CHECK(g4_session_feed(s, prompt, n_prompt, logits, 0) == 0, "%s", g4_last_error());
    if (gbnf) constraint_mask(&cons, cons.start, -1, logits, V);
    g4_sampler_distribution(smp, logits, prompt, n_prompt, p0);
    for (int32_t t0 = 0; t0 < V; t0++) {
        if (p0[t0] == 0) continue;
        g4_session_truncate_seq(s, 0, n_prompt);
        CHECK(g4_session_feed(s, &t0, 1, logits, 0) == 0, "%s", g4_last_error());
        if (gbnf) constraint_mask(&cons, cons.start, t0, logits, V);
        g4_sampler_distribution(smp, logits, prompt, n_prompt, p1);
        for (int v = 0; v < V; v++) marg[v] += p0[t0] * p1[v];
        /* the drafter's own distribution of that token, for the control */
        g4_batch_row rows[64];
        g4_session_truncate_seq(s, 0, n_prompt - 1);
        rows[0] = (g4_batch_row){.seq = 0, .token = prompt[n_prompt - 1], .output = G4_OUTPUT_ARGMAX};
        CHECK(g4_decode(s, rows, 1) == 0 && g4_decode_hidden(s, 0, h) == 0, "%s", g4_last_error());
        int seq = 0;
        int32_t next;
        CHECK(g4_drafter_step(dr, 1, &seq, &t0, h, &next, logits) == 0, "%s", g4_last_error());
        g4_sampler_distribution(smp, logits, prompt, n_prompt, p1);
        for (int v = 0; v < V; v++) qd[v] += p0[t0] * p1[v];
    }
    static const int none[1] = {-1};
    /* the prompt but its last token is fed once; each draw feeds that token and generates after it */
    g4_session_reset(s);
    CHECK(g4_session_feed(s, prompt, n_prompt - 1, logits, 0) == 0, "%s", g4_last_error());
    for (int with = 0; with < 2; with++)
        for (int seed = 1; seed <= N; seed++) {
            /* a budget of 3: the prompt's row gives the first token, a round of one draft the second */
            g4_generate_params p = {.max_tokens = 3, .stop_ids = none, .n_stop_ids = 1, .sampling = sp, .draft = with ? dr : NULL,
                                    .draft_tokens = 3, .constraint = cons.start, .constraint_vocab = cons.vocab};
            p.sampling.seed = (uint64_t)seed;
            collected c = {0};
            g4_generate_result r;
            g4_session_truncate_seq(s, 0, n_prompt - 1);
            CHECK(g4_generate(s, prompt + n_prompt - 1, 1, &p, collect, &c, &r) == 0 && c.n == 3, "%s", g4_last_error());
            if (c.n == 3) (with ? cnt_spec : cnt_plain)[c.ids[1]] += 1.0 / N;
            if (gbnf && c.n == 3) { /* all three in the grammar: a fresh state takes them */
                g4_grammar_state *fresh = g4_grammar_start(cons.g);
                int ok = fresh != NULL;
                for (int i = 0; ok && i < 3; i++) ok = g4_grammar_accept_token(cons.vocab, fresh, c.ids[i]) == 0;
                bad += !ok;
                g4_grammar_state_free(fresh);
            }
        }
    long rounds, drafted, accepted;
    (void)rounds, (void)drafted, (void)accepted;
    double tv_spec = 0, tv_plain = 0, tv_draft = 0;
    for (int v = 0; v < V; v++) {
        tv_spec += fabs(cnt_spec[v] - marg[v]) / 2;
        tv_plain += fabs(cnt_plain[v] - marg[v]) / 2;
        tv_draft += fabs(qd[v] - marg[v]) / 2;
    }
    printf("speculative sampling on %s with %s (temperature %.1f, top-k 4%s%s): total variation from the exact marginal %.4f (plain sampling %.4f, "
           "the drafter's own distribution %.4f), %d draws each\n",
           target_dir, draft_dir, temp, gbnf ? ", under " : "", gbnf ? gbnf : "", tv_spec, tv_plain, tv_draft, N);
    CHECK(tv_spec <= 0.05, "%s: speculative sampling's second token is %.4f from the target's distribution", target_dir, tv_spec);
    CHECK(tv_plain <= 0.05, "%s: plain sampling's second token is %.4f from the exact marginal", target_dir, tv_plain);
    if (control) CHECK(tv_draft > 0.1, "%s: the drafter's distribution is only %.4f from the target's: the control cannot tell", target_dir, tv_draft);
    CHECK(bad == 0, "%s: %d of %d generations left the grammar", gbnf ? gbnf : "", bad, 2 * N);
done:
    constraint_close(&cons);
    free(p0), free(p1), free(marg), free(cnt_spec), free(cnt_plain), free(qd), free(logits), free(h);
    g4_sampler_free(smp);
    g4_drafter_free(dr);
    g4_session_free(s);
    g4_draft_free(d);
    g4_model_free(m);
}

/* ---- bad input ---- */

/* A copy of drafter folder src in dst: config.json with field `key` ("text_config.NAME" or a
 * top-level NAME) set to the JSON value `value` (and key2 to value2 unless NULL), model.safetensors
 * linked. */
static void patched_copy2(const char *src, const char *dst, const char *key, const char *value, const char *key2, const char *value2) {
    char cmd[8192], path[4096], cwd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && ln -s %s/%s/model.safetensors %s/model.safetensors", dst, dst,
             getcwd(cwd, sizeof cwd), src, dst);
    CHECK(sh(cmd) == 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/config.json", src);
    cJSON *cfg = read_json(path), *obj = cfg, *v = cJSON_Parse(value);
    const char *name = key;
    if (!strncmp(key, "text_config.", 12)) obj = cJSON_GetObjectItem(cfg, "text_config"), name = key + 12;
    CHECK(obj && v && cJSON_GetObjectItem(obj, name), "%s: no field %s", path, key);
    if (obj && v) cJSON_ReplaceItemInObject(obj, name, v);
    if (key2) {
        cJSON *v2 = cJSON_Parse(value2);
        CHECK(v2 && cJSON_GetObjectItem(cfg, key2), "%s: no field %s", path, key2);
        if (v2) cJSON_ReplaceItemInObject(cfg, key2, v2);
    }
    char *out = cJSON_Print(cfg);
    snprintf(path, sizeof path, "%s/config.json", dst);
    write_file_or_exit(path, out, strlen(out));
    free(out);
    cJSON_Delete(cfg);
}

static void expect_load_error(const g4_model *m, const char *dir, const char *needle) {
    g4_draft *d = g4_draft_load(dir, m);
    CHECK(!d && strstr(g4_last_error(), needle), "%s: expected an error naming \"%s\", got %s", dir, needle, d ? "a drafter" : g4_last_error());
    g4_draft_free(d);
}

static void test_bad_input(void) {
    g4_model *a = g4_model_load(tiny_dir()), *b = g4_model_load(TINY_B);
    CHECK(a && b, "%s", g4_last_error());
    if (!a || !b) {
        g4_model_free(a);
        g4_model_free(b);
        return;
    }
    g4_model *wrong = g4_model_load(ASSIST_A);
    CHECK(!wrong && strstr(g4_last_error(), "gemma4_assistant is a drafter") && strstr(g4_last_error(), "--draft"), "%s",
          wrong ? "loaded a drafter as a model" : g4_last_error());
    g4_model_free(wrong);
    expect_load_error(a, tiny_dir(), "not gemma4_assistant");
    expect_load_error(b, ASSIST_A, "backbone_hidden_size 64 does not match the target's hidden_size");
    expect_load_error(a, "/nonexistent-drafter", "/nonexistent-drafter");
    const char *tmp = "build/test_draft_tmp";
    /* drafter configs patched one field (or two) at a time, each refused naming what is wrong */
    static const struct {
        int b; /* the drafter for tiny-b (ASSIST_B), else for tiny-mobile */
        const char *key, *value, *key2, *value2, *needle;
    } patched[] = {
        {0, "text_config.vocab_size", "1024", NULL, NULL, "tensor model.embed_tokens.weight: expected BF16 [1024, 32], found BF16 [512, 32]"},
        {0, "text_config.head_dim", "8", NULL, NULL, "tensor model.layers.0.self_attn.q_proj.weight: expected BF16 [16, 32], found BF16 [32, 32]"},
        {0, "text_config.num_key_value_heads", "2", NULL, NULL,
         "layer 0 (sliding_attention) has head_dim 16 with 2 K/V heads; the target's layer 5 it reads has 16 with 1"},
        {0, "text_config.num_kv_shared_layers", "1", NULL, NULL, "num_kv_shared_layers must equal num_hidden_layers"},
        {0, "text_config.hidden_size_per_layer_input", "16", NULL, NULL, "hidden_size_per_layer_input must be 0"},
        {0, "num_centroids", "3", NULL, NULL, "centroid_intermediate_top_k 4 exceeds num_centroids 3"},
        {0, "num_centroids", "24", NULL, NULL, "vocab_size 512 is not a multiple of num_centroids 24"},
        {0, "centroid_intermediate_top_k", "40", NULL, NULL, "centroid_intermediate_top_k 40 exceeds num_centroids 16"},
        /* layer 0 as a full layer: its q_proj has the sliding head size */
        {0, "text_config.layer_types", "[\"full_attention\", \"full_attention\"]", NULL, NULL, "q_proj"},
        {1, "use_ordered_embeddings", "true", "num_centroids", "48", "masked_embedding.centroids.weight missing"},
    };
    for (size_t i = 0; i < sizeof patched / sizeof *patched; i++) {
        patched_copy2(patched[i].b ? ASSIST_B : ASSIST_A, tmp, patched[i].key, patched[i].value, patched[i].key2, patched[i].value2);
        expect_load_error(patched[i].b ? b : a, tmp, patched[i].needle);
    }
    /* a token_ordering entry outside the vocabulary */
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && cp %s/config.json %s/ && python3 -c \"import json,struct,sys;b=bytearray(open('%s/model.safetensors','rb').read());"
             "n=struct.unpack('<Q',b[:8])[0];h=json.loads(b[8:8+n]);o=8+n+h['masked_embedding.token_ordering']['data_offsets'][0]+8*5;"
             "b[o:o+8]=struct.pack('<q',512);open('%s/model.safetensors','wb').write(b)\"",
             tmp, tmp, ASSIST_A, tmp, ASSIST_A, tmp);
    CHECK(sh(cmd) == 0, "%s", cmd);
    expect_load_error(a, tmp, "token_ordering: element 5 is 512, outside the vocabulary");
    /* a drafter for one model, a session of another */
    g4_draft *d = g4_draft_load(ASSIST_A, a);
    g4_options o = opts_for("int", NULL);
    g4_session *sb = g4_session_new(b, &o), *sa = g4_session_new(a, &o);
    g4_drafter *dr = d && sb ? g4_drafter_new(d, sb) : NULL;
    CHECK(!dr && strstr(g4_last_error(), "not for the session's model"), "%s", dr ? "a drafter over another model's session" : g4_last_error());
    g4_drafter_free(dr);
    dr = d && sa ? g4_drafter_new(d, sa) : NULL;
    CHECK(dr != NULL, "%s", g4_last_error());
    if (dr) {
        int seq = 0;
        int32_t tok = 5, next;
        float h[64] = {0};
        CHECK(g4_drafter_step(dr, 1, &seq, &tok, h, &next, NULL) == -1 && strstr(g4_last_error(), "empty"), "an empty sequence: %s",
              g4_last_error());
        seq = 3;
        CHECK(g4_drafter_step(dr, 1, &seq, &tok, h, &next, NULL) == -1 && strstr(g4_last_error(), "sequence 3 does not exist"), "%s",
              g4_last_error());
        g4_stepper *st = g4_stepper_new(sa, 0);
        static const int32_t prompt[2] = {2, 9};
        g4_generate_params p = {.max_tokens = 4, .draft = dr, .draft_tokens = G4_MAX_DRAFT_TOKENS + 1};
        g4_sampling_default(&p.sampling);
        CHECK(st && g4_stepper_add(st, 0, prompt, 2, &p) == -1 && strstr(g4_last_error(), "draft_tokens 17"), "%s", g4_last_error());
        g4_stepper_free(st);
        /* a stepper over another session of the same model */
        g4_session *other = g4_session_new(a, &o);
        st = other ? g4_stepper_new(other, 0) : NULL;
        p.draft_tokens = 2;
        CHECK(st && g4_stepper_add(st, 0, prompt, 2, &p) == -1 && strstr(g4_last_error(), "another session"), "%s", g4_last_error());
        g4_stepper_free(st);
        g4_session_free(other);
    }
    g4_drafter_free(dr);
    g4_session_free(sa);
    g4_session_free(sb);
    g4_draft_free(d);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    sh(cmd);
    g4_model_free(a);
    g4_model_free(b);
}

/* The flags, as a user types them; and a drafter quantized by g4 quantize --q4_0 (Q4_0 linears,
 * Q8_0 tied embedding), which drafts nearly as well and changes no token. */
static void test_cli(void) {
    const char *bin = check_bin();
    if (!bin) return;
    const char *out = "build/test_draft.out", *err = "build/test_draft.err";
    char args[8192], *e, *o1, *o2;
    const char *qdir = "build/test_draft_q4_0";
    snprintf(args, sizeof args, "quantize --q4_0 %s %s", BUILTIN_DRAFT, qdir);
    CHECK(run_into(bin, args, out, err) == 0, "g4 %s", args);
    e = slurp(out);
    CHECK(strstr(e, "13 tensors quantized"), "g4 %s: %s", args, e);
    free(e);
    g4_model *m = g4_model_load(BUILTIN);
    g4_draft *d = m ? g4_draft_load(qdir, m) : NULL;
    CHECK(d != NULL, "%s: %s", qdir, g4_last_error());
    g4_draft_free(d);
    g4_model_free(m);
    if (d) {
        static const int32_t pq[] = {2, 106, 645, 108, 50, 41, 109, 46};
        test_invariant(BUILTIN, qdir, pq, 8, 40);
        test_acceptance(qdir);
    }
    snprintf(args, sizeof args, "rm -rf %s", qdir);
    sh(args);
    snprintf(args, sizeof args, "run -m %s --ids 2,100,200,300 -n 24", BUILTIN);
    CHECK(run_into(bin, args, out, err) == 0, "g4 %s", args);
    o1 = slurp(out);
    snprintf(args, sizeof args, "run -m %s --ids 2,100,200,300 -n 24 --draft %s --draft-tokens 5", BUILTIN, BUILTIN_DRAFT);
    int rc0 = run_into(bin, args, out, err);
    e = slurp(err);
    CHECK(rc0 == 0, "g4 %s: %s", args, e);
    free(e);
    o2 = slurp(out);
    CHECK(*o1 && !strcmp(o1, o2), "g4 run --draft printed other ids: \"%s\" vs \"%s\"", o2, o1);
    free(o1);
    free(o2);
    static const struct {
        const char *args, *needle;
    } bad[] = {
        {"run -m " BUILTIN " --ids 2,5 --draft-tokens 3", "--draft-tokens needs --draft DIR"},
        {"run -m " BUILTIN " --ids 2,5 --draft " BUILTIN_DRAFT " --draft-tokens 0", "--draft-tokens 0: expected an integer in [1, 16]"},
        {"run -m " BUILTIN " --ids 2,5 --draft /nonexistent-drafter", "/nonexistent-drafter"},
        {"run -m " BUILTIN " --ids 2,5 --draft " BUILTIN, "not gemma4_assistant"},
        {"run -m " BUILTIN_DRAFT " --ids 2,5", "gemma4_assistant is a drafter"},
        {"bench -m " BUILTIN " --draft " BUILTIN_DRAFT " --kernels portable", "--draft compares decoding with and without"},
        {"eval gsm8k -m " BUILTIN " --data x.jsonl --out y.jsonl --draft-tokens 99", "--draft-tokens 99"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run_into(bin, bad[i].args, out, err);
        e = slurp(err);
        CHECK(rc != 0 && rc != 128 && strstr(e, bad[i].needle) && !strchr(strchr(e, '\n') ? strchr(e, '\n') + 1 : "", '\n'),
              "g4 %s: exit %d, stderr \"%s\" (expected one line naming \"%s\")", bad[i].args, rc, e, bad[i].needle);
        free(e);
    }
}

int main(void) {
    if (!check_dispatch_level() || !test_parts_known("goldens,invariant,batched,acceptance,spec_random,spec_trained,constrained,bad_input,cli"))
        return check_report("draft");
    if (test_part("goldens")) {
        test_goldens(tiny_dir(), ASSIST_A);
        test_goldens(TINY_B, ASSIST_B);
    }
    static const int32_t pa[] = {2, 253, 44, 227, 297, 4, 20, 488, 428, 510, 227, 59};
    static const int32_t pb[] = {2, 17, 99, 201, 5, 300, 42};
    static const int32_t pc[] = {2, 106, 645, 108, 50, 41, 109, 46};
    if (test_part("invariant")) {
        test_invariant(tiny_dir(), ASSIST_A, pa, 12, 40);
        test_invariant(TINY_B, ASSIST_B, pb, 7, 40);
        test_invariant(BUILTIN, BUILTIN_DRAFT, pc, 8, 60);
    }
    if (test_part("batched")) {
        test_batched(tiny_dir(), ASSIST_A);
        test_batched(BUILTIN, BUILTIN_DRAFT);
    }
    if (test_part("acceptance")) test_acceptance(BUILTIN_DRAFT);
    /* a random drafter (nearly every draft rejected: the residual max(0, p - q) decides) and the
     * trained one (most accepted) */
    if (test_part("spec_random")) test_spec_sampling(tiny_dir(), ASSIST_A, pa, 12, 1.0f, 1, NULL);
    if (test_part("spec_trained")) {
        int n_ex;
        int32_t *ex = builtin_prompt(&n_ex);
        if (ex) test_spec_sampling(BUILTIN, BUILTIN_DRAFT, ex, n_ex, 4.0f, 0, NULL); /* hot enough that its top 4 all count */
        free(ex);
    }
    if (test_part("constrained")) {
        test_constrained_greedy();
        /* the reply's first tokens are digits: a grammar without 1 and 4 in the first two takes some
         * of the target's and the drafter's top 4 away; no digit after them (a round's last token
         * must come from the state its draft left) */
        int n_ex;
        int32_t *ex = builtin_prompt(&n_ex);
        if (ex) test_spec_sampling(BUILTIN, BUILTIN_DRAFT, ex, n_ex, 4.0f, 0, "root ::= [^14] [^14] [^0-9]*");
        free(ex);
    }
    if (test_part("bad_input")) test_bad_input();
    if (test_part("cli")) test_cli();
    return check_report("draft");
}
