/* The lm_head's outputs for a chunk's rows (model.md §7): every logit, the greedy token, or the
 * top-k candidates, each output a contiguous group of rows (session.h, chunk_plan). The greedy and
 * top-k rows go through the search of kernels/codes_argmax.c where it applies (a float input
 * against packed codes, the checkpoint's lm_head), which leaves most logits unfinished; each
 * sequence keeps its own state of which coarse image that search starts from. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "linear.h"
#include "lmhead.h"
#include "quant/dynamic.h"
#include "session.h"
#include "util/err.h"

/* Shortcut calls (greedy or top-k) that take the two digit rows after the one-row image left a
 * call unsettled. */
#define ARGMAX_HOLD 64

/* The shortcuts below apply to a float lm_head input against packed codes with one scale per row
 * (the mobile checkpoint's; their bounds rest on that scale), as the full path computes it (no
 * run-time input quantization, no activation scales). A BF16 or block-scaled lm_head computes
 * every logit. */
static int lm_head_shortcut_applies(const g4_session *s) {
    const g4_linear *L = &s->m->lm_head;
    return !s->o.lmhead_dynamic_q8 && L->w.bits != G4_WT_BF16 && L->w.block == 0 && !(s->q_linear && (L->s_in != 0 || L->s_out != 0));
}

/* The shortcut's scratch for `rows` rows, kept for the session (decode would otherwise map ~1 MB
 * a token); NULL when it cannot grow (the kernel then allocates its own). */
static void *lm_head_scratch(g4_session *s, int rows) {
    size_t need = g4_codes_f32_argmax_scratch(&s->m->lm_head.w, rows);
    if (need > s->argmax_bytes) {
        void *p = realloc(s->argmax_scratch, need);
        if (p) s->argmax_scratch = p, s->argmax_bytes = need;
    }
    return need <= s->argmax_bytes ? s->argmax_scratch : NULL;
}

static float lm_head_cap(const g4_session *s) { return s->m->cfg.final_softcap > 0 ? (float)s->m->cfg.final_softcap : 0; }

/* The one-row image is the cheaper coarse image; when it leaves a call unsettled (an outlier in
 * the activations can widen its bounds past any use), the sequence's next ARGMAX_HOLD calls take
 * the two digit rows, whose bounds stay tight, before the cheaper one is tried again. The state is
 * each sequence's own and a g4_decode call reads it once, at its start (decode.c, begin_call), so
 * that what a row gets never depends on the other rows of the batch. */
int g4_lm_head_coarse(const g4_session *s, int seq) { return s->argmax_hold[seq] > 0 ? 2 : 1; }

void g4_lm_head_coarse_done(g4_session *s, int seq, int coarse, int unsettled) {
    if (coarse == 2) s->argmax_hold[seq]--;
    else if (unsettled) s->argmax_hold[seq] = ARGMAX_HOLD;
}

/* The lm_head of rows [first, n) of xn into logits, softcapped. */
static void lm_head_logits(g4_session *s, int n, int first, float *logits) {
    const g4_model *m = s->m;
    const g4_linear *L = &m->lm_head;
    int H = m->cfg.hidden, V = m->cfg.vocab;
    if (s->o.lmhead_dynamic_q8 && !lm_head_static_input(s) && L->w.bits != G4_WT_BF16 && L->w.block == 0) {
        /* LiteRT's XNNPACK runs a float-input FC with int weights by quantizing each input row
         * at run time (qd8); reproduce it when asked (int8-arithmetic.md §3.3, tools/ref). A
         * static input scale takes precedence: the delegate then sees an int8 input and takes
         * its static path, as the engine does. The f32 output still meets point G4. */
        for (int t = first; t < n; t++)
            g4_dynq_matvec_packed(G4_DYNQ_XNN_QD8, s->xn + (size_t)t * H, (size_t)H, L->w.w, L->w.bits, (size_t)V, L->w.w_scale,
                                  s->xcodes, logits + (size_t)(t - first) * V);
        if (s->q_linear) g4_fake_quant(s, logits, (size_t)(n - first) * V, L->s_out);
    } else {
        g4_forward_linear(s, L, s->xn + (size_t)first * H, n - first, logits);
    }
    double cap = m->cfg.final_softcap;
    if (cap > 0) {
        float fc = (float)cap;
        s->k->softcap(logits, (size_t)(n - first) * V, fc);
    }
}

/* Whether a row of logits holds no NaN and no infinity (the shortcut hands such rows back). */
static int finite_row(const float *v, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

/* The greedy token of rows [first, n) of xn into next, as g4_argmax over their logits would pick
 * it. When the lm_head takes float rows against packed codes (the checkpoint's), most logits are
 * never finished (g4_codes_f32_argmax with the coarse image `coarse`); unsettled[t] marks the rows
 * it could not decide. Those, and every row of other lm_heads, go through the full logits in
 * s->logit_row; -1 for a row whose logits are not all finite (its argmax would be garbage). Returns
 * whether the shortcut ran. */
static int lm_head_argmax(g4_session *s, int n, int first, int coarse, int32_t *next, unsigned char *unsettled) {
    const g4_model *m = s->m;
    int H = m->cfg.hidden, V = m->cfg.vocab, ran = lm_head_shortcut_applies(s);
    for (int t = 0; t < n - first; t++) next[t] = -1;
    if (ran)
        g4_codes_f32_argmax(&m->lm_head.w, s->xn + (size_t)first * H, n - first, lm_head_cap(s), coarse, s->k->matmul_i8, next,
                            lm_head_scratch(s, n - first));
    for (int t = first; t < n; t++) {
        unsettled[t - first] = ran && next[t - first] < 0;
        if (next[t - first] >= 0) continue;
        lm_head_logits(s, t + 1, t, s->logit_row);
        next[t - first] = finite_row(s->logit_row, V) ? g4_argmax(s->logit_row, V) : -1;
    }
    return ran;
}

/* The candidates of xn row `row` for c (g4_candidates), through the same shortcut as
 * lm_head_argmax with the coarse image `coarse`; c->n = -1 when it does not apply or cannot tell.
 * Returns whether the shortcut ran. */
static int lm_head_top(g4_session *s, int row, int coarse, g4_candidates *c) {
    const g4_model *m = s->m;
    const g4_linear *L = &m->lm_head;
    c->n = -1;
    if (!lm_head_shortcut_applies(s) || c->k < 1 || c->k > L->w.out) return 0;
    c->n = g4_codes_f32_top(&L->w, s->xn + (size_t)row * m->cfg.hidden, lm_head_cap(s), c->k, c->extra, c->n_extra > 0 ? c->n_extra : 0,
                            coarse, s->k->matmul_i8, c->ids, c->logits, c->cap, &c->bound, lm_head_scratch(s, 1));
    return 1;
}

/* ---- the groups of a chunk ---- */

/* What the call's shortcut did for sequence seq: whether it ran, and whether it left a row unsettled
 * (end_call then updates the sequence's coarse image). */
static void note_shortcut(g4_session *s, int seq, int ran, int unsettled) {
    s->call_ran[seq] |= (unsigned char)ran;
    s->call_unsettled[seq] |= (unsigned char)unsettled;
}

/* The logits of the GROUP_LOGITS rows (chunk row t is row t - shift of xn): each run of rows whose
 * buffers follow one another in memory takes one pass over the lm_head. */
static void logits_rows(g4_session *s, const chunk_plan *p, int shift) {
    size_t V = (size_t)s->m->cfg.vocab;
    int end = p->start[GROUP_LOGITS + 1];
    for (int a = p->start[GROUP_LOGITS], b; a < end; a = b) {
        float *out = chunk_row(p, a)->logits;
        for (b = a + 1; b < end && chunk_row(p, b)->logits == out + (size_t)(b - a) * V; b++) {}
        lm_head_logits(s, b - shift, a - shift, out);
        if (s->trace) {
            int shape[1] = {(int)V};
            s->trace(s->trace_user, "logits", s->row_pos[a - shift], b - a, 1, shape, out);
        }
    }
}

/* The greedy tokens of one greedy group, all with the coarse image `coarse`. */
static void argmax_rows(g4_session *s, const chunk_plan *p, int shift, int group, int coarse) {
    int a = p->start[group], b = p->start[group + 1];
    if (a == b) return;
    int32_t next[CHUNK];
    unsigned char unsettled[CHUNK];
    int ran = lm_head_argmax(s, b - shift, a - shift, coarse, next, unsettled);
    for (int t = a; t < b; t++) {
        g4_batch_row *r = chunk_row(p, t);
        r->argmax = next[t - a];
        note_shortcut(s, r->seq, ran, unsettled[t - a]);
    }
}

/* The candidates of each GROUP_TOP row. */
static void top_rows(g4_session *s, const chunk_plan *p, int shift) {
    for (int t = p->start[GROUP_TOP]; t < p->start[GROUP_TOP + 1]; t++) {
        g4_batch_row *r = chunk_row(p, t);
        int ran = lm_head_top(s, t - shift, s->call_coarse[r->seq], r->top);
        note_shortcut(s, r->seq, ran, ran && r->top->n < 0);
    }
}

/* Keeps the final-normed rows of every output group (they come last), for g4_decode_logits and
 * g4_decode_hidden (decode.c, check_batch, made room for them). */
static void keep_hidden(g4_session *s, const chunk_plan *p, int shift) {
    size_t H = (size_t)s->m->cfg.hidden;
    for (int t = p->start[GROUP_LOGITS]; t < p->start[N_GROUPS]; t++) {
        memcpy(s->kept + (size_t)s->n_kept * H, s->xn + (size_t)(t - shift) * H, sizeof *s->kept * H);
        s->kept_row[s->n_kept++] = p->at[t];
    }
}

void g4_lm_head_outputs(g4_session *s, const chunk_plan *p, int shift) {
    logits_rows(s, p, shift);
    argmax_rows(s, p, shift, GROUP_ARGMAX_1, 1);
    argmax_rows(s, p, shift, GROUP_ARGMAX_2, 2);
    top_rows(s, p, shift);
    keep_hidden(s, p, shift);
}

/* The logits of kept row k, from its hidden state put back into xn. */
void g4_lm_head_kept_logits(g4_session *s, int k, float *logits) {
    size_t H = (size_t)s->m->cfg.hidden;
    memcpy(s->xn, s->kept + (size_t)k * H, sizeof *s->xn * H);
    lm_head_logits(s, 1, 0, logits);
}

static int kept_index(const g4_session *s, int row) {
    for (int k = 0; k < s->n_kept; k++)
        if (s->kept_row[k] == row) return k;
    return -1;
}

int g4_decode_logits(g4_session *s, int row, float *logits) {
    int k = kept_index(s, row);
    if (k < 0) return g4_fail("row %d of the last g4_decode call asked for no output", row);
    g4_lm_head_kept_logits(s, k, logits);
    return 0;
}

int g4_decode_hidden(const g4_session *s, int row, float *hidden) {
    int k = kept_index(s, row);
    if (k < 0) return g4_fail("row %d of the last g4_decode call asked for no output", row);
    size_t H = (size_t)s->m->cfg.hidden;
    memcpy(hidden, s->kept + (size_t)k * H, sizeof *hidden * H);
    return 0;
}

/* The first index of the largest value, NaNs never winning, except that a NaN at index 0 wins
 * (nothing compares greater than it): the plain loop's answer. Eight lanes (i mod 8) keep
 * independent running maxima so the compares do not wait on each other; ties between lanes go to
 * the smaller index. */
int g4_argmax(const float *logits, int n) {
    if (n <= 0 || isnan(logits[0])) return 0;
    float mv[8];
    int mi[8];
    for (int l = 0; l < 8; l++) mv[l] = -INFINITY, mi[l] = -1;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            if (logits[i + l] > mv[l]) mv[l] = logits[i + l], mi[l] = i + l;
    for (; i < n; i++)
        if (logits[i] > mv[i & 7]) mv[i & 7] = logits[i], mi[i & 7] = i;
    int best = -1;
    for (int l = 0; l < 8; l++)
        if (mi[l] >= 0 && (best < 0 || mv[l] > logits[best] || (mv[l] == logits[best] && mi[l] < best))) best = mi[l];
    return best < 0 ? 0 : best; /* every value -inf or NaN: index 0, as the plain loop */
}
