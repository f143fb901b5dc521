/* g4_decode: a batch of rows (sequence, token or embedding, output request) checked whole before anything is
 * computed, then cut into chunks of up to CHUNK rows, each ordered into output groups
 * (chunk_plan) and computed by g4_forward_chunk; and the compatibility forms on top of it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "feed.h"
#include "forward.h"
#include "lmhead.h"
#include "session.h"
#include "util/err.h"

/* The output group of batch row r (chunk_plan). */
static int row_group(const g4_session *s, const g4_batch_row *r) {
    switch (r->output) {
    case G4_OUTPUT_LOGITS: return GROUP_LOGITS;
    case G4_OUTPUT_ARGMAX: return s->call_coarse[r->seq] == 2 ? GROUP_ARGMAX_2 : GROUP_ARGMAX_1;
    case G4_OUTPUT_TOP: return GROUP_TOP;
    default: return GROUP_NONE;
    }
}

/* Orders batch rows [b0, b0 + n) into groups (stable within each) and gives each row its
 * sequence's next position: a sequence's rows take consecutive positions in batch order. */
static void plan_chunk(g4_session *s, g4_batch_row *rows, int b0, int n, chunk_plan *p) {
    int fill[N_GROUPS] = {0};
    p->rows = rows;
    p->n = n;
    for (int i = b0; i < b0 + n; i++) {
        fill[row_group(s, &rows[i])]++;
        s->seq_rank[rows[i].seq] = 0;
    }
    p->start[0] = 0;
    for (int g = 0; g < N_GROUPS; g++) {
        p->start[g + 1] = p->start[g] + fill[g];
        fill[g] = p->start[g];
    }
    for (int i = b0; i < b0 + n; i++) {
        int t = fill[row_group(s, &rows[i])]++, q = rows[i].seq;
        p->at[t] = i;
        p->embd[t] = rows[i].embd;
        p->ids[t] = rows[i].embd ? s->m->cfg.pad_id : rows[i].token;
        s->row_seq[t] = q;
        s->row_pos[t] = s->seq_pos[q] + s->seq_rank[q]++;
    }
}

/* ---- one call ---- */

static int check_ids(const g4_session *s, const int32_t *ids, int n) {
    const g4_config *c = &s->m->cfg;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab || ids[i] >= c->vocab_ple)
            return g4_fail("token id %d is outside the vocabulary (0..%d)", ids[i], c->vocab - 1);
    return 0;
}

/* An embedding row's hidden-size values: a NaN or an infinity would spread through the row's
 * K/V into every later token of its sequence, so it is refused before anything is fed. */
static int check_embedding(const g4_session *s, const float *embd, int row) {
    const g4_config *c = &s->m->cfg;
    if (c->pad_id >= c->vocab || c->pad_id >= c->vocab_ple)
        return g4_fail("batch row %d: an embedding row needs the pad id's per-layer input, and config.json's pad_token_id %d is outside the vocabulary", row, c->pad_id);
    for (int k = 0; k < c->hidden; k++)
        if (!isfinite(embd[k])) return g4_fail("batch row %d: embedding value %d is %g (not finite)", row, k, (double)embd[k]);
    return 0;
}

/* The greedy path's one row of full logits, allocated on its first use. */
static int ensure_logit_row(g4_session *s) {
    if (!s->logit_row) s->logit_row = malloc(sizeof *s->logit_row * (size_t)s->m->cfg.vocab);
    return s->logit_row ? 0 : g4_fail("out of memory for a row of logits");
}

/* Room for the hidden state of n kept rows (keep_hidden). */
static int ensure_kept(g4_session *s, int n) {
    if (n <= s->cap_kept) return 0;
    float *kept = realloc(s->kept, sizeof *kept * (size_t)n * (size_t)s->m->cfg.hidden);
    if (kept) s->kept = kept;
    int *rows = kept ? realloc(s->kept_row, sizeof *rows * (size_t)n) : NULL;
    if (rows) s->kept_row = rows;
    if (!kept || !rows) return g4_fail("out of memory for %d rows of hidden state", n);
    s->cap_kept = n;
    return 0;
}

/* Everything g4_decode could fail on, checked before any row is computed. */
static int check_batch(g4_session *s, const g4_batch_row *rows, int n) {
    if (n <= 0) return g4_fail("no tokens to evaluate");
    int greedy = 0, kept = 0;
    for (int i = 0; i < n; i++) {
        const g4_batch_row *r = &rows[i];
        if (r->seq < 0 || r->seq >= s->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", r->seq, s->n_seq);
        if (r->embd ? check_embedding(s, r->embd, i) != 0 : check_ids(s, &r->token, 1) != 0) return -1;
        if (r->output == G4_OUTPUT_LOGITS && !r->logits) return g4_fail("batch row %d asks for logits and gives no room for them", i);
        if (r->output == G4_OUTPUT_TOP && (!r->top || r->top->cap < 0 || (r->top->cap > 0 && (!r->top->ids || !r->top->logits))))
            return g4_fail("batch row %d asks for candidates and gives no room for them", i);
        if (r->output < G4_OUTPUT_NONE || r->output > G4_OUTPUT_TOP) return g4_fail("batch row %d: unknown output %d", i, (int)r->output);
        greedy |= r->output == G4_OUTPUT_ARGMAX;
        kept += r->output != G4_OUTPUT_NONE;
        s->seq_rank[r->seq] = 0;
    }
    for (int i = 0; i < n; i++) {
        int q = rows[i].seq, pos = s->seq_pos[q];
        if (++s->seq_rank[q] == s->o.ctx - pos + 1)
            return g4_fail("sequence %d: tokens at position %d run past the context of %d tokens (--ctx)", q, pos, s->o.ctx);
    }
    if (greedy && ensure_logit_row(s) != 0) return -1;
    return ensure_kept(s, kept);
}

/* Each sequence's coarse image for this call, read once (g4_lm_head_coarse); no shortcut ran yet. */
static void begin_call(g4_session *s) {
    for (int q = 0; q < s->n_seq; q++) {
        s->call_coarse[q] = g4_lm_head_coarse(s, q);
        s->call_ran[q] = s->call_unsettled[q] = 0;
    }
    s->n_kept = 0;
}

static void end_call(g4_session *s) {
    for (int q = 0; q < s->n_seq; q++)
        if (s->call_ran[q]) g4_lm_head_coarse_done(s, q, s->call_coarse[q], s->call_unsettled[q]);
}

int g4_decode(g4_session *s, g4_batch_row *rows, int n) {
    if (check_batch(s, rows, n) != 0) return -1;
    begin_call(s);
    for (int b0 = 0; b0 < n; b0 += CHUNK) {
        int len = n - b0 < CHUNK ? n - b0 : CHUNK;
        chunk_plan p;
        plan_chunk(s, rows, b0, len, &p);
        g4_forward_chunk(s, &p);
        for (int i = b0; i < b0 + len; i++) s->seq_pos[rows[i].seq]++;
    }
    end_call(s);
    return 0;
}

/* ---- the compatibility forms: each feeds g4_decode a chunk of rows at a time ---- */

/* What a run of one sequence's tokens asks for, one output kind: of its last token (the logits
 * into `logits`, the greedy token into *argmax, the candidates into *top), or, with every_row,
 * every token's logits, token t's at logits + t * vocab. */
typedef struct {
    g4_output kind;
    int every_row;
    float *logits;
    int32_t *argmax;
    g4_candidates *top;
} seq_request;

/* n tokens of sequence seq, with what `want` asks for. */
static int feed_seq(g4_session *s, int seq, const int32_t *ids, int n, const seq_request *want) {
    if (seq < 0 || seq >= s->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", seq, s->n_seq);
    if (n <= 0) return g4_fail("no tokens to evaluate");
    int pos = s->seq_pos[seq];
    if (n > s->o.ctx - pos) return g4_fail("%d tokens at position %d run past the context of %d tokens (--ctx)", n, pos, s->o.ctx);
    if (check_ids(s, ids, n) != 0) return -1;
    size_t V = (size_t)s->m->cfg.vocab;
    int every = want->kind == G4_OUTPUT_LOGITS && want->every_row;
    g4_batch_row rows[CHUNK];
    for (int done = 0; done < n;) {
        int len = n - done < CHUNK ? n - done : CHUNK, last = done + len == n;
        for (int t = 0; t < len; t++) {
            rows[t] = (g4_batch_row){.seq = seq, .token = ids[done + t]};
            if (every) rows[t].output = G4_OUTPUT_LOGITS, rows[t].logits = want->logits + (size_t)(done + t) * V;
        }
        g4_batch_row *end = &rows[len - 1];
        if (last && !every) *end = (g4_batch_row){.seq = seq, .token = end->token, .output = want->kind, .logits = want->logits, .top = want->top};
        if (g4_decode(s, rows, len) != 0) return -1;
        if (last && want->kind == G4_OUTPUT_ARGMAX) *want->argmax = end->argmax;
        done += len;
    }
    return 0;
}

/* The last token's logits (or every token's), or nothing when logits is NULL. */
static seq_request logits_request(float *logits, int all_logits) {
    return (seq_request){.kind = logits ? G4_OUTPUT_LOGITS : G4_OUTPUT_NONE, .every_row = all_logits, .logits = logits};
}

/* The last token's greedy token, or nothing when next is NULL. */
static seq_request argmax_request(int32_t *next) { return (seq_request){.kind = next ? G4_OUTPUT_ARGMAX : G4_OUTPUT_NONE, .argmax = next}; }

int g4_session_feed_seq(g4_session *s, int seq, const int32_t *ids, int n, float *logits, int all_logits) {
    seq_request want = logits_request(logits, all_logits);
    return feed_seq(s, seq, ids, n, &want);
}

int g4_session_feed(g4_session *s, const int32_t *ids, int n, float *logits, int all_logits) {
    return g4_session_feed_seq(s, 0, ids, n, logits, all_logits);
}

int g4_session_feed_argmax_seq(g4_session *s, int seq, const int32_t *ids, int n, int32_t *next) {
    seq_request want = argmax_request(next);
    return feed_seq(s, seq, ids, n, &want);
}

int g4_session_feed_argmax(g4_session *s, const int32_t *ids, int n, int32_t *next) { return g4_session_feed_argmax_seq(s, 0, ids, n, next); }

int g4_session_feed_top(g4_session *s, const int32_t *ids, int n, int k, const int32_t *extra, int n_extra, int32_t *cand, float *vals,
                        int max_cand, float *bound, int *n_cand) {
    g4_candidates c = {.k = k, .extra = extra, .n_extra = n_extra, .ids = cand, .logits = vals, .cap = max_cand, .n = -1, .bound = *bound};
    seq_request want = {.kind = G4_OUTPUT_TOP, .top = &c};
    int rc = feed_seq(s, 0, ids, n, &want);
    *n_cand = c.n;
    *bound = c.bound;
    return rc;
}

int g4_session_last_logits(g4_session *s, float *logits) {
    if (s->n_kept == 0) return g4_fail("no token fed by g4_session_feed_top to give the logits of");
    g4_lm_head_kept_logits(s, s->n_kept - 1, logits);
    return 0;
}

/* One token of each of n distinct sequences, each row asking for `kind`: its logits (at logits +
 * t * vocab), its greedy token (into next[t]) or nothing. */
static int feed_batch(g4_session *s, const int *seqs, const int32_t *ids, int n, g4_output kind, float *logits, int32_t *next) {
    if (n <= 0 || n > CHUNK) return g4_fail("a batch step takes 1 to %d tokens, not %d", CHUNK, n);
    g4_batch_row rows[CHUNK];
    for (int t = 0; t < n; t++) {
        int q = seqs[t];
        if (q < 0 || q >= s->n_seq) return g4_fail("sequence %d does not exist (the session has %d)", q, s->n_seq);
        for (int u = 0; u < t; u++)
            if (seqs[u] == q) return g4_fail("sequence %d appears twice in one batch step", q);
        if (s->seq_pos[q] >= s->o.ctx) return g4_fail("sequence %d is at the end of its context of %d tokens (--ctx)", q, s->o.ctx);
        rows[t] = (g4_batch_row){.seq = q, .token = ids[t], .output = kind};
        if (kind == G4_OUTPUT_LOGITS) rows[t].logits = logits + (size_t)t * (size_t)s->m->cfg.vocab;
    }
    if (g4_decode(s, rows, n) != 0) return -1;
    for (int t = 0; kind == G4_OUTPUT_ARGMAX && t < n; t++) next[t] = rows[t].argmax;
    return 0;
}

int g4_session_feed_batch(g4_session *s, const int *seqs, const int32_t *ids, int n, float *logits) {
    return feed_batch(s, seqs, ids, n, logits ? G4_OUTPUT_LOGITS : G4_OUTPUT_NONE, logits, NULL);
}

int g4_session_feed_batch_argmax(g4_session *s, const int *seqs, const int32_t *ids, int n, int32_t *next) {
    return feed_batch(s, seqs, ids, n, next ? G4_OUTPUT_ARGMAX : G4_OUTPUT_NONE, NULL, next);
}
