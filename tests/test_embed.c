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
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
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

/* Causal attention over soft tokens, as transformers' for E2B/E4B (its check, recorded by
 * gen_splice.py with mm_token_type_ids given: no bidirectional image block): changing the last soft
 * token of "between" leaves every earlier row's logits as they were, bit for bit, and moves its own. */
static void check_causal(const g4_model *m) {
    g4_safetensors gs;
    if (g4_st_open_file(&gs, SPLICE_DIR "/splice.safetensors") != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    cJSON *meta = read_json(SPLICE_DIR "/splice.json");
    const cJSON *cc = cJSON_GetObjectItem(meta, "causal_check");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cc, "rows_before_last_soft_token_unchanged")) &&
              cJSON_IsTrue(cJSON_GetObjectItem(cc, "last_soft_token_row_changed")) && cJSON_IsNull(cJSON_GetObjectItem(cc, "use_bidirectional_attention")),
          "splice.json: transformers' causal check did not hold");
    int64_t n, ni;
    const int32_t *ids = golden_i32(&gs, "between.ids", &n);
    const float *img = golden_f32(&gs, "between.image", &ni);
    float *img2 = malloc(sizeof *img2 * (size_t)ni), *a = malloc(sizeof *a * (size_t)n * V), *b = malloc(sizeof *b * (size_t)n * V);
    memcpy(img2, img, sizeof *img2 * (size_t)ni);
    for (int c = 0; c < H; c++) img2[ni - H + c] += 1.0f; /* the last soft token, as gen_splice.py changes it */
    int last = -1;
    for (int pass = 0; pass < 2; pass++) {
        g4_session *s = session(m, G4_ACT_FLOAT, 1);
        g4_batch_row rows[64];
        const float *src = pass ? img2 : img;
        for (int i = 0; i < n; i++) {
            rows[i] = (g4_batch_row){.seq = 0, .token = ids[i], .output = G4_OUTPUT_LOGITS, .logits = (pass ? b : a) + (size_t)i * V};
            if (ids[i] == -1) rows[i].embd = src, src += H, last = i;
        }
        CHECK(g4_decode(s, rows, (int)n) == 0, "%s", g4_last_error());
        g4_session_free(s);
    }
    CHECK(last > 0 && memcmp(a, b, sizeof *a * (size_t)last * V) == 0 && memcmp(a + (size_t)last * V, b + (size_t)last * V, sizeof *a * V) != 0,
          "changing the last soft token (row %d) moved an earlier row, or not its own", last);
    printf("ok causal: changing the last soft token (row %d) leaves rows 0..%d bit for bit, as transformers (use_bidirectional_attention null)\n",
           last, last - 1);
    free(img2), free(a), free(b);
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

/* A prompt that ends with an embedding row (its last row the one a fork feeds itself): the stepper's
 * first greedy token, for the sequence and a fork of it, is g4_decode's argmax of those rows fed
 * directly. */
static void check_stepper_ends_in_embedding(const g4_model *m) {
    enum { N = 9 };
    float *e = malloc(sizeof *e * 3 * (size_t)H);
    uint32_t r = 21;
    for (int i = 0; i < 3 * H; i++) e[i] = ((float)(next_rand(&r) % 2001) - 1000.0f) / 250.0f;
    int32_t prompt[N] = {2, 40, 41, 42, 43, 44, 7, 7, 7};
    g4_session *s = session(m, G4_ACT_FAKE, 2);
    g4_batch_row rows[N];
    for (int i = 0; i < N; i++) rows[i] = (g4_batch_row){.seq = 0, .token = prompt[i], .embd = i >= 6 ? e + (size_t)(i - 6) * H : NULL};
    rows[N - 1].output = G4_OUTPUT_ARGMAX;
    CHECK(g4_decode(s, rows, N) == 0, "%s", g4_last_error());
    int32_t want = rows[N - 1].argmax;
    g4_session_reset_seq(s, 0);
    g4_stepper *st = g4_stepper_new(s, 4);
    g4_generate_params p = {0};
    g4_sampling_default(&p.sampling);
    p.max_tokens = 1;
    g4_embd_span span = {.at = 6, .n = 3, .embd = e};
    CHECK(g4_stepper_add_embd(st, 0, prompt, N, &span, 1, &p) == 0 && g4_stepper_add_fork(st, 1, 0, &p) == 0, "%s", g4_last_error());
    g4_step_token out[16];
    while (g4_stepper_active(st) > 0) CHECK(g4_stepper_step(st, out) >= 0, "%s", g4_last_error());
    for (int q = 0; q < 2; q++) {
        int n;
        const int32_t *got = g4_stepper_tokens(st, q, &n);
        CHECK(n == 1 && got[0] == want, "sequence %d's first token after a prompt ending in an embedding row: %d, g4_decode's %d", q, n ? got[0] : -1,
              want);
    }
    printf("ok stepper: a prompt ending in an embedding row, and its fork (which feeds that row itself): first token %d, g4_decode's\n", want);
    g4_stepper_free(st);
    g4_session_free(s);
    free(e);
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

/* ---- media parts in a conversation (the chat template's markers, soft tokens at the placeholders) ---- */

#define MATH_MODEL "models/gemma4-tiny-math"

/* The built-in model's tokenizer with the six Gemma 4 media markers added as special tokens at ids
 * 757..762 (its vocabulary has 757 pieces, the model 768 rows): <|image> <|image|> <image|> <|audio>
 * <|audio|> <audio|>. Written to dir/tokenizer.json. */
static g4_tokenizer *media_tokenizer(const char *dir) {
    static const char *const markers[6] = {"<|image>", "<|image|>", "<image|>", "<|audio>", "<|audio|>", "<audio|>"};
    cJSON *t = read_json(MATH_MODEL "/tokenizer.json");
    cJSON *added = cJSON_GetObjectItem(t, "added_tokens"), *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(t, "model"), "vocab");
    for (int k = 0; k < 6; k++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", 757 + k);
        cJSON_AddStringToObject(a, "content", markers[k]);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
        cJSON_AddNumberToObject(vocab, markers[k], 757 + k);
    }
    char *text = cJSON_PrintUnformatted(t), path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file_or_exit(path, text, strlen(text));
    free(text);
    cJSON_Delete(t);
    g4_tokenizer *tok = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
    CHECK(tok != NULL, "%s", g4_last_error());
    return tok;
}

/* Greedy tokens of a fresh session over prompt with spans (budget max_tokens, the model's stops). */
static int fresh_reply(const g4_model *m, const int32_t *prompt, int n, const g4_embd_span *spans, int n_spans, int max_tokens, int32_t *out) {
    g4_options o;
    g4_options_default(&o);
    o.ctx = 256;
    g4_session *s = g4_session_new(m, &o);
    g4_generate_params p = {0};
    g4_sampling_default(&p.sampling);
    p.max_tokens = max_tokens;
    g4_stepper *st = g4_stepper_new(s, 0);
    CHECK(g4_stepper_add_embd(st, 0, prompt, n, spans, n_spans, &p) == 0, "%s", g4_last_error());
    g4_step_token ev[8];
    while (g4_stepper_active(st) > 0) CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
    int got;
    const int32_t *ids = g4_stepper_tokens(st, 0, &got);
    memcpy(out, ids, sizeof *out * (size_t)got);
    g4_stepper_free(st);
    g4_session_free(s);
    return got;
}

static void fill(float *v, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) v[i] = ((float)(next_rand(&seed) % 2001) - 1000.0f) / 50.0f;
}

/* A conversation with an image and an audio clip in its first user message and another image in
 * its second: each prompt is the template's (the parts before the text, each expanded into its
 * markers), the spans sit at the placeholders, and each reply is what a fresh session fed the whole
 * history with the same soft tokens generates. */
static void check_conversation(const char *dir) {
    g4_model *m = g4_model_load(MATH_MODEL);
    g4_tokenizer *tok = media_tokenizer(dir);
    if (!m || !tok) return;
    int Hm = g4_model_hidden_size(m);
    float *x = malloc(sizeof *x * 4 * (size_t)Hm), *y = malloc(sizeof *y * 3 * (size_t)Hm), *z = malloc(sizeof *z * 2 * (size_t)Hm);
    fill(x, 4 * (size_t)Hm, 1), fill(y, 3 * (size_t)Hm, 2), fill(z, 2 * (size_t)Hm, 3);
    int32_t mk[3];
    CHECK(g4_media_marker_ids(tok, G4_MEDIA_AUDIO, mk) == 0 && mk[0] == 760 && mk[1] == 761 && mk[2] == 762, "audio markers %d %d %d", mk[0], mk[1],
          mk[2]);
    g4_tokenizer *plain = g4_tokenizer_load_ex(MATH_MODEL "/tokenizer.json", G4_TOKENIZER_NO_CACHE);
    CHECK(g4_media_marker_ids(plain, G4_MEDIA_IMAGE, mk) != 0 && strstr(g4_last_error(), "<|image>"), "a tokenizer without markers: %s",
          g4_last_error());
    g4_tokenizer_free(plain);

    g4_options so;
    g4_options_default(&so);
    so.ctx = 256;
    g4_session *s = g4_session_new(m, &so);
    g4_conversation_options co;
    CHECK(g4_conversation_default_options(s, &co) == 0, "%s", g4_last_error());
    g4_sampling_default(&co.gen.sampling);
    co.gen.max_tokens = 6;
    g4_conversation *c = g4_conversation_new(s, tok, &co);
    CHECK(c != NULL, "%s", g4_last_error());
    if (!c) return;
    CHECK(g4_conversation_add_media(c, G4_MEDIA_IMAGE, x, 4) == 0 && g4_conversation_add_media(c, G4_MEDIA_AUDIO, y, 3) == 0, "%s", g4_last_error());
    CHECK(g4_conversation_add(c, G4_CHAT_MODEL, "no") != 0 && strstr(g4_last_error(), "wait for a user message"), "media before a model message: %s",
          g4_last_error());
    CHECK(g4_conversation_add(c, G4_CHAT_USER, "  What is 2+3?\n") == 0, "%s", g4_last_error());
    /* the template's text, the processor's expansion: parts first, then the trimmed text */
    static const char want1[] = "<bos><|turn>user\n<|image><|image|><|image|><|image|><|image|><image|><|audio><|audio|><|audio|><|audio|><audio|>"
                                "What is 2+3?<turn|>\n<|turn>model\n";
    int32_t *want;
    size_t n_want;
    CHECK(g4_tokenizer_encode(tok, want1, strlen(want1), 1, &want, &n_want) == 0, "%s", g4_last_error());
    const int32_t *ids;
    size_t n;
    const g4_embd_span *sp;
    int n_sp;
    CHECK(g4_conversation_prompt(c, &ids, &n) == 0 && g4_conversation_prompt_spans(c, &sp, &n_sp) == 0, "%s", g4_last_error());
    CHECK(n == n_want && memcmp(ids, want, sizeof *ids * n) == 0, "the first prompt is not the template's with the parts expanded (%zu ids, want %zu)",
          n, n_want);
    int img_at = 0;
    while (img_at < (int)n && ids[img_at] != 758) img_at++;
    CHECK(n_sp == 2 && sp[0].at == img_at && sp[0].n == 4 && sp[1].at == img_at + 6 && sp[1].n == 3 && ids[sp[1].at] == 761,
          "spans: %d, at %d (+%d) and %d (+%d)", n_sp, n_sp > 0 ? sp[0].at : -1, n_sp > 0 ? sp[0].n : 0, n_sp > 1 ? sp[1].at : -1,
          n_sp > 1 ? sp[1].n : 0);
    if (n != n_want || n_sp != 2) { /* what follows reads both spans and copies the prompt: stop here */
        free(want);
        goto done;
    }
    /* the same ids from the chat encoder alone (g4_chat_encode_media, what g4 serve encodes a request with) */
    const g4_chat_message um = {G4_CHAT_USER, "  What is 2+3?\n"};
    const g4_chat_media parts[2] = {{0, G4_MEDIA_IMAGE, 4}, {0, G4_MEDIA_AUDIO, 3}};
    g4_chat_options copt = g4_chat_default_options();
    int32_t *direct = NULL;
    size_t n_direct = 0;
    int opens = -1;
    CHECK(g4_chat_encode_media(tok, &um, 1, 0, &copt, parts, 2, &direct, &n_direct, &opens) == 0 && n_direct == n_want &&
              memcmp(direct, want, sizeof *want * n_want) == 0 && opens == 0,
          "g4_chat_encode_media: %zu ids (want %zu), opens_thought %d: %s", n_direct, n_want, opens, g4_last_error());
    free(direct);
    free(want);
    /* reply 1 equals a fresh session's with the same spans, and differs from the placeholders fed as tokens */
    int32_t prompt1[256], ref[16], tokens_only[16];
    g4_embd_span spans1[2] = {sp[0], sp[1]};
    size_t n1 = n;
    memcpy(prompt1, ids, sizeof *ids * n);
    int n_ref = fresh_reply(m, prompt1, (int)n1, spans1, 2, 6, ref), n_tok = fresh_reply(m, prompt1, (int)n1, NULL, 0, 6, tokens_only);
    g4_generate_result r;
    CHECK(g4_conversation_reply(c, NULL, NULL, &r) == 0, "%s", g4_last_error());
    int n_r;
    const int32_t *rep = g4_conversation_reply_tokens(c, &n_r);
    CHECK(n_r == n_ref && memcmp(rep, ref, sizeof *ref * (size_t)n_r) == 0, "reply 1 (%d tokens) is not the fresh session's (%d)", n_r, n_ref);
    CHECK(n_tok != n_ref || memcmp(tokens_only, ref, sizeof *ref * (size_t)n_ref) != 0,
          "the soft tokens change nothing: this check needs other values");
    printf("ok conversation: image + audio parts before the text, the markers expanded (%zu ids), spans at %d and %d; reply 1 (%d tokens) "
           "== a fresh session's with the spans\n",
           n1, spans1[0].at, spans1[1].at, n_r);
    /* turn 2: another image; the prompt continues the sequence, the history's media stay where they were */
    size_t n_fed;
    const int32_t *fed = g4_conversation_tokens(c, &n_fed);
    int32_t all[256];
    int n_all = (int)n_fed - 1; /* the last reply token waits unfed: the next prompt starts with it */
    memcpy(all, fed, sizeof *all * (size_t)n_all);
    CHECK(g4_conversation_add_media(c, G4_MEDIA_IMAGE, z, 2) == 0 && g4_conversation_add(c, G4_CHAT_USER, "And this one?") == 0, "%s", g4_last_error());
    CHECK(g4_conversation_prompt(c, &ids, &n) == 0 && g4_conversation_prompt_spans(c, &sp, &n_sp) == 0, "%s", g4_last_error());
    CHECK(n_sp == 1 && sp[0].n == 2 && ids[sp[0].at - 1] == 757 && ids[sp[0].at] == 758 && ids[sp[0].at + 2] == 759, "turn 2: %d spans", n_sp);
    if (n_sp != 1 || n_all + n > 256) goto done;
    g4_embd_span spans2[3] = {spans1[0], spans1[1], {.at = n_all + (n_sp ? sp[0].at : 0), .n = 2, .embd = z}};
    memcpy(all + n_all, ids, sizeof *ids * n);
    n_ref = fresh_reply(m, all, n_all + (int)n, spans2, 3, 6, ref);
    CHECK(g4_conversation_reply(c, NULL, NULL, &r) == 0, "%s", g4_last_error());
    rep = g4_conversation_reply_tokens(c, &n_r);
    CHECK(n_r == n_ref && memcmp(rep, ref, sizeof *ref * (size_t)n_r) == 0, "reply 2 (%d tokens) is not the fresh session's (%d)", n_r, n_ref);
    printf("ok conversation turn 2: a second image after the first turn; reply 2 (%d tokens) == a fresh session's over the whole history "
           "with the three spans\n",
           n_r);
done:
    g4_conversation_free(c);
    g4_session_free(s);
    g4_tokenizer_free(tok);
    g4_model_free(m);
    free(x), free(y), free(z);
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
    check_stepper_ends_in_embedding(m);
    check_causal(m);
    g4_model_free(m);
    char dir[] = "/tmp/g4-embed-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    check_conversation(dir);
    char path[64];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    remove(path);
    remove(dir);
    return check_report("embed");
}
