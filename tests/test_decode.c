/* g4_decode, one call for a batch of rows: every row gets what it gets alone, bit for bit, whatever
 * it asks for (nothing, every logit, the greedy token, top-k candidates with extras, a token sampled
 * from those) and whatever shares its batch (prompt rows of other sequences, several rows of its
 * own, batches that span several 64-row chunks); what each output gives agrees with the full
 * logits of a separate run; a bad batch feeds nothing. Both fixtures, every activation mode. */
#include "generate/sampler.h"
#include "testutil.h"

enum { N_SEQS = 5, MAX_ROWS = 60, CAND = 512 };

/* One sequence's rows: its tokens (fixed in advance, so that no run feeds back what it computed)
 * and what each row asks for. */
typedef struct {
    int n;
    int32_t tok[MAX_ROWS];
    g4_output out[MAX_ROWS];
    int k[MAX_ROWS];
} script;

/* What one row gave. logits: a LOGITS row's logits, or g4_decode_logits of a greedy or top row. */
typedef struct {
    float *logits;
    int32_t argmax, sampled;
    int n;
    float bound;
    int32_t ids[CAND];
    float vals[CAND];
    int32_t extra[6];
    int n_extra;
} result;

static int V;

static uint32_t next_rand(uint32_t *r) {
    *r = *r * 1103515245u + 12345u;
    return *r >> 8;
}

/* Five sequences: prompts of 37, 5, 50, 1 and 12 tokens, then decode rows, each sequence asking for
 * one output kind (the fourth for all of them in turn, some prompt rows too). */
static void make_scripts(script *sc) {
    static const int prompt[N_SEQS] = {37, 5, 50, 1, 12}, rows[N_SEQS] = {45, 20, 60, 30, 25};
    static const g4_output kind[N_SEQS] = {G4_OUTPUT_LOGITS, G4_OUTPUT_ARGMAX, G4_OUTPUT_TOP, G4_OUTPUT_NONE, G4_OUTPUT_TOP};
    uint32_t r = 99;
    for (int s = 0; s < N_SEQS; s++) {
        script *c = &sc[s];
        c->n = rows[s];
        for (int i = 0; i < c->n; i++) {
            c->tok[i] = (int32_t)(next_rand(&r) % (uint32_t)V);
            c->out[i] = i < prompt[s] - 1 ? G4_OUTPUT_NONE : kind[s];
            if (s == 3) c->out[i] = (g4_output)((i + 1) % 4); /* every kind, prompt rows included */
            c->k[i] = s == 4 ? 1 : 1 + (i % 5) * 6;
        }
    }
}

/* The row request for row i of sequence sc at session sequence seq, its buffers in res. */
static g4_batch_row request(const script *sc, int i, int seq, result *res, g4_candidates *cand) {
    g4_batch_row row = {.seq = seq, .token = sc->tok[i], .output = sc->out[i]};
    if (row.output == G4_OUTPUT_LOGITS) row.logits = res->logits;
    if (row.output == G4_OUTPUT_TOP) {
        /* extras: the last tokens (a penalty's), an id twice, and invalid ids, which are skipped */
        int ne = 0;
        for (int j = i - 1; j >= 0 && j >= i - 3; j--) res->extra[ne++] = sc->tok[j];
        res->extra[ne++] = sc->tok[i];
        res->extra[ne++] = -1;
        res->extra[ne++] = V;
        res->n_extra = ne;
        *cand = (g4_candidates){.k = sc->k[i], .extra = res->extra, .n_extra = ne, .ids = res->ids, .logits = res->vals, .cap = CAND};
        row.top = cand;
    }
    return row;
}

/* After a call: the greedy token, the candidates and a sampled token of each row, and the full
 * logits of the greedy and top rows (g4_decode_logits). sampler: the sequence's own. */
static void collect(g4_session *s, const g4_batch_row *row, int at, result *res, g4_sampler *sampler) {
    if (row->output == G4_OUTPUT_ARGMAX) res->argmax = row->argmax;
    if (row->output == G4_OUTPUT_ARGMAX || row->output == G4_OUTPUT_TOP)
        CHECK(g4_decode_logits(s, at, res->logits) == 0, "%s", g4_last_error());
    if (row->output != G4_OUTPUT_TOP) return;
    res->n = row->top->n;
    res->bound = row->top->bound;
    int32_t pick = res->n >= 0 ? g4_sampler_sample_top(sampler, res->ids, res->vals, res->n, res->bound, NULL, 0) : -1;
    res->sampled = pick >= 0 ? pick : g4_sampler_sample(sampler, res->logits, NULL, 0);
}

static g4_session *session(const g4_model *m, int act, int n_seq) {
    g4_options o;
    g4_options_default(&o);
    o.act = (g4_act_mode)act;
    o.ctx = 64;
    o.n_seq = n_seq;
    g4_session *s = g4_session_new(m, &o);
    CHECK(s != NULL, "%s", g4_last_error());
    return s;
}

static g4_sampler *sampler_for(int s) {
    g4_sampling p;
    g4_sampling_default(&p);
    p.temperature = 0.9f;
    p.top_k = s == 4 ? 1 : 25;
    p.seed = 1000 + (uint64_t)s;
    return g4_sampler_new(&p, V);
}

/* Each sequence alone in a session of its own, one row per call. */
static void run_alone(const g4_model *m, int act, const script *sc, result res[][MAX_ROWS]) {
    for (int s = 0; s < N_SEQS; s++) {
        g4_session *one = session(m, act, 1);
        g4_sampler *smp = sampler_for(s);
        for (int i = 0; one && i < sc[s].n; i++) {
            g4_candidates cand;
            g4_batch_row row = request(&sc[s], i, 0, &res[s][i], &cand);
            CHECK(g4_decode(one, &row, 1) == 0, "%s", g4_last_error());
            collect(one, &row, 0, &res[s][i], smp);
        }
        g4_sampler_free(smp);
        g4_session_free(one);
    }
}

/* Every sequence in one session (at other sequence numbers), their rows interleaved in batches of
 * 1 to 150 rows: several rows of a sequence in a call, prompt rows beside decode rows, calls that
 * span chunks. */
static void run_batched(const g4_model *m, int act, const script *sc, result res[][MAX_ROWS]) {
    static const int slot[N_SEQS] = {3, 0, 5, 1, 4}, sizes[] = {150, 1, 9, 70, 64, 3, 100};
    g4_session *s = session(m, act, 6);
    g4_sampler *smp[N_SEQS];
    for (int q = 0; q < N_SEQS; q++) smp[q] = sampler_for(q);
    g4_batch_row rows[N_SEQS * MAX_ROWS];
    g4_candidates cand[N_SEQS * MAX_ROWS];
    int who[N_SEQS * MAX_ROWS], which[N_SEQS * MAX_ROWS], fed[N_SEQS] = {0}, left = 0, call = 0;
    uint32_t r = 7;
    for (int q = 0; q < N_SEQS; q++) left += sc[q].n;
    while (s && left > 0) {
        int want = sizes[call++ % (int)(sizeof sizes / sizeof *sizes)], n = 0;
        for (int q = (int)(next_rand(&r) % N_SEQS); n < want && n < left; q = (q + 1) % N_SEQS) {
            int take = 1 + (int)(next_rand(&r) % 12);
            for (; take > 0 && fed[q] < sc[q].n && n < want; take--, n++) {
                who[n] = q;
                which[n] = fed[q]++;
                rows[n] = request(&sc[q], which[n], slot[q], &res[q][which[n]], &cand[n]);
            }
        }
        CHECK(g4_decode(s, rows, n) == 0, "%s", g4_last_error());
        for (int i = 0; i < n; i++) collect(s, &rows[i], i, &res[who[i]][which[i]], smp[who[i]]);
        left -= n;
    }
    for (int q = 0; s && q < N_SEQS; q++) CHECK_EQ_INT(g4_session_seq_pos(s, slot[q]), sc[q].n);
    for (int q = 0; q < N_SEQS; q++) g4_sampler_free(smp[q]);
    g4_session_free(s);
}

/* Every row's logits, from a run of its own that asks for nothing else. */
static void run_full(const g4_model *m, int act, const script *sc, float *full[]) {
    for (int q = 0; q < N_SEQS; q++) {
        g4_session *s = session(m, act, 1);
        g4_batch_row rows[MAX_ROWS];
        for (int i = 0; i < sc[q].n; i++)
            rows[i] = (g4_batch_row){.seq = 0, .token = sc[q].tok[i], .output = G4_OUTPUT_LOGITS, .logits = full[q] + (size_t)i * V};
        CHECK(s && g4_decode(s, rows, sc[q].n) == 0, "%s", g4_last_error());
        g4_session_free(s);
    }
}

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* The same answer to the same request, bit for bit. */
static int same_result(g4_output out, const result *a, const result *b) {
    size_t row = sizeof(float) * (size_t)V;
    switch (out) {
    case G4_OUTPUT_LOGITS: return same_bits(a->logits, b->logits, row);
    case G4_OUTPUT_ARGMAX: return a->argmax == b->argmax && same_bits(a->logits, b->logits, row);
    case G4_OUTPUT_TOP:
        return a->n == b->n && a->sampled == b->sampled && same_bits(a->logits, b->logits, row) &&
               (a->n < 0 || (same_bits(&a->bound, &b->bound, sizeof a->bound) && same_bits(a->ids, b->ids, sizeof *a->ids * (size_t)a->n) &&
                             same_bits(a->vals, b->vals, sizeof *a->vals * (size_t)a->n)));
    default: return 1;
    }
}

/* Top candidates against the full logits: exact values, the k largest and every valid extra among
 * them, nothing outside above the bound. */
static int candidates_agree(const result *r, int k, const float *full) {
    char *in = calloc((size_t)V, 1);
    int ok = 1;
    for (int c = 0; c < r->n; c++) {
        ok &= r->ids[c] >= 0 && r->ids[c] < V && same_bits(&r->vals[c], &full[r->ids[c]], sizeof *full);
        if (r->ids[c] >= 0 && r->ids[c] < V) in[r->ids[c]] = 1;
    }
    for (int o = 0; o < V; o++) ok &= in[o] || full[o] <= r->bound;
    for (int e = 0; e < r->n_extra; e++)
        if (r->extra[e] >= 0 && r->extra[e] < V) ok &= in[r->extra[e]];
    for (int j = 0; j < k; j++) { /* the j-th largest logit is a candidate */
        int best = -1;
        for (int o = 0; o < V; o++)
            if (in[o] != 2 && (best < 0 || full[o] > full[best])) best = o;
        ok &= in[best] == 1;
        in[best] = 2;
    }
    free(in);
    return ok;
}

static void check_model(const char *dir) {
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return;
    V = g4_model_vocab_size(m);
    script sc[N_SEQS];
    make_scripts(sc);
    static result alone[N_SEQS][MAX_ROWS], batched[N_SEQS][MAX_ROWS];
    float *full[N_SEQS];
    for (int q = 0; q < N_SEQS; q++) {
        full[q] = malloc(sizeof(float) * (size_t)MAX_ROWS * V);
        for (int i = 0; i < MAX_ROWS; i++) {
            alone[q][i].logits = calloc((size_t)V, sizeof(float));
            batched[q][i].logits = calloc((size_t)V, sizeof(float));
        }
    }
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) {
        run_alone(m, act, sc, alone);
        run_batched(m, act, sc, batched);
        run_full(m, act, sc, full);
        int rows[4] = {0}, differ[4] = {0}, wrong[4] = {0}, settled = 0;
        for (int q = 0; q < N_SEQS; q++)
            for (int i = 0; i < sc[q].n; i++) {
                g4_output out = sc[q].out[i];
                const result *a = &alone[q][i];
                const float *f = full[q] + (size_t)i * V;
                rows[out]++;
                differ[out] += !same_result(out, a, &batched[q][i]);
                if (out == G4_OUTPUT_LOGITS) wrong[out] += !same_bits(a->logits, f, sizeof *f * (size_t)V);
                if (out == G4_OUTPUT_ARGMAX) wrong[out] += a->argmax != g4_argmax(f, V) || !same_bits(a->logits, f, sizeof *f * (size_t)V);
                if (out == G4_OUTPUT_TOP) {
                    settled += a->n >= 0;
                    wrong[out] += !same_bits(a->logits, f, sizeof *f * (size_t)V) || (a->n >= 0 && !candidates_agree(a, sc[q].k[i], f));
                }
            }
        static const char *names[4] = {"none", "logits", "argmax", "top"};
        for (int out = G4_OUTPUT_NONE; out <= G4_OUTPUT_TOP; out++) {
            CHECK(rows[out] > 0, "%s act %d: no %s rows", dir, act, names[out]);
            CHECK(differ[out] == 0, "%s act %d: %d of %d %s rows differ in a batch from alone", dir, act, differ[out], rows[out], names[out]);
            CHECK(wrong[out] == 0, "%s act %d: %d of %d %s rows disagree with the full logits", dir, act, wrong[out], rows[out], names[out]);
        }
        CHECK(settled == rows[G4_OUTPUT_TOP], "%s act %d: the shortcut settles %d of %d top rows", dir, act, settled, rows[G4_OUTPUT_TOP]);
        printf("ok %s act %d: %d logits, %d greedy, %d top (sampled) and %d plain rows the same in mixed batches as alone\n", dir, act,
               rows[1], rows[2], rows[3], rows[0]);
    }
    for (int q = 0; q < N_SEQS; q++) {
        free(full[q]);
        for (int i = 0; i < MAX_ROWS; i++) {
            free(alone[q][i].logits);
            free(batched[q][i].logits);
        }
    }
    g4_model_free(m);
}

/* A bad batch fails before anything is fed, naming what is wrong. */
static void check_refusals(void) {
    g4_model *m = g4_model_load(tiny_dir());
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return;
    V = g4_model_vocab_size(m);
    g4_options o;
    g4_options_default(&o);
    o.ctx = 8;
    o.n_seq = 2;
    g4_session *s = g4_session_new(m, &o);
    float *logits = malloc(sizeof *logits * (size_t)V);
    g4_batch_row rows[10];
    for (int i = 0; i < 10; i++) rows[i] = (g4_batch_row){.seq = i % 2, .token = 3 + i};
    struct {
        int row, n;
        g4_batch_row bad;
        const char *msg;
    } cases[] = {
        {3, 4, {.seq = 2, .token = 5}, "sequence 2 does not exist"},
        {3, 4, {.seq = -1, .token = 5}, "sequence -1 does not exist"},
        {2, 4, {.seq = 0, .token = 512}, "outside the vocabulary"},
        {1, 4, {.seq = 1, .token = -3}, "outside the vocabulary"},
        {3, 4, {.seq = 1, .token = 5, .output = G4_OUTPUT_LOGITS}, "no room"},
        {3, 4, {.seq = 1, .token = 5, .output = G4_OUTPUT_TOP}, "no room"},
        {3, 4, {.seq = 1, .token = 5, .output = (g4_output)7}, "unknown output 7"},
        {0, 0, {.seq = 0}, "no tokens"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        g4_batch_row b[4];
        memcpy(b, rows, sizeof b);
        if (cases[c].n) b[cases[c].row] = cases[c].bad;
        CHECK(g4_decode(s, b, cases[c].n) != 0 && strstr(g4_last_error(), cases[c].msg), "case %zu: %s", c, g4_last_error());
        CHECK(g4_session_seq_pos(s, 0) == 0 && g4_session_seq_pos(s, 1) == 0, "case %zu fed tokens", c);
    }
    /* nine rows of sequence 1 (and one of 0) run past a context of 8 */
    for (int i = 0; i < 10; i++) rows[i].seq = i > 0;
    CHECK(g4_decode(s, rows, 10) != 0 && strstr(g4_last_error(), "sequence 1: tokens at position 0 run past the context of 8"), "%s",
          g4_last_error());
    CHECK(g4_session_seq_pos(s, 0) == 0 && g4_session_seq_pos(s, 1) == 0, "a batch past the context fed tokens");
    /* eight fit; g4_decode_logits answers the greedy row only, and only until the next call */
    rows[8].output = G4_OUTPUT_ARGMAX;
    CHECK(g4_decode(s, rows, 9) == 0, "%s", g4_last_error());
    CHECK(g4_session_seq_pos(s, 0) == 1 && g4_session_seq_pos(s, 1) == 8, "positions %d, %d", g4_session_seq_pos(s, 0),
          g4_session_seq_pos(s, 1));
    CHECK(g4_decode_logits(s, 8, logits) == 0 && g4_argmax(logits, V) == rows[8].argmax, "%s", g4_last_error());
    CHECK(g4_decode_logits(s, 7, logits) != 0 && strstr(g4_last_error(), "row 7"), "a plain row's logits: %s", g4_last_error());
    rows[0].output = G4_OUTPUT_NONE;
    CHECK(g4_decode(s, rows, 1) == 0 && g4_decode_logits(s, 8, logits) != 0, "the last call's row 8 outlived the call");
    free(logits);
    g4_session_free(s);
    g4_model_free(m);
}

int main(void) {
    if (!check_dispatch_level()) return check_report("decode");
    check_model(tiny_dir());
    check_model("tests/fixtures/tiny-b");
    check_refusals();
    return check_report("decode");
}
