/* `g4 inspect`: the model as loaded, with sizes and the bytes a decoded token touches. */
#include <stdio.h>
#include <string.h>

#include "model.h"

/* Bytes of a linear as a decoded token reads it: packed weight + its f32 scales (one per row, or
 * one per block, held as f32 whatever the file stores) + two f32 activation scales (the mobile
 * format's; the block-scaled one has none). */
static size_t linear_bytes(const g4_linear *L) {
    if (L->w.bits == G4_WT_BF16) return (size_t)L->w.out * L->w.row_bytes;
    size_t scales = (size_t)L->w.out * (size_t)g4_qweight_row_scales(&L->w) * 4;
    return (size_t)L->w.out * L->w.row_bytes + scales + (L->w.block ? 0 : 8);
}

static double linear_params(const g4_linear *L) { return (double)L->w.in * L->w.out; }

static void print_linear(FILE *f, const g4_linear *L, const char *short_name) {
    char blocks[32] = "";
    if (L->w.block) snprintf(blocks, sizeof blocks, " (a scale per %d)", L->w.block);
    fprintf(f, "    %-22s %2d-bit %6d -> %-6d %11zu B  act scales: in %s, out %s%s\n", short_name, L->w.bits, L->w.in,
            L->w.out, linear_bytes(L), L->s_in != 0 ? "on " : "off", L->s_out != 0 ? "on " : "off", blocks);
}

size_t g4_model_decode_bytes(const g4_model *m) {
    const g4_config *c = &m->cfg;
    size_t bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const g4_layer *L = &m->layers[l];
        int producer = L->kv_source == l;
        const g4_linear *lins[9];
        int n = g4_layer_linears(L, producer, lins);
        for (int i = 0; i < n; i++) bytes += linear_bytes(lins[i]);
        /* BF16 norms (5 of hidden size, q_norm, k_norm on producers) and the layer scalar */
        bytes += (5 * (size_t)c->hidden + (size_t)L->head_dim * (producer ? 2 : 1)) * 2 + 2;
    }
    bytes += linear_bytes(&m->pmp) + linear_bytes(&m->lm_head) + (size_t)(c->ple_dim + c->hidden) * 2;
    /* one gathered row (and its scales, as the file stores them) of each embedding table */
    const g4_qembedding *tables[2] = {&m->embed, &m->embed_ple};
    for (int t = 0; t < 2; t++)
        bytes += tables[t]->row_bytes + (tables[t]->scale ? (size_t)tables[t]->nblocks * g4_dtype_size(tables[t]->scale->dtype) : 0);
    return bytes;
}

void g4_model_describe(const g4_model *m, void *out) {
    FILE *f = out;
    const g4_config *c = &m->cfg;
    int H = c->hidden, P = c->ple_dim;
    fprintf(f, "model: %s\n", m->dir);
    fprintf(f, "files: %d safetensors file(s), %d tensors\n", m->st.n_files, m->st.n_tensors);
    fprintf(f, "text decoder: hidden %d, %d layers, %d heads, vocab %d, PLE %d per layer, sliding window %d, "
               "%d KV-shared layers, final softcap %g\n",
            H, c->n_layers, c->n_heads, c->vocab, P, c->sliding_window, c->n_kv_shared, c->final_softcap);
    double params = 0;
    size_t kv_f32 = 0, kv_int8 = 0;
    fprintf(f, "layers:\n");
    for (int l = 0; l < c->n_layers; l++) {
        const g4_layer *L = &m->layers[l];
        int producer = L->kv_source == l;
        fprintf(f, "  layer %2d: %-7s head_dim %3d  KV %s %2d  MLP %5d (%d-bit)  layer_scalar %g\n", l,
                L->type == G4_LAYER_FULL ? "full" : "sliding", L->head_dim, producer ? "own   " : "from  ", L->kv_source,
                L->mlp_dim, L->gate.w.bits, L->layer_scalar);
        for (int i = 0; i < G4_LAYER_LINEARS; i++) {
            const g4_module *md = &g4_layer_modules[i];
            if (md->part == G4_PART_PRODUCER && !producer) continue;
            const g4_linear *lin = (const g4_linear *)((const char *)L + md->field);
            print_linear(f, lin, md->name);
            params += linear_params(lin);
        }
        params += 5.0 * H + L->head_dim * (producer ? 2 : 1) + 1;
        if (producer) {
            size_t width = (size_t)L->n_kv_heads * L->head_dim;
            kv_f32 += 2 * width * 4;
            /* a cache scale of 0 means that half stays float */
            kv_int8 += width * (L->k_cache_scale != 0 ? 1 : 4) + width * (L->v_cache_scale != 0 ? 1 : 4);
        }
    }
    fprintf(f, "global:\n");
    fprintf(f, "    %-22s %2d-bit %6d x %-6d (gathered: one row per token)\n", "embed_tokens", m->embed.bits, m->embed.rows,
            m->embed.cols);
    fprintf(f, "    %-22s %2d-bit %6d x %-6d (gathered: one row per token, %d scale blocks)\n", "embed_tokens_per_layer",
            m->embed_ple.bits, m->embed_ple.rows, m->embed_ple.cols, m->embed_ple.nblocks);
    print_linear(f, &m->pmp, "per_layer_model_proj");
    print_linear(f, &m->lm_head, "lm_head");
    params += (double)m->embed.rows * m->embed.cols + (double)m->embed_ple.rows * m->embed_ple.cols;
    params += linear_params(&m->pmp) + P + H;
    if (m->lm_head.w.w != m->embed.codes) params += linear_params(&m->lm_head);
    size_t disk = 0, text = 0;
    for (int i = 0; i < m->st.n_files; i++) disk += m->st.maps[i].size;
    for (int i = 0; i < m->st.n_tensors; i++) {
        const char *n = m->st.tensors[i].name;
        if (!strncmp(n, m->prefix, strlen(m->prefix)) || !strncmp(n, "lm_head.", 8)) text += m->st.tensors[i].nbytes;
    }
    fprintf(f, "totals:\n");
    fprintf(f, "  parameters (text decoder, live): %.0f (%.2f M)\n", params, params / 1e6);
    fprintf(f, "  bytes on disk: %zu (text tensors %zu)\n", disk, text);
    fprintf(f, "  bytes touched per decoded token: %zu (%.2f MB), plus the KV cache\n", g4_model_decode_bytes(m),
            g4_model_decode_bytes(m) / 1e6);
    if (kv_int8 == kv_f32) fprintf(f, "  KV cache per token: %zu B (f32: the checkpoint has no KV-cache scales)\n", kv_f32);
    else fprintf(f, "  KV cache per token: %zu B with --kv int8 (default), %zu B with --kv f32\n", kv_int8, kv_f32);
    fprintf(f, "  stop ids:");
    for (int i = 0; i < c->n_stop_ids; i++) fprintf(f, " %d", c->stop_ids[i]);
    fprintf(f, "\n");
}
