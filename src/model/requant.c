/* The integer linears' requantization (int mode): per output row, the int32 sum of int8 codes x
 * weight codes back to the output's int8 step (int8-arithmetic.md §3.1-§3.2), by the
 * session's rule. The tables are built once per session, from each linear's scales. */
#include <stdlib.h>

#include "session.h"
#include "util/err.h"

/* n rows of int32 sums of L's outputs [o0, o0 + width) into floats, each row of acc `width` long
 * and of y L->w.out long (y points at output o0 of its first row): requantized to the output
 * step, or only scaled when the output is not quantized. */
void g4_requant_apply(const g4_session *s, const g4_linear *L, const int32_t *acc, int n, int width, int o0, float *y) {
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
