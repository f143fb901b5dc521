/* Embedding rows in g4_decode (g4_batch_row.embd; issue 34 item 4, the door for issue 35's soft
 * tokens):
 *  - an embedding row holding the pad token's own scaled embedding is the pad token's row, bit for
 *    bit (its per-layer input is the pad id's either way), and the `token` field of an embedding
 *    row is ignored; an embedding row holding another token's own embedding is NOT that token's row
 *    (its per-layer input is the pad id's, as transformers' at soft-token positions);
 *  - mixed token / embedding batches: every row gets what it gets alone, bit for bit;
 *  - a NaN or infinity in an embedding is refused, naming the row, and nothing is fed;
 *  - the soft-token splice equals transformers (tests/fixtures/splice, gen_splice.py: an image
 *    between two text spans, two images, image + audio, a second turn after an image): prompt and
 *    teacher-forced step logits within the bands below, every greedy id the golden's.
 * Every activation mode; the Makefile runs it under every kernel level too (dispatch-test). */
#include "model/session.h"
#include "testutil.h"

#define SPLICE_DIR "tests/fixtures/splice"

static int V, H;

static uint32_t next_rand(uint32_t *r) {
    *r = *r * 1103515245u + 12345u;
    return *r >> 8;
}

/* A session in activation mode act; the int8 KV cache and the PLE-projection quantization off, as
 * in transformers' own fake-quant forward (the golden's mode fakequant-hf; test_fixture's modes). */
static g4_session *session(const g4_model *m, int act, int n_seq) {
    g4_options o;
    g4_options_default(&o);
    o.act = (g4_act_mode)act;
    o.kv_quant = 0;
    o.pmp_quant = 0;
    o.ctx = 96;
    o.n_seq = n_seq;
    g4_session *s = g4_session_new(m, &o);
    CHECK(s != NULL, "%s", g4_last_error());
    return s;
}

static const char *act_name(int act) { return act == G4_ACT_FLOAT ? "float" : act == G4_ACT_FAKE ? "fake" : "int"; }

/* Feeds ids (as token rows, except row `at`, an embedding row with embd and token `tok_at`), every
 * row asking for its logits, into logits (n x V). */
static void feed(g4_session *s, const int32_t *ids, int n, int at, const float *embd, int32_t tok_at, float *logits) {
    g4_batch_row rows[32];
    for (int i = 0; i < n; i++) {
        rows[i] = (g4_batch_row){.seq = 0, .token = ids[i], .output = G4_OUTPUT_LOGITS, .logits = logits + (size_t)i * V};
        if (i == at) rows[i].embd = embd, rows[i].token = tok_at;
    }
    CHECK(g4_decode(s, rows, n) == 0, "%s", g4_last_error());
}

/* The pad token's own embedding as an embedding row gives the pad token's row, bit for bit, and every
 * row after it too; another token's own embedding does not give that token's row. */
static void check_token_equivalence(const g4_model *m, int act) {
    enum { N = 12, AT = 5 };
    int32_t ids[N];
    uint32_t r = 7;
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(3 + next_rand(&r) % (uint32_t)(V - 3));
    int pad = 0, other = ids[AT];
    float *want = malloc(sizeof *want * N * (size_t)V), *got = malloc(sizeof *got * N * (size_t)V), *e = malloc(sizeof *e * (size_t)H);
    g4_session *s = session(m, act, 1);
    /* the pad token's scaled embedding, as the token path computes it */
    g4_forward_embedding(s, pad, e);
    ids[AT] = pad;
    feed(s, ids, N, -1, NULL, 0, want);
    g4_session_reset_seq(s, 0);
    feed(s, ids, N, AT, e, other /* ignored */, got);
    CHECK(memcmp(want, got, sizeof *got * N * (size_t)V) == 0, "%s: the pad embedding as an embedding row differs from the pad token's row",
          act_name(act));
    /* another token's own embedding: the main embedding equal, the per-layer input the pad id's */
    ids[AT] = other;
    g4_forward_embedding(s, other, e);
    g4_session_reset_seq(s, 0);
    feed(s, ids, N, -1, NULL, 0, want);
    g4_session_reset_seq(s, 0);
    feed(s, ids, N, AT, e, other, got);
    size_t row = sizeof *got * (size_t)V;
    CHECK(memcmp(want, got, row * AT) == 0, "%s: rows before the embedding row changed", act_name(act));
    CHECK(memcmp(want + (size_t)AT * V, got + (size_t)AT * V, row) != 0,
          "%s: token %d's own embedding as an embedding row gave the token's row: its per-layer input is not the pad id's", act_name(act),
          other);
    printf("ok %s: pad embedding row == pad token row bit for bit (%d rows); token %d's embedding row differs from its token row (pad PLE)\n",
           act_name(act), N, other);
    g4_session_free(s);
    free(want), free(got), free(e);
}

/* Mixed token / embedding rows of three sequences: each alone, one row per call, and all of them in
 * one call, interleaved; every row's logits equal bit for bit. */
static void check_batch_invariance(const g4_model *m, int act) {
    enum { NS = 3, NR = 14 };
    static const int slot[NS] = {2, 0, 1};
    float *embd = malloc(sizeof *embd * NS * NR * (size_t)H);
    int32_t tok[NS][NR];
    int is_embd[NS][NR];
    uint32_t r = 11;
    for (int q = 0; q < NS; q++)
        for (int i = 0; i < NR; i++) {
            tok[q][i] = (int32_t)(next_rand(&r) % (uint32_t)V);
            is_embd[q][i] = (i + q) % 3 != 0;
            float *e = embd + ((size_t)q * NR + i) * H;
            for (int c = 0; c < H; c++) e[c] = ((float)(next_rand(&r) % 2001) - 1000.0f) / 250.0f;
        }
    size_t all = (size_t)NS * NR * V;
    float *alone = malloc(sizeof *alone * all), *batched = malloc(sizeof *batched * all);
    for (int q = 0; q < NS; q++) {
        g4_session *s = session(m, act, 1);
        for (int i = 0; i < NR; i++) {
            g4_batch_row row = {.seq = 0, .token = tok[q][i], .output = G4_OUTPUT_LOGITS, .logits = alone + ((size_t)q * NR + i) * V};
            if (is_embd[q][i]) row.embd = embd + ((size_t)q * NR + i) * H;
            CHECK(g4_decode(s, &row, 1) == 0, "%s", g4_last_error());
        }
        g4_session_free(s);
    }
    g4_session *s = session(m, act, NS);
    g4_batch_row rows[NS * NR];
    int n = 0;
    for (int i = 0; i < NR; i++)
        for (int q = 0; q < NS; q++) {
            rows[n] = (g4_batch_row){.seq = slot[q], .token = tok[q][i], .output = G4_OUTPUT_LOGITS,
                                     .logits = batched + ((size_t)q * NR + i) * V};
            if (is_embd[q][i]) rows[n].embd = embd + ((size_t)q * NR + i) * H;
            n++;
        }
    CHECK(g4_decode(s, rows, n) == 0, "%s", g4_last_error());
    CHECK(memcmp(alone, batched, sizeof *alone * all) == 0, "%s: mixed token/embedding rows differ batched and alone", act_name(act));
    printf("ok %s: %d mixed token/embedding rows of %d sequences, one call == one row per call, bit for bit\n", act_name(act), n, NS);
    g4_session_free(s);
    free(embd), free(alone), free(batched);
}

/* A NaN or an infinity in an embedding row: refused, naming the row, nothing fed. */
static void check_refusals(const g4_model *m) {
    g4_session *s = session(m, G4_ACT_FAKE, 1);
    float *e = calloc((size_t)H, sizeof *e);
    g4_batch_row rows[2] = {{.seq = 0, .token = 5}, {.seq = 0, .token = 6, .embd = e}};
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        e[H - 1 - k] = bad[k];
        CHECK(g4_decode(s, rows, 2) != 0 && strstr(g4_last_error(), "batch row 1") && strstr(g4_last_error(), "not finite"),
              "a non-finite embedding value: %s", g4_decode(s, rows, 2) ? g4_last_error() : "accepted");
        CHECK(g4_session_seq_pos(s, 0) == 0, "a refused batch fed rows");
        e[H - 1 - k] = 0;
    }
    printf("ok refusals: NaN / +inf / -inf in an embedding row: \"%s\", nothing fed\n", g4_last_error());
    CHECK(g4_decode(s, rows, 2) == 0 && g4_session_seq_pos(s, 0) == 2, "a finite embedding row: %s", g4_last_error());
    free(e);
    g4_session_free(s);
}

/* ---- the splice against transformers ---- */

/* The bands, per mode, 2-3x the largest difference measured (the test prints them): float 2.9e-5,
 * fake-quant and int 1.0e-5 (their every int8 code equals transformers': the goldens' prompts were
 * chosen so that no code lies within float rounding of a boundary, gen_splice.py); int mode is
 * compared with the fake-quant golden, as in test_fixture. */
static double splice_band(int act) { return act == G4_ACT_FLOAT ? 6e-5 : 3e-5; }

static const int32_t *golden_i32(const g4_safetensors *st, const char *name, int64_t *n) {
    const g4_tensor *t = g4_st_find(st, name);
    if (!t || t->dtype != G4_DT_I32 || ((uintptr_t)t->data & 3)) {
        fprintf(stderr, "golden tensor %s missing or not aligned I32\n", name);
        exit(2);
    }
    *n = t->numel;
    return (const int32_t *)(const void *)t->data;
}

typedef struct {
    double worst;     /* the largest |g4 - transformers| over every compared logit */
    int ids, ids_ok;  /* greedy ids compared, equal */
} splice_stats;

/* Feeds n prompt rows (ids; -1: the next image soft token, -2: the next audio one), the last asking
 * for its logits, compares them with want[0]; then the golden's greedy ids one by one (teacher forced),
 * each step's logits with want[1 + i] and each argmax with the golden id. */
static void splice_turn(g4_session *s, const int32_t *ids, int n, const float **img, const float **aud, const float *want,
                        const int32_t *gen, int n_gen, float *logits, splice_stats *st, const char *what) {
    g4_batch_row rows[64];
    CHECK(n <= 64, "%s: %d prompt rows", what, n);
    for (int i = 0; i < n && i < 64; i++) {
        rows[i] = (g4_batch_row){.seq = 0, .token = ids[i]};
        if (ids[i] == -1) rows[i].embd = *img, *img += H;
        if (ids[i] == -2) rows[i].embd = *aud, *aud += H;
    }
    rows[n - 1].output = G4_OUTPUT_LOGITS, rows[n - 1].logits = logits;
    CHECK(g4_decode(s, rows, n) == 0, "%s: %s", what, g4_last_error());
    for (int i = 0; i <= n_gen; i++) {
        double d = max_abs_diff(logits, want + (size_t)i * V, V);
        if (d > st->worst) st->worst = d;
        if (i == n_gen) break;
        st->ids++;
        st->ids_ok += g4_argmax(logits, V) == gen[i];
        g4_batch_row row = {.seq = 0, .token = gen[i], .output = G4_OUTPUT_LOGITS, .logits = logits};
        CHECK(g4_decode(s, &row, 1) == 0, "%s: %s", what, g4_last_error());
    }
}

static void check_splice(const g4_model *m, int act) {
    g4_safetensors gs;
    if (g4_st_open_file(&gs, SPLICE_DIR "/splice.safetensors") != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    cJSON *meta = read_json(SPLICE_DIR "/splice.json");
    const char *mode = act == G4_ACT_FLOAT ? "float" : "fakequant-hf";
    float *logits = malloc(sizeof *logits * (size_t)V);
    const cJSON *cases = cJSON_GetObjectItem(meta, "cases");
    CHECK(cJSON_GetObjectItem(meta, "hidden")->valueint == H, "splice goldens for hidden size %d, the model has %d",
          cJSON_GetObjectItem(meta, "hidden")->valueint, H);
    for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next) {
        char name[128];
        int64_t n, n_gen, ni, na;
        splice_stats st = {0};
#define T(field) (snprintf(name, sizeof name, "%s.%s", c->string, field), name)
#define TM(field) (snprintf(name, sizeof name, "%s.%s.%s", c->string, mode, field), name)
        const int32_t *ids = golden_i32(&gs, T("ids"), &n);
        const float *img = golden_f32(&gs, T("image"), &ni), *aud = golden_f32(&gs, T("audio"), &na);
        const float *want = golden_f32(&gs, TM("logits"), NULL);
        const int32_t *gen = golden_i32(&gs, TM("gen"), &n_gen);
        g4_session *s = session(m, act, 1);
        splice_turn(s, ids, (int)n, &img, &aud, want, gen, (int)n_gen, logits, &st, c->string);
        if (cJSON_IsTrue(cJSON_GetObjectItem(c, "turn2"))) {
            int64_t n2;
            const int32_t *turn2 = golden_i32(&gs, T("turn2"), &n2);
            const float *want2 = golden_f32(&gs, TM("logits2"), NULL);
            const int32_t *gen2 = golden_i32(&gs, TM("gen2"), &n_gen);
            splice_turn(s, turn2, (int)n2, &img, &aud, want2, gen2, (int)n_gen, logits, &st, c->string);
        }
#undef T
#undef TM
        CHECK(img == golden_f32(&gs, (snprintf(name, sizeof name, "%s.image", c->string), name), NULL) + ni &&
                  aud == golden_f32(&gs, (snprintf(name, sizeof name, "%s.audio", c->string), name), NULL) + na,
              "%s: not every soft token was fed", c->string);
        double band = splice_band(act);
        CHECK(st.worst <= band && st.ids_ok == st.ids, "%s %s: logits max|diff| %.3g (band %.3g), greedy ids %d/%d the golden's", act_name(act),
              c->string, st.worst, band, st.ids_ok, st.ids);
        printf("ok %s splice %-12s vs transformers %s: logits max|diff| %.3g (band %.3g), greedy ids %d/%d\n", act_name(act), c->string, mode,
               st.worst, band, st.ids_ok, st.ids);
        g4_session_free(s);
    }
    free(logits);
    cJSON_Delete(meta);
    g4_st_close(&gs);
}

/* The stepper feeds a prompt of tokens and embedding spans (g4_stepper_add_embd) as the rows
 * above: each splice case's greedy ids, the golden's, for two sequences at once (the second a fork
 * of the first: the same embeddings fed), in prompt chunks of 5 (spans cut across chunks). */
static void check_stepper(const g4_model *m, int act) {
    g4_safetensors gs;
    if (g4_st_open_file(&gs, SPLICE_DIR "/splice.safetensors") != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    cJSON *meta = read_json(SPLICE_DIR "/splice.json");
    const char *mode = act == G4_ACT_FLOAT ? "float" : "fakequant-hf";
    for (const cJSON *c = cJSON_GetObjectItem(meta, "cases")->child; c; c = c->next) {
        char name[128];
        int64_t n, n_gen, ni, na;
        const int32_t *ids = golden_i32(&gs, (snprintf(name, sizeof name, "%s.ids", c->string), name), &n);
        const float *img = golden_f32(&gs, (snprintf(name, sizeof name, "%s.image", c->string), name), &ni);
        const float *aud = golden_f32(&gs, (snprintf(name, sizeof name, "%s.audio", c->string), name), &na);
        const int32_t *gen = golden_i32(&gs, (snprintf(name, sizeof name, "%s.%s.gen", c->string, mode), name), &n_gen);
        /* the prompt: placeholders (an in-vocabulary id) where the soft tokens go, one span per run */
        int32_t prompt[64];
        g4_embd_span spans[8];
        int n_spans = 0;
        for (int i = 0; i < n && i < 64; i++) {
            prompt[i] = ids[i] < 0 ? 7 : ids[i];
            if (ids[i] >= 0) continue;
            if (i > 0 && ids[i - 1] == ids[i]) {
                spans[n_spans - 1].n++;
                continue;
            }
            spans[n_spans++] = (g4_embd_span){.at = i, .n = 1, .embd = ids[i] == -1 ? img : aud};
            CHECK(n_spans < 8, "%s: too many spans", c->string);
        }
        for (int k = 0, seen_img = 0, seen_aud = 0; k < n_spans; k++) { /* each span's rows, in order */
            int *seen = spans[k].embd == img ? &seen_img : &seen_aud;
            spans[k].embd += (size_t)*seen * H;
            *seen += spans[k].n;
        }
        g4_session *s = session(m, act, 2);
        g4_stepper *st = g4_stepper_new(s, 5);
        g4_generate_params p = {0};
        g4_sampling_default(&p.sampling);
        p.max_tokens = (int)n_gen;
        static const int no_stops[1];
        p.stop_ids = no_stops, p.n_stop_ids = 0; /* no stop id: the budget ends it */
        CHECK(g4_stepper_add_embd(st, 0, prompt, (int)n, spans, n_spans, &p) == 0 && g4_stepper_add_fork(st, 1, 0, &p) == 0, "%s",
              g4_last_error());
        g4_step_token out[64];
        for (int guard = 0; g4_stepper_active(st) > 0 && guard < 200; guard++) CHECK(g4_stepper_step(st, out) >= 0, "%s", g4_last_error());
        for (int q = 0; q < 2; q++) {
            int got_n;
            const int32_t *got = g4_stepper_tokens(st, q, &got_n);
            CHECK(got_n == n_gen && memcmp(got, gen, sizeof *gen * (size_t)n_gen) == 0, "%s %s: stepper sequence %d's greedy ids differ from the golden's",
                  act_name(act), c->string, q);
        }
        printf("ok %s stepper %-12s %d embedding spans, prompt chunks of 5, and a fork: greedy ids the golden's (%d)\n", act_name(act),
               c->string, n_spans, (int)n_gen);
        g4_stepper_free(st);
        g4_session_free(s);
        (void)ni, (void)na;
    }
    cJSON_Delete(meta);
    g4_st_close(&gs);
}

/* g4_stepper_add_embd refuses, feeding nothing, a span that is empty, outside the prompt,
 * overlapping another or not finite. */
static void check_stepper_refusals(const g4_model *m) {
    g4_session *s = session(m, G4_ACT_FAKE, 1);
    g4_stepper *st = g4_stepper_new(s, 0);
    float *e = calloc((size_t)H * 4, sizeof *e);
    int32_t prompt[6] = {2, 5, 6, 7, 8, 9};
    g4_generate_params p = {0};
    g4_sampling_default(&p.sampling);
    p.max_tokens = 1;
    struct {
        g4_embd_span spans[2];
        int n;
        const char *says;
    } bad[] = {
        {{{.at = 1, .n = 0, .embd = e}}, 1, "empty or outside"},
        {{{.at = 4, .n = 3, .embd = e}}, 1, "empty or outside"},
        {{{.at = -1, .n = 2, .embd = e}}, 1, "empty or outside"},
        {{{.at = 1, .n = 1, .embd = NULL}}, 1, "empty or outside"},
        {{{.at = 1, .n = 3, .embd = e}, {.at = 3, .n = 1, .embd = e}}, 2, "overlaps"},
        {{{.at = 2, .n = 2, .embd = e + 2 * H}}, 1, "not finite"},
    };
    e[3 * H + 3] = NAN; /* in the last span's second row only */
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int rc = g4_stepper_add_embd(st, 0, prompt, 6, bad[k].spans, bad[k].n, &p);
        CHECK(rc != 0 && strstr(g4_last_error(), bad[k].says) && g4_stepper_state(st, 0) == G4_SEQ_IDLE && g4_session_seq_pos(s, 0) == 0,
              "bad span %zu: %s", k, rc ? g4_last_error() : "accepted");
    }
    printf("ok stepper refusals: %zu bad spans refused before anything is fed (\"%s\")\n", sizeof bad / sizeof bad[0], g4_last_error());
    free(e);
    g4_stepper_free(st);
    g4_session_free(s);
}

int main(void) {
    if (!check_dispatch_level()) return check_report("embed");
    g4_model *m = g4_model_load(tiny_dir());
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return check_report("embed");
    V = g4_model_vocab_size(m);
    H = g4_model_hidden_size(m);
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) {
        check_token_equivalence(m, act);
        check_batch_invariance(m, act);
        check_splice(m, act);
        check_stepper(m, act);
    }
    check_refusals(m);
    check_stepper_refusals(m);
    g4_model_free(m);
    return check_report("embed");
}
