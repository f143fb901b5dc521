/* The generation loop on the tiny fixture: greedy output equals the golden ids, and each stop
 * reason (stop id, budget, callback, context) ends generation where it should. */
#include <pthread.h>

#include "testutil.h"
#include "generate/sampler.h"
#include "model/feed.h"

static int collect(void *user, int32_t token) {
    static int i;
    int32_t *out = user;
    out[i++ % 64] = token;
    return 0;
}

typedef struct {
    int32_t ids[64];
    int n;
} token_log;

static int log_token(void *user, int32_t token) {
    token_log *l = user;
    if (l->n < 64) l->ids[l->n++] = token;
    return 0;
}

static int stop_after_two(void *user, int32_t token) {
    (void)token;
    return ++*(int *)user == 2;
}

/* A session of n_seq sequences with a 48-token context in activation mode act. */
static g4_session *session_for(const g4_model *m, int act, int n_seq) {
    g4_options o;
    g4_options_default(&o);
    o.act = (g4_act_mode)act;
    o.ctx = 48;
    o.n_seq = n_seq;
    return g4_session_new(m, &o);
}

/* Batched decoding over independent sequences gives each sequence exactly (bit for bit) the
 * logits it gets alone, in every activation mode. */
static void check_batch(const g4_model *m, const int32_t *ids, int n) {
    enum { B = 3, STEPS = 6 };
    int V = g4_model_vocab_size(m), lens[B] = {n, n - 5, 9};
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) {
        g4_session *bs = session_for(m, act, B), *one = session_for(m, act, 1);
        float *lb = malloc(sizeof *lb * (size_t)B * V), *l1 = malloc(sizeof *l1 * (size_t)V);
        int32_t next[B];
        int seqs[B], differ = 0;
        for (int b = 0; b < B; b++) {
            seqs[b] = b;
            CHECK(g4_session_feed_seq(bs, b, ids + b, lens[b], lb + (size_t)b * V, 0) == 0, "%s", g4_last_error());
            next[b] = g4_argmax(lb + (size_t)b * V, V);
        }
        int32_t hist[B][64];
        for (int step = 0; step < STEPS; step++) {
            for (int b = 0; b < B; b++) hist[b][step] = next[b];
            CHECK(g4_session_feed_batch(bs, seqs, next, B, lb) == 0, "%s", g4_last_error());
            for (int b = 0; b < B; b++) next[b] = g4_argmax(lb + (size_t)b * V, V);
        }
        /* each sequence alone: prompt, then the same tokens one at a time */
        for (int b = 0; b < B; b++) {
            g4_session_reset(one);
            CHECK(g4_session_feed(one, ids + b, lens[b], l1, 0) == 0, "%s", g4_last_error());
            for (int step = 0; step < STEPS; step++) CHECK(g4_session_feed(one, &hist[b][step], 1, l1, 0) == 0, "%s", g4_last_error());
            /* compare the last step's logits of sequence b: recompute the batch's last logits row */
            differ += memcmp(l1, lb + (size_t)b * V, sizeof *l1 * (size_t)V) != 0;
            CHECK_EQ_INT(g4_session_seq_pos(bs, b), lens[b] + STEPS);
        }
        CHECK(differ == 0, "act %d: %d sequences get other logits in a batch", act, differ);
        /* a bad batch is refused */
        int dup[2] = {0, 0};
        CHECK(g4_session_feed_batch(bs, dup, next, 2, lb) != 0 && strstr(g4_last_error(), "twice"), "duplicate sequence accepted");
        free(lb);
        free(l1);
        g4_session_free(bs);
        g4_session_free(one);
    }
}

/* The greedy shortcut (g4_session_feed_argmax*, most logits never finished) picks what g4_argmax
 * picks from the full logits: alone and in batches of more rows than it takes per pass (8), in
 * every activation mode. */
static void check_argmax_api(const g4_model *m, const int32_t *ids, int n) {
    enum { B = 11, STEPS = 4 };
    int V = g4_model_vocab_size(m), mismatch = 0, steps = 0;
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) {
        g4_session *ga = session_for(m, act, B), *full = session_for(m, act, B);
        float *lb = malloc(sizeof *lb * (size_t)B * V);
        int32_t na[B], nf[B], fed[B];
        int seqs[B];
        for (int b = 0; b < B; b++) {
            int len = 4 + b % (n - 4);
            seqs[b] = b;
            CHECK(g4_session_feed_argmax_seq(ga, b, ids, len, &na[b]) == 0, "%s", g4_last_error());
            CHECK(g4_session_feed_seq(full, b, ids, len, lb, 0) == 0, "%s", g4_last_error());
            nf[b] = g4_argmax(lb, V);
            mismatch += na[b] != nf[b];
            steps++;
        }
        for (int step = 0; step < STEPS; step++) {
            memcpy(fed, nf, sizeof fed);
            CHECK(g4_session_feed_batch_argmax(ga, seqs, fed, B, na) == 0, "%s", g4_last_error());
            CHECK(g4_session_feed_batch(full, seqs, fed, B, lb) == 0, "%s", g4_last_error());
            for (int b = 0; b < B; b++) {
                nf[b] = g4_argmax(lb + (size_t)b * V, V);
                mismatch += na[b] != nf[b];
                steps++;
            }
        }
        free(lb);
        g4_session_free(ga);
        g4_session_free(full);
    }
    CHECK(mismatch == 0, "greedy shortcut differs from g4_argmax on %d of %d steps", mismatch, steps);
}

/* Sampling's lm_head shortcut (g4_session_feed_top): the candidates' logits are the full logits
 * bit for bit, they hold the k largest and the extra ids, no other logit exceeds the bound, and
 * g4_session_last_logits gives the full logits; then g4_generate, which samples from the
 * candidates, picks the tokens a loop over the full logits picks, with and without a penalty. */
static void check_sampling_shortcut(const g4_model *m, const int32_t *ids, int n) {
    enum { MAXC = 4096, STEPS = 24 };
    int V = g4_model_vocab_size(m), settled = 0, calls = 0;
    float *full = malloc(sizeof *full * (size_t)V), *again = malloc(sizeof *again * (size_t)V), *vals = malloc(sizeof *vals * MAXC);
    int32_t *cand = malloc(sizeof *cand * MAXC);
    char *in_set = malloc((size_t)V);
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) {
        g4_session *a = session_for(m, act, 1), *b = session_for(m, act, 1);
        const int32_t extra[4] = {ids[0], -1, V, ids[n - 1]};
        int32_t fed = ids[0];
        for (int step = 0; step < 4; step++) {
            int k = 1 + 7 * step, mc = -2;
            float bound = NAN;
            const int32_t *feed = step ? &fed : ids;
            int len = step ? 1 : n;
            CHECK(g4_session_feed_top(a, feed, len, k, extra, 4, cand, vals, MAXC, &bound, &mc) == 0, "%s", g4_last_error());
            CHECK(g4_session_feed(b, feed, len, full, 0) == 0, "%s", g4_last_error());
            CHECK(g4_session_last_logits(a, again) == 0 && memcmp(again, full, sizeof *full * (size_t)V) == 0,
                  "act %d: g4_session_last_logits differs from the full logits", act);
            calls++;
            if (mc >= 0) {
                settled++;
                memset(in_set, 0, (size_t)V);
                int ok = 1;
                for (int c = 0; c < mc; c++) {
                    ok &= cand[c] >= 0 && cand[c] < V && memcmp(&vals[c], &full[cand[c]], sizeof *vals) == 0;
                    if (cand[c] >= 0 && cand[c] < V) in_set[cand[c]] = 1;
                }
                for (int o = 0; o < V; o++) ok &= in_set[o] || full[o] <= bound;
                for (int r = 0; r < k; r++) { /* the r-th largest is a candidate */
                    int best = -1;
                    for (int o = 0; o < V; o++)
                        if (in_set[o] != 2 && (best < 0 || full[o] > full[best])) best = o;
                    ok &= in_set[best] == 1;
                    in_set[best] = 2;
                }
                ok &= in_set[ids[0]] && in_set[ids[n - 1]];
                CHECK(ok, "act %d step %d: top-%d candidates (%d) disagree with the full logits", act, step, k, mc);
            }
            fed = (int32_t)g4_argmax(full, V);
        }
        g4_session_free(a);
        g4_session_free(b);
    }
    CHECK(settled == calls, "the sampling shortcut settles every fixture step (%d of %d)", settled, calls);
    static const g4_sampling modes[3] = {
        {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .min_p = 0.02f, .repeat_penalty = 1.3f, .repeat_last_n = 16, .seed = 7},
        {.temperature = 1.0f, .top_k = 64, .top_p = 0.95f, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 64, .seed = 3},
        {.temperature = 0, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1.5f, .repeat_last_n = 0, .seed = 0},
    };
    for (int md = 0; md < 3; md++) {
        g4_session *a = session_for(m, G4_ACT_INT, 1), *b = session_for(m, G4_ACT_INT, 1);
        static const int none[1] = {-1};
        g4_generate_params p = {.max_tokens = STEPS, .stop_ids = none, .n_stop_ids = 1, .sampling = modes[md]};
        g4_generate_result r;
        token_log got = {.n = 0};
        int32_t want[64 + 48];
        CHECK(g4_generate(a, ids, n, &p, log_token, &got, &r) == 0 && r.n_generated == STEPS, "%s", g4_last_error());
        /* the same with every logit: the sampler over g4_session_feed's logits */
        g4_sampler *smp = g4_sampler_new(&modes[md], V);
        memcpy(want, ids, sizeof *ids * (size_t)n);
        int nh = n;
        CHECK(g4_session_feed(b, ids, n, full, 0) == 0, "%s", g4_last_error());
        for (int i = 0; i < STEPS; i++) {
            want[nh] = g4_sampler_sample(smp, full, want, nh);
            nh++;
            if (i + 1 < STEPS) CHECK(g4_session_feed(b, &want[nh - 1], 1, full, 0) == 0, "%s", g4_last_error());
        }
        int same = 0;
        while (same < STEPS && got.ids[same] == want[n + same]) same++;
        CHECK(same == STEPS, "sampling mode %d: g4_generate and the full-logit loop agree on %d of %d tokens", md, same, STEPS);
        g4_sampler_free(smp);
        g4_session_free(a);
        g4_session_free(b);
    }
    free(full);
    free(again);
    free(vals);
    free(cand);
    free(in_set);
}

/* Sessions decoding in several threads at once give each the logits it gets alone, bit for bit
 * (the pool, and its background items, serve one caller at a time; the others compute
 * everything themselves). */
enum { THREAD_STEPS = 12 };
typedef struct {
    const g4_model *m;
    const int32_t *ids;
    int n, rc;
    float *logits; /* [THREAD_STEPS][vocab] */
} thread_run;

static void *decode_steps(void *arg) {
    thread_run *t = arg;
    int V = g4_model_vocab_size(t->m);
    g4_session *s = session_for(t->m, G4_ACT_INT, 1);
    t->rc = s ? g4_session_feed(s, t->ids, t->n, t->logits, 0) : -1;
    for (int i = 1; i < THREAD_STEPS && t->rc == 0; i++) {
        int32_t next = (int32_t)g4_argmax(t->logits + (size_t)(i - 1) * V, V);
        t->rc = g4_session_feed(s, &next, 1, t->logits + (size_t)i * V, 0);
    }
    g4_session_free(s);
    return NULL;
}

static void check_threads(const g4_model *m, const int32_t *ids, int n) {
    enum { T = 3 };
    size_t len = (size_t)THREAD_STEPS * (size_t)g4_model_vocab_size(m);
    if (n > 24) n = 24;
    thread_run alone = {m, ids, n, 0, malloc(sizeof(float) * len)}, runs[T];
    decode_steps(&alone);
    CHECK(alone.rc == 0, "%s", g4_last_error());
    int differ = 0, failed = 0;
    for (int rep = 0; rep < 12; rep++) {
        pthread_t th[T];
        for (int i = 0; i < T; i++) {
            runs[i] = (thread_run){m, ids, n, 0, malloc(sizeof(float) * len)};
            if (pthread_create(&th[i], NULL, decode_steps, &runs[i]) != 0) runs[i].rc = -2, th[i] = 0;
        }
        for (int i = 0; i < T; i++) {
            if (runs[i].rc != -2) pthread_join(th[i], NULL);
            failed += runs[i].rc != 0;
            differ += runs[i].rc == 0 && memcmp(runs[i].logits, alone.logits, sizeof(float) * len) != 0;
            free(runs[i].logits);
        }
    }
    CHECK(failed == 0 && differ == 0, "decoding in %d threads at once: %d runs failed, %d got other logits", T, failed, differ);
    free(alone.logits);
}

int main(void) {
    if (!check_dispatch_level()) return check_report("generate");
    char path[8192];
    snprintf(path, sizeof path, "%s/golden.json", tiny_dir());
    cJSON *golden = read_json(path);
    int n, n_gold;
    int32_t *ids = json_ids(cJSON_GetObjectItem(golden, "input_ids"), &n);
    int32_t *gold = json_ids(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "modes"), "fakequant-full"), "generated_ids"), &n_gold);
    g4_model *m = g4_model_load(tiny_dir());
    if (!m) return 2;
    g4_options o;
    g4_options_default(&o);
    o.ctx = 64;
    g4_session *s = g4_session_new(m, &o);
    static const int none[1] = {-1};
    g4_generate_params p = {.max_tokens = n_gold, .stop_ids = none, .n_stop_ids = 1};
    g4_sampling_default(&p.sampling);
    g4_generate_result r;
    CHECK(g4_generate(s, ids, n, &p, NULL, NULL, &r) == 0, "%s", g4_last_error());
    CHECK(r.stop == G4_STOP_BUDGET && r.n_generated == n_gold, "budget: stop %d after %d", r.stop, r.n_generated);
    CHECK_EQ_INT(g4_session_pos(s), n + n_gold - 1);

    /* a stop id: generation ends on it, reporting it */
    g4_session_reset(s);
    int stop_id = gold[3];
    p.stop_ids = &stop_id;
    CHECK(g4_generate(s, ids, n, &p, NULL, NULL, &r) == 0, "%s", g4_last_error());
    CHECK(r.stop == G4_STOP_EOS && r.stop_id == stop_id && r.n_generated == 4, "eos: stop %d id %d after %d", r.stop, r.stop_id, r.n_generated);

    /* the callback stops it */
    g4_session_reset(s);
    p.stop_ids = none;
    int count = 0;
    CHECK(g4_generate(s, ids, n, &p, stop_after_two, &count, &r) == 0, "%s", g4_last_error());
    CHECK(r.stop == G4_STOP_USER && r.n_generated == 2, "user: stop %d after %d", r.stop, r.n_generated);

    /* a second call continues in the same cache: prompt split over two calls gives the golden ids */
    g4_session_reset(s);
    p.max_tokens = 1;
    CHECK(g4_generate(s, ids, 10, &p, NULL, NULL, &r) == 0, "%s", g4_last_error());
    CHECK_EQ_INT(g4_session_pos(s), 10);
    p.max_tokens = n_gold;
    int32_t got[64];
    int n_got = 0;
    CHECK(g4_generate(s, ids + 10, n - 10, &p, collect, got, &r) == 0, "%s", g4_last_error());
    n_got = r.n_generated;
    CHECK(n_got == n_gold && memcmp(got, gold, sizeof *gold * (size_t)n_gold) == 0, "split prompt: different tokens");

    /* a prompt past the context fails before computing anything */
    g4_session_reset(s);
    int32_t *big = calloc(80, sizeof *big);
    CHECK(g4_generate(s, big, 80, &p, NULL, NULL, &r) != 0 && strstr(g4_last_error(), "does not fit the context"), "%s", g4_last_error());
    CHECK_EQ_INT(g4_session_pos(s), 0);
    free(big);
    g4_session_free(s);
    check_batch(m, ids, n);
    check_argmax_api(m, ids, n);
    check_sampling_shortcut(m, ids, n);
    check_threads(m, ids, n);
    g4_model_free(m);
    free(ids);
    free(gold);
    cJSON_Delete(golden);
    return check_report("generate");
}
