/* The linear step (linear.h): quantization of a linear's input, the matmul on the session's kernels
 * (float, or int8 codes x packed weight codes into int32 sums), and the integer linears'
 * requantization back to the output's int8 step (int8-arithmetic.md §3.1-§3.2) by the session's
 * rule, through per-row tables built once per session from each linear's scales. */
#include <stdlib.h>
#include <string.h>

#include "linear.h"
#include "quant/int8.h"
#include "rows.h"
#include "session.h"
#include "util/err.h"

/* ---- quantization points ---- */

void g4_fake_quant(const g4_session *s, float *x, size_t n, float scale) {
    if (scale == 0) return;
    g4_quantizer q;
    g4_quantizer_init(&q, scale, 0, s->round, s->qdiv); /* scales were validated at load */
    s->k->fake_quant(&q, x, n);
}

void g4_quantize_codes(const g4_session *s, const float *x, size_t n, float scale, int8_t *codes) {
    g4_quantizer q;
    g4_quantizer_init(&q, scale, 0, s->round, s->qdiv);
    s->k->quantize(&q, x, n, codes);
}

static void quantize_run(const rows_job *j, int t0, int t1) {
    size_t at = (size_t)t0 * j->width;
    g4_quantize_codes(j->s, j->x + at, (size_t)(t1 - t0) * j->width, j->f, j->codes + at);
}

/* quantize_codes over `rows` rows of `width`, split over the pool. */
static void quantize_rows(const g4_session *s, const float *x, int rows, int width, float scale, int8_t *codes) {
    rows_job j = {.run = quantize_run, .s = s, .x = x, .codes = codes, .width = width, .f = scale};
    for_rows(&j, rows, 2);
}

/* ---- the step ---- */

/* n rows of int32 sums of L's outputs [o0, o0 + width) into floats, each row of acc `width` long
 * and of y L->w.out long (y points at output o0 of its first row): requantized to the output
 * step, or only scaled when the output is not quantized. */
static void requant_apply(const g4_session *s, const g4_linear *L, const int32_t *acc, int n, int width, int o0, float *y) {
    int out = L->w.out;
    const g4_requant *rq = s->rq[L->id];
    const float *m32 = s->rq_f32[L->id];
    if (m32 && width == out) {
        s->k->requant_f32(acc, n, out, m32, L->s_out, y);
    } else if (m32) {
        for (int t = 0; t < n; t++) s->k->requant_f32(acc + (size_t)t * width, 1, width, m32 + o0, L->s_out, y + (size_t)t * out);
    } else if (rq) {
        for (int t = 0; t < n; t++)
            for (int o = 0; o < width; o++)
                y[(size_t)t * out + o] = g4_dequantize(g4_requantize(&rq[o0 + o], acc[(size_t)t * width + o]), L->s_out, 0);
    } else if (width == out) {
        s->k->acc_scale(acc, n, out, L->s_in, L->w.w_scale, y); /* s_out == 0: float output */
    } else {
        for (int t = 0; t < n; t++) s->k->acc_scale(acc + (size_t)t * width, 1, width, L->s_in, L->w.w_scale + o0, y + (size_t)t * out);
    }
}

/* Rows [t0, t1) of the slice of sums in s->acc (j->width outputs from j->o0) into j->y. */
static void requant_run(const rows_job *j, int t0, int t1) {
    const g4_linear *L = j->L;
    const int32_t *acc = j->s->acc + (size_t)t0 * j->width;
    requant_apply(j->s, L, acc, t1 - t0, j->width, j->o0, j->y + (size_t)t0 * L->w.out + j->o0);
}

/* y = dequant(requant(W codes)) for n rows whose input codes are already in `codes`. A layer
 * linear's n x out sums fit s->acc in one pass; a wider linear (a calibrated lm_head: vocab
 * outputs) runs in slices of output rows that fit, each slice's sums exact as in one pass. */
static void linear_from_codes(g4_session *s, const g4_linear *L, const int8_t *codes, int n, float *y) {
    s->rows_int[L->id] += n;
    int out = L->w.out, step = (int)(s->acc_len / (size_t)n); /* n <= CHUNK, so step >= the widest layer linear */
    for (int o0 = 0; o0 < out; o0 += step) {
        int width = out - o0 < step ? out - o0 : step;
        g4_qweight slice = g4_qweight_rows(&L->w, o0, width);
        s->k->matmul_i8(&slice, codes, n, s->acc);
        rows_job j = {.run = requant_run, .s = s, .L = L, .y = y, .width = width, .o0 = o0};
        for_rows(&j, n, 2);
    }
}

/* y = Q(W Q(x; s_in); s_out) for n rows: float, fake-quant or true integer, per the session. */
static void linear_body(g4_session *s, const g4_linear *L, const float *x, int n, float *y) {
    if (runs_int(s, L)) {
        quantize_rows(s, x, n, L->w.in, L->s_in, s->xcodes);
        linear_from_codes(s, L, s->xcodes, n, y);
        return;
    }
    if (s->q_linear && L->s_in != 0) {
        size_t len = (size_t)n * L->w.in;
        memcpy(s->xq, x, len * sizeof *x);
        g4_fake_quant(s, s->xq, len, L->s_in);
        x = s->xq;
    }
    s->rows_float[L->id] += n;
    s->k->matmul_f32(&L->w, x, n, y);
    if (s->q_linear) g4_fake_quant(s, y, (size_t)n * L->w.out, L->s_out);
}

/* The one linear step: linear_body, timed. */
void g4_forward_linear(g4_session *s, const g4_linear *L, const float *x, int n, float *y) {
    PROF_BEGIN(s);
    linear_body(s, L, x, n, y);
    PROF_END(s, G4_PROF_LINEAR);
}

void g4_linear_group(g4_session *s, const g4_linear *const *L, float *const *y, int count, const float *x, int n) {
    for (int i = 0; i < count; i++) {
        int share = i > 0 && runs_int(s, L[0]) && runs_int(s, L[i]) && memcmp(&L[i]->s_in, &L[0]->s_in, sizeof(float)) == 0;
        if (share) {
            PROF_BEGIN(s);
            linear_from_codes(s, L[i], s->xcodes, n, y[i]);
            PROF_END(s, G4_PROF_LINEAR);
        } else {
            g4_forward_linear(s, L[i], x, n, y[i]);
        }
    }
}

void g4_linear_float(const g4_session *s, const g4_linear *L, const float *x, int n, float *y) { s->k->matmul_f32(&L->w, x, n, y); }

/* ---- requantization tables ---- */

/* L's per-row requantization table, when it runs in integers with a quantized output. */
static int build_requant_table(g4_session *s, const g4_linear *L) {
    if (!runs_int(s, L) || L->s_out == 0) return 0;
    g4_requant *rq = malloc(sizeof *rq * (size_t)L->w.out);
    if (!rq) return g4_fail("out of memory for requantization tables");
    /* every rule is validated the same way; f32 then keeps only its multipliers (4 bytes a row) */
    int rc = g4_requant_init_rows(rq, (size_t)L->w.out, s->o.requant, L->s_in, L->w.w_scale, L->s_out, 0);
    if (rc == 0 && s->o.requant == G4_REQUANT_F32) {
        float *m32 = malloc(sizeof *m32 * (size_t)L->w.out);
        if (!m32) rc = g4_fail("out of memory for requantization tables");
        for (int o = 0; m32 && o < L->w.out; o++) m32[o] = rq[o].scale_f32;
        s->rq_f32[L->id] = m32;
        free(rq);
        rq = NULL;
    }
    s->rq[L->id] = rq;
    return rc != 0 ? g4_fail("%s: %s", L->name, g4_last_error()) : 0;
}

/* Per-row requantization tables for every linear that runs in integers: the layer linears, and
 * an lm_head with activation scales (points G3/G4; the published checkpoint's are 0, so its
 * lm_head stays float). */
int g4_requant_tables_build(g4_session *s) {
    const g4_model *m = s->m;
    s->rq = calloc((size_t)(s->n_linears > 0 ? s->n_linears : 1), sizeof *s->rq);
    s->rq_f32 = calloc((size_t)(s->n_linears > 0 ? s->n_linears : 1), sizeof *s->rq_f32);
    if (!s->rq || !s->rq_f32) return g4_fail("out of memory for requantization tables");
    if (s->o.requant < G4_REQUANT_F32 || s->o.requant > G4_REQUANT_TFL_REF) return g4_fail("unknown requant rule %d", (int)s->o.requant);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const g4_linear *lins[9];
        int count = g4_layer_linears(&m->layers[l], g4_layer_is_producer(m, l), lins);
        for (int i = 0; i < count; i++)
            if (build_requant_table(s, lins[i]) != 0) return -1;
    }
    return build_requant_table(s, &m->lm_head);
}

int g4_requant_table_add(g4_session *s, const g4_linear *L) {
    if (L->id < 0 || L->id >= s->n_linears) return g4_fail("%s: linear %d is outside the session's %d", L->name, L->id, s->n_linears);
    return build_requant_table(s, L);
}

void g4_requant_tables_free(g4_session *s) {
    for (int i = 0; s->rq && i < s->n_linears; i++) free(s->rq[i]);
    for (int i = 0; s->rq_f32 && i < s->n_linears; i++) free(s->rq_f32[i]);
    free(s->rq);
    free(s->rq_f32);
}
