/* g4 synth and the streaming safetensors writer.
 * - writer: round trip through the engine's reader (dtypes, shapes, alignment, header padding);
 *   bad paths and bad declarations fail with a message naming the file and leave nothing behind.
 * - tiny preset: the config round-trips to the shared tiny-mobile fixture's, the tensor
 *   manifest matches the fixture's text tensors name for name (minus the consumers' k_norm,
 *   which the real E2B does not ship), the values have the documented properties, the model
 *   loads and runs, and the output is a function of the seed.
 * - E2B: the config gives checkpoint.md §4's bit widths; the synthetic tokenizer is valid BPE
 *   with the control tokens at their real ids. With G4_TEST_E2B=1 the full-size checkpoint is
 *   written and loaded and `g4 inspect`'s totals are checked against model.md §11.
 * - e2b-drafter: config.json and the tensor manifest match google/gemma-4-E2B-it-assistant's
 *   (the published config as a public MTP integration guide summarizes it; tensor names and
 *   shapes as transformers 5.17's Gemma4AssistantForCausalLM saves them), token_ordering is a
 *   permutation, and the bytes are a function of the seed. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "format/config.h"
#include "format/safetensors_write.h"
#include "model/synth.h"
#include "util/err.h"
#include "model/feed.h"

static char base_tmp[256];

/* Paths live in a ring of buffers; callers that keep one across many calls copy it. */
static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", base_tmp, name);
    return buf[k];
}

static const char *in_dir(const char *dir, const char *file) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, file);
    return buf[k];
}

/* Mapped, not read: checkpoints are past g4_read_file's bound for small files. */
static int same_file(const char *a, const char *b) {
    g4_mapped_file x, y;
    if (g4_map_file(a, &x) != 0) return 0;
    if (g4_map_file(b, &y) != 0) {
        g4_unmap_file(&x);
        return 0;
    }
    int same = x.size == y.size && (x.size == 0 || memcmp(x.data, y.data, x.size) == 0);
    g4_unmap_file(&x);
    g4_unmap_file(&y);
    return same;
}

/* ---- writer ---- */

static uint8_t pattern(int index, uint64_t pos) { return (uint8_t)(index * 31 + pos * 7 + (pos >> 8)); }

static int fill_pattern(void *user, int index, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    (void)t;
    int *calls = user;
    (*calls)++;
    for (size_t i = 0; i < n; i++) buf[i] = pattern(index, off + i);
    return 0;
}

static int fill_fail(void *user, int index, const g4_stw_tensor *t, uint64_t off, uint8_t *buf, size_t n) {
    (void)user, (void)index, (void)off, (void)buf, (void)n;
    return g4_fail("generator refused %s", t->name);
}

static void test_writer_roundtrip(void) {
    g4_stw w;
    g4_stw_init(&w);
    /* mixed element sizes and odd byte counts: the layout must still align every tensor */
    g4_stw_add(&w, "b.u8", G4_DT_U8, 1, (int64_t[]){5});
    g4_stw_add(&w, "a.f32", G4_DT_F32, 2, (int64_t[]){2, 3});
    g4_stw_add(&w, "c.bf16_scalar", G4_DT_BF16, 0, NULL);
    g4_stw_add(&w, "d.empty", G4_DT_I8, 1, (int64_t[]){0});
    g4_stw_add(&w, "e.f64_3d", G4_DT_F64, 3, (int64_t[]){1, 1, 3});
    /* larger than one chunk, so the callback is called several times for it */
    g4_stw_add(&w, "f.big", G4_DT_U8, 2, (int64_t[]){3, (int64_t)G4_STW_CHUNK / 2 + 1});
    const char *path = tmp_path("roundtrip.safetensors");
    int calls = 0;
    uint64_t size = 0;
    CHECK(g4_stw_write(&w, path, fill_pattern, &calls, &size) == 0, "%s", g4_last_error());
    CHECK(calls >= 3, "%d fill calls", calls);
    g4_safetensors st;
    int ok = g4_st_open_file(&st, path) == 0;
    CHECK(ok, "%s", g4_last_error());
    if (ok) {
        CHECK_EQ_INT(st.n_tensors, w.n);
        CHECK_EQ_INT(st.maps[0].size, size);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = hlen << 8 | st.maps[0].data[i];
        CHECK(hlen % 8 == 0, "header length %llu is not a multiple of 8", (unsigned long long)hlen);
        CHECK(st.maps[0].data[8 + hlen - 1] == '}' || st.maps[0].data[8 + hlen - 1] == ' ', "header end");
        for (int i = 0; i < w.n; i++) {
            const g4_tensor *t = g4_st_find(&st, w.t[i].name);
            CHECK(t != NULL, "%s missing", w.t[i].name);
            if (!t) continue;
            CHECK_EQ_INT(t->dtype, w.t[i].dtype);
            CHECK_EQ_INT(t->ndim, w.t[i].ndim);
            for (int d = 0; d < t->ndim; d++) CHECK_EQ_INT(t->shape[d], w.t[i].shape[d]);
            CHECK(((uintptr_t)(t->data - st.maps[0].data)) % g4_dtype_size(t->dtype) == 0, "%s not aligned", t->name);
            int bad = 0;
            for (size_t b = 0; b < t->nbytes; b++) bad += t->data[b] != pattern(i, b);
            CHECK(bad == 0, "%s: %d bytes differ", t->name, bad);
        }
        g4_st_close(&st);
    }
    g4_stw_free(&w);
}

/* The write fails, the message names `path` (and `also` when given) and no file is left. */
static void expect_write_fails(g4_stw *w, const char *path, g4_stw_fill_fn fill, const char *also) {
    int calls = 0;
    g4_clear_error();
    CHECK(g4_stw_write(w, path, fill, &calls, NULL) != 0, "%s: write succeeded", path);
    const char *e = g4_last_error();
    CHECK(strstr(e, path) != NULL, "message does not name %s: %s", path, e);
    if (also) CHECK(strstr(e, also) != NULL, "message does not mention %s: %s", also, e);
    CHECK(!strchr(e, '\n'), "message is not one line: %s", e);
    char partial[600];
    snprintf(partial, sizeof partial, "%s.partial", path);
    CHECK(!g4_file_exists(partial), "%s left behind", partial);
}

static void test_writer_rejects(void) {
    g4_stw w;
    g4_stw_init(&w);
    g4_stw_add(&w, "x", G4_DT_F32, 1, (int64_t[]){4});
    expect_write_fails(&w, "/nonexistent-g4-dir/sub/model.safetensors", fill_pattern, "cannot create");
    const char *dir = tmp_path("is_a_dir");
    mkdir(dir, 0777);
    expect_write_fails(&w, dir, fill_pattern, "cannot create");
    const char *p = tmp_path("bad.safetensors");
    expect_write_fails(&w, p, fill_fail, "generator refused x");
    CHECK(!g4_file_exists(p), "%s exists after a failed write", p);
    g4_stw_add(&w, "x", G4_DT_U8, 1, (int64_t[]){4});
    expect_write_fails(&w, p, fill_pattern, "declared twice");
    g4_stw_free(&w);

    g4_stw_init(&w);
    g4_stw_add(&w, "__metadata__", G4_DT_U8, 1, (int64_t[]){1});
    expect_write_fails(&w, p, fill_pattern, "reserved");
    g4_stw_free(&w);
    g4_stw_init(&w);
    g4_stw_add(&w, "", G4_DT_U8, 1, (int64_t[]){1});
    expect_write_fails(&w, p, fill_pattern, "empty name");
    g4_stw_free(&w);
    g4_stw_init(&w);
    g4_stw_add(&w, "neg", G4_DT_U8, 2, (int64_t[]){2, -1});
    expect_write_fails(&w, p, fill_pattern, "neg");
    g4_stw_free(&w);
    g4_clear_error();
    CHECK(g4_stw_write(&w, "", fill_pattern, NULL, NULL) != 0, "empty path accepted");
}

/* ---- config ---- */

static void compare_configs(const g4_config *a, const g4_config *b) {
    CHECK_EQ_INT(a->hidden, b->hidden);
    CHECK_EQ_INT(a->n_layers, b->n_layers);
    CHECK_EQ_INT(a->n_heads, b->n_heads);
    CHECK_EQ_INT(a->n_kv_heads, b->n_kv_heads);
    CHECK_EQ_INT(a->n_global_kv_heads, b->n_global_kv_heads);
    CHECK_EQ_INT(a->head_dim, b->head_dim);
    CHECK_EQ_INT(a->global_head_dim, b->global_head_dim);
    CHECK_EQ_INT(a->intermediate, b->intermediate);
    CHECK_EQ_INT(a->double_wide_mlp, b->double_wide_mlp);
    CHECK_EQ_INT(a->n_kv_shared, b->n_kv_shared);
    CHECK_EQ_INT(a->ple_dim, b->ple_dim);
    CHECK_EQ_INT(a->vocab, b->vocab);
    CHECK_EQ_INT(a->vocab_ple, b->vocab_ple);
    CHECK_EQ_INT(a->sliding_window, b->sliding_window);
    CHECK_EQ_INT(a->max_positions, b->max_positions);
    CHECK(a->rms_eps == b->rms_eps, "rms_eps %g vs %g", a->rms_eps, b->rms_eps);
    CHECK(a->final_softcap == b->final_softcap, "softcap %g vs %g", a->final_softcap, b->final_softcap);
    CHECK_EQ_INT(a->tie_word_embeddings, b->tie_word_embeddings);
    for (int i = 0; i < a->n_layers && i < b->n_layers; i++) CHECK_EQ_INT(a->layer_types[i], b->layer_types[i]);
    for (int t = 0; t < 2; t++) {
        CHECK(a->rope[t].theta == b->rope[t].theta, "rope %d theta", t);
        CHECK(a->rope[t].partial_rotary_factor == b->rope[t].partial_rotary_factor, "rope %d factor", t);
        CHECK_EQ_INT(a->rope[t].proportional, b->rope[t].proportional);
    }
    CHECK_EQ_INT(a->bos_id, b->bos_id);
    CHECK_EQ_INT(a->pad_id, b->pad_id);
    const g4_quant_config *qa = &a->quant, *qb = &b->quant;
    CHECK_EQ_INT(qa->num_bits, qb->num_bits);
    CHECK_EQ_INT(qa->quantize_embeddings, qb->quantize_embeddings);
    CHECK_EQ_INT(qa->n_patterns, qb->n_patterns);
    for (int i = 0; i < qa->n_patterns && i < qb->n_patterns; i++) {
        CHECK_STREQ(qa->patterns[i].pattern, qb->patterns[i].pattern);
        CHECK_EQ_INT(qa->patterns[i].bits, qb->patterns[i].bits);
    }
    CHECK_EQ_INT(qa->n_not_convert, qb->n_not_convert);
    for (int i = 0; i < qa->n_not_convert && i < qb->n_not_convert; i++) CHECK_STREQ(qa->not_convert[i], qb->not_convert[i]);
}

/* module_quant_configs keys appear in sorted order (HF sort_keys), which decides precedence:
 * E2B's 11 patterns, E4B's 10 (one MLP rule). */
static void check_sorted_patterns(const char *json_text, const char *what) {
    int want = strcmp(what, "e4b") ? 11 : 10;
    cJSON *r = cJSON_Parse(json_text);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "quantization_config"),
                                                      "module_quant_configs");
    CHECK(cJSON_IsObject(m), "%s: no module_quant_configs", what);
    int n = 0;
    for (const cJSON *e = m ? m->child : NULL; e; e = e->next, n++)
        if (e->next) CHECK(strcmp(e->string, e->next->string) < 0, "%s: %s listed before %s", what, e->string, e->next->string);
    CHECK_EQ_INT(n, want);
    const cJSON *nc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "quantization_config"),
                                                       "modules_to_not_convert");
    CHECK_EQ_INT(cJSON_GetArraySize(nc), 7);
    cJSON_Delete(r);
}

static void test_e2b_config(void) {
    char *text = g4_synth_config_json("e2b");
    CHECK(text != NULL, "%s", g4_last_error());
    if (!text) return;
    check_sorted_patterns(text, "e2b");
    g4_config c;
    int ok = g4_config_parse(&c, text, "e2b/config.json") == 0;
    CHECK(ok, "%s", g4_last_error());
    free(text);
    if (!ok) return;
    /* model.md §1 */
    CHECK(c.hidden == 1536 && c.n_layers == 35 && c.n_heads == 8 && c.n_kv_heads == 1 && c.n_global_kv_heads == 1, "shape");
    CHECK(c.head_dim == 256 && c.global_head_dim == 512 && c.intermediate == 6144 && c.double_wide_mlp, "dims");
    CHECK(c.n_kv_shared == 20 && c.ple_dim == 256 && c.vocab == 262144 && c.vocab_ple == 262144, "kv/ple/vocab");
    CHECK(c.sliding_window == 512 && c.max_positions == 131072 && c.rms_eps == 1e-6 && c.final_softcap == 30.0, "misc");
    CHECK(!c.tie_word_embeddings && c.bos_id == 2 && c.pad_id == 0, "tie/bos/pad");
    for (int l = 0; l < 35; l++) CHECK_EQ_INT(c.layer_types[l], l % 5 == 4 ? G4_LAYER_FULL : G4_LAYER_SLIDING);
    CHECK(c.rope[G4_LAYER_FULL].proportional && c.rope[G4_LAYER_FULL].partial_rotary_factor == 0.25 &&
              c.rope[G4_LAYER_FULL].theta == 1e6 && c.rope[G4_LAYER_SLIDING].theta == 1e4 && !c.rope[G4_LAYER_SLIDING].proportional,
          "rope");
    /* checkpoint.md §4's bit-width table, through the engine's regex resolution */
    char mod[128];
    for (int l = 0; l < 35; l++) {
        const char *sfx[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "per_layer_input_gate", "per_layer_projection"};
        int want[] = {4, 4, 4, 4, l < 15 ? 4 : 2, l < 15 ? 4 : 2, l < 15 ? 4 : 2, 8, 8};
        for (int i = 0; i < 9; i++) {
            snprintf(mod, sizeof mod, "model.language_model.layers.%d.%s", l, sfx[i]);
            CHECK(g4_config_module_bits(&c, mod) == want[i], "%s: %d bits", mod, g4_config_module_bits(&c, mod));
        }
    }
    CHECK_EQ_INT(g4_config_module_bits(&c, "lm_head"), 2);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.embed_tokens"), 2);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.embed_tokens_per_layer"), 4);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.per_layer_model_projection"), 0);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear"), 8);
    g4_config_free(&c);
    g4_clear_error();
    CHECK(g4_synth_config_json("e9b") == NULL && strstr(g4_last_error(), "e9b"), "unknown preset: %s", g4_last_error());
}

/* E4B mobile (the preset table's sources): 42 layers of (5 sliding + 1 full) x 7, 2 KV heads, 18
 * KV-shared layers with no double-wide MLP, every MLP and attention linear 4-bit, the per-layer
 * table and embed_tokens 2-bit, an untied 2-bit lm_head. */
static void test_e4b_config(void) {
    char *text = g4_synth_config_json("e4b");
    CHECK(text != NULL, "%s", g4_last_error());
    if (!text) return;
    check_sorted_patterns(text, "e4b");
    g4_config c;
    int ok = g4_config_parse(&c, text, "e4b/config.json") == 0;
    CHECK(ok, "%s", g4_last_error());
    free(text);
    if (!ok) return;
    CHECK(c.hidden == 2560 && c.n_layers == 42 && c.intermediate == 10240 && c.n_kv_heads == 2 && c.n_global_kv_heads == 2 &&
              c.head_dim == 256 && c.global_head_dim == 512 && c.n_kv_shared == 18 && !c.double_wide_mlp && !c.tie_word_embeddings,
          "e4b shape");
    int full = 0;
    for (int l = 0; l < c.n_layers; l++) full += c.layer_types[l] == G4_LAYER_FULL && l % 6 == 5;
    CHECK_EQ_INT(full, 7);
    CHECK_EQ_INT(c.layer_types[41], G4_LAYER_FULL);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.0.mlp.gate_proj"), 4);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.30.mlp.down_proj"), 4);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.30.self_attn.q_proj"), 4);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.3.per_layer_projection"), 8);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.embed_tokens_per_layer"), 2);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.embed_tokens"), 2);
    CHECK_EQ_INT(g4_config_module_bits(&c, "lm_head"), 2);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.per_layer_model_projection"), 0);
    g4_config_free(&c);
}

/* The q4_0 layout of E2B: g4 quantize's quantization_config (4-bit blocks of 32, Q8_0
 * embeddings), the lm_head tied to embed_tokens. */
static void test_q4_0_config(void) {
    char *text = g4_synth_config_json("e2b-q4_0");
    CHECK(text != NULL, "%s", g4_last_error());
    if (!text) return;
    g4_config c;
    int ok = g4_config_parse(&c, text, "e2b-q4_0/config.json") == 0;
    CHECK(ok, "%s", g4_last_error());
    free(text);
    if (!ok) return;
    CHECK(c.hidden == 1536 && c.n_layers == 35 && c.tie_word_embeddings && c.quant.block_size == 32, "e2b-q4_0 shape");
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.20.mlp.down_proj"), 4);
    CHECK_EQ_INT(g4_config_module_block(&c, "model.language_model.layers.20.mlp.down_proj"), 32);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.embed_tokens"), 8);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.embed_tokens_per_layer"), 8);
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.per_layer_model_projection"), 0);
    g4_config_free(&c);
}

/* ---- tokenizer ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void check_tokenizer(const char *path, int vocab) {
    char *text;
    if (g4_read_file(path, &text, NULL) != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    cJSON *r = cJSON_Parse(text);
    free(text);
    CHECK(cJSON_IsObject(r), "%s: not JSON", path);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(r, "model");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    CHECK(cJSON_IsObject(v) && cJSON_IsArray(merges), "%s: model.vocab / model.merges", path);
    CHECK_STREQ(cJSON_GetObjectItemCaseSensitive(model, "type")->valuestring, "BPE");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")), "byte_fallback");
    if (!cJSON_IsObject(v) || !cJSON_IsArray(merges)) {
        cJSON_Delete(r);
        return;
    }
    CHECK_EQ_INT(cJSON_GetArraySize(v), vocab);
    /* every id exactly once, every string exactly once */
    char *seen = calloc((size_t)vocab, 1);
    const char **keys = malloc(sizeof *keys * (size_t)vocab);
    const char **by_id = calloc((size_t)vocab, sizeof *by_id);
    int n = 0, bad_ids = 0;
    for (const cJSON *e = v->child; e; e = e->next) {
        int id = (int)e->valuedouble;
        if (id < 0 || id >= vocab || seen[id]) bad_ids++;
        else {
            seen[id] = 1;
            by_id[id] = e->string;
        }
        if (n < vocab) keys[n++] = e->string;
    }
    CHECK(bad_ids == 0, "%d duplicate or out-of-range ids", bad_ids);
    qsort(keys, (size_t)n, sizeof *keys, cmp_str);
    int dups = 0;
    for (int i = 1; i < n; i++) dups += strcmp(keys[i - 1], keys[i]) == 0;
    CHECK(dups == 0, "%d duplicate vocab strings", dups);
    /* control tokens at their real ids (model.md §10), bytes at 238..493 */
    const struct {
        int id;
        const char *s;
    } want[] = {{0, "<pad>"},   {1, "<eos>"},          {2, "<bos>"},        {3, "<unk>"},      {46, "<|tool>"},
                {50, "<|tool_response>"}, {52, "<|\"|>"}, {98, "<|think|>"}, {100, "<|channel>"}, {101, "<channel|>"},
                {105, "<|turn>"}, {106, "<turn|>"},       {107, "\n"},         {108, "\n\n"},     {138, "\xE2\x96\x81\xE2\x96\x81"},
                {238, "<0x00>"},  {303, "<0x41>"},        {493, "<0xFF>"},     {255999, "<|image>"}, {256000, "<|audio>"},
                {258880, "<|image|>"}, {258881, "<|audio|>"}, {258882, "<image|>"}, {258883, "<audio|>"}, {258884, "<|video|>"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (want[i].id < vocab) CHECK(by_id[want[i].id] && strcmp(by_id[want[i].id], want[i].s) == 0, "id %d", want[i].id);
    /* merges: both parts and the result in the vocabulary */
    int bad_merges = 0, n_merges = 0;
    for (const cJSON *m = merges->child; m; m = m->next, n_merges++) {
        const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
        if (!cJSON_IsString(a) || !cJSON_IsString(b) || cJSON_GetArraySize(m) != 2) {
            bad_merges++;
            continue;
        }
        char joined[64];
        snprintf(joined, sizeof joined, "%s%s", a->valuestring, b->valuestring);
        const char *ka = a->valuestring, *kb = b->valuestring, *kj = joined;
        bad_merges += !bsearch(&ka, keys, (size_t)n, sizeof *keys, cmp_str) || !bsearch(&kb, keys, (size_t)n, sizeof *keys, cmp_str) ||
                       !bsearch(&kj, keys, (size_t)n, sizeof *keys, cmp_str);
    }
    CHECK(bad_merges == 0, "%d invalid merges of %d", bad_merges, n_merges);
    CHECK(n_merges > 0, "no merges");
    /* added tokens agree with the vocabulary */
    int bad_added = 0;
    for (const cJSON *a = cJSON_GetObjectItemCaseSensitive(r, "added_tokens")->child; a; a = a->next) {
        int id = (int)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        const char *s = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
        bad_added += id < 0 || id >= vocab || !by_id[id] || strcmp(by_id[id], s) != 0;
    }
    CHECK(bad_added == 0, "%d added tokens disagree with the vocab", bad_added);
    free(seen);
    free(keys);
    free(by_id);
    cJSON_Delete(r);
}

/* ---- tiny preset ---- */

static const g4_tensor *need(const g4_safetensors *st, const char *name) {
    const g4_tensor *t = g4_st_find(st, name);
    CHECK(t != NULL, "%s missing", name);
    return t;
}

static int is_text(const char *n) { return !strncmp(n, "model.language_model.", 21) || !strncmp(n, "lm_head.", 8); }

/* A consumer layer's k_norm: the tiny fixture ships it, the real E2B (and synth) does not. */
static int consumer_k_norm(const char *name, int first_consumer) {
    int l;
    char rest[64];
    return sscanf(name, "model.language_model.layers.%d.%63s", &l, rest) == 2 && l >= first_consumer &&
           strcmp(rest, "self_attn.k_norm.weight") == 0;
}

static void check_manifest_vs_fixture(const char *dir) {
    g4_safetensors fx, sy;
    char fx_dir[4096];
    snprintf(fx_dir, sizeof fx_dir, "%s", tiny_dir());
    if (g4_st_open_dir(&fx, fx_dir) != 0) {
        CHECK(0, "the shared tiny fixture, which the manifest is compared with: %s", g4_last_error());
        return;
    }
    if (g4_st_open_dir(&sy, dir) != 0) {
        CHECK(0, "%s", g4_last_error());
        g4_st_close(&fx);
        return;
    }
    int n_text = 0;
    for (int i = 0; i < fx.n_tensors; i++) {
        const g4_tensor *f = &fx.tensors[i];
        if (!is_text(f->name)) continue;
        const g4_tensor *s = g4_st_find(&sy, f->name);
        if (consumer_k_norm(f->name, 6)) {
            CHECK(s == NULL, "%s should not be written", f->name);
            continue;
        }
        CHECK(s != NULL, "%s missing", f->name);
        if (!s) continue;
        n_text++;
        CHECK(s->dtype == f->dtype && s->ndim == f->ndim && s->shape[0] == f->shape[0] && s->shape[1] == f->shape[1],
              "%s: %s vs fixture %s", f->name, g4_dtype_name(s->dtype), g4_dtype_name(f->dtype));
    }
    int sy_text = 0;
    for (int i = 0; i < sy.n_tensors; i++) sy_text += is_text(sy.tensors[i].name);
    CHECK_EQ_INT(sy_text, n_text);
    CHECK_EQ_INT(sy_text, 11 + 6 * 46 + 4 * 45); /* checkpoint.md §7's count rule */
    g4_st_close(&fx);
    g4_st_close(&sy);
}

static float f32_at(const g4_tensor *t, int64_t i) { return g4_tensor_float(t, i); }

static void check_values(const char *dir) {
    g4_safetensors st;
    if (g4_st_open_dir(&st, dir) != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    const g4_tensor *ec = need(&st, "model.language_model.embed_tokens.embedding_quantized");
    const g4_tensor *es = need(&st, "model.language_model.embed_tokens.embedding_scale");
    const g4_tensor *lw = need(&st, "lm_head.weight"), *ls = need(&st, "lm_head.weight_scale");
    if (ec && lw) CHECK(ec->nbytes == lw->nbytes && !memcmp(ec->data, lw->data, ec->nbytes), "lm_head.weight != embed codes");
    if (es && ls) CHECK(es->nbytes == ls->nbytes && !memcmp(es->data, ls->data, es->nbytes), "lm_head scale != embed scale");
    const g4_tensor *li = need(&st, "lm_head.input_activation_scale"), *lo = need(&st, "lm_head.output_activation_scale");
    if (li && lo) CHECK(f32_at(li, 0) == 0 && f32_at(lo, 0) == 0 && li->ndim == 0, "lm_head activation scales");
    char name[192];
    for (int l = 0; l < 10; l++) {
#define T(s) (snprintf(name, sizeof name, "model.language_model.layers.%d.%s", l, s), need(&st, name))
        const g4_tensor *v = T("self_attn.v_cache_scale"), *k = T("self_attn.k_cache_scale");
        if (v) CHECK(f32_at(v, 0) == (float)(6.0 / 127.0) && v->ndim == 0, "layer %d v_cache_scale %g", l, f32_at(v, 0));
        if (k) CHECK(f32_at(k, 0) > 0.005f && f32_at(k, 0) < 0.05f, "layer %d k_cache_scale %g", l, f32_at(k, 0));
        const g4_tensor *q = T("self_attn.q_proj.input_activation_scale"), *kk = T("self_attn.k_proj.input_activation_scale"),
                        *vv = T("self_attn.v_proj.input_activation_scale");
        if (q && kk && vv) CHECK(!memcmp(q->data, kk->data, 4) && !memcmp(q->data, vv->data, 4), "layer %d q/k/v s_in", l);
        const g4_tensor *g = T("mlp.gate_proj.input_activation_scale"), *u = T("mlp.up_proj.input_activation_scale");
        if (g && u) CHECK(!memcmp(g->data, u->data, 4), "layer %d gate/up s_in", l);
        const g4_tensor *ln = T("input_layernorm.weight"), *sc = T("layer_scalar");
        if (ln)
            for (int i = 0; i < 64; i++) CHECK(f32_at(ln, i) > 0.85f && f32_at(ln, i) < 1.15f, "norm %g", f32_at(ln, i));
        if (sc) CHECK(f32_at(sc, 0) >= 0.89f && f32_at(sc, 0) <= 1.0f && sc->dtype == G4_DT_BF16, "layer_scalar %g", f32_at(sc, 0));
#undef T
    }
    /* every activation scale of the text model in (0, 0.1], except lm_head's zeros */
    int n_act = 0, bad = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const g4_tensor *t = &st.tensors[i];
        if (!is_text(t->name) || !strstr(t->name, "_activation_scale")) continue;
        n_act++;
        float s = f32_at(t, 0);
        bad += strncmp(t->name, "lm_head.", 8) ? !(s > 0.005f && s <= 0.1f) : s != 0;
    }
    CHECK_EQ_INT(n_act, 10 * 9 * 2 + 2);
    CHECK(bad == 0, "%d activation scales out of range", bad);
    /* the dummy towers are there, for the loader to skip */
    CHECK(g4_st_find(&st, "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight") != NULL, "dummy tower");
    g4_st_close(&st);
}

static void run_tokens(const g4_model *m, g4_act_mode act) {
    g4_options o;
    g4_options_default(&o);
    o.act = act;
    o.ctx = 32;
    g4_session *s = g4_session_new(m, &o);
    CHECK(s != NULL, "%s", g4_last_error());
    if (!s) return;
    int V = g4_model_vocab_size(m);
    float *logits = malloc(sizeof *logits * (size_t)V);
    int32_t ids[6] = {2, 105, 236, 107, 300, 400};
    CHECK(g4_session_feed(s, ids, 6, logits, 0) == 0, "%s", g4_last_error());
    for (int step = 0; step < 4; step++) {
        int finite = 1;
        for (int i = 0; i < V; i++) finite &= isfinite(logits[i]) && fabsf(logits[i]) <= 30.0f;
        CHECK(finite, "mode %d step %d: logits not finite or beyond the softcap", act, step);
        int32_t next = g4_argmax(logits, V);
        CHECK(next >= 0 && next < V, "argmax %d", next);
        CHECK(g4_session_feed(s, &next, 1, logits, 0) == 0, "%s", g4_last_error());
    }
    CHECK_EQ_INT(g4_session_pos(s), 10);
    free(logits);
    g4_session_free(s);
}

static void test_tiny(void) {
    const char *dir = tmp_path("tiny"), *dir2 = tmp_path("tiny-again"), *dir3 = tmp_path("tiny-seed43");
    int ok = g4_synth("tiny", dir, 42, NULL) == 0;
    CHECK(ok, "%s", g4_last_error());
    if (!ok) return;
    /* config round trip: the same decoder as the shared fixture, read by the engine's parser */
    g4_config mine, fixture;
    ok = g4_config_load(&mine, dir) == 0;
    CHECK(ok, "%s", g4_last_error());
    if (ok && g4_config_load(&fixture, tiny_dir()) == 0) {
        compare_configs(&mine, &fixture);
        g4_config_free(&fixture);
    } else if (ok) {
        CHECK(0, "the shared tiny fixture, which the config is compared with: %s", g4_last_error());
    }
    if (ok) {
        int want_stop[] = {1, 106, 50}, found = 0;
        for (int i = 0; i < mine.n_stop_ids; i++)
            for (int k = 0; k < 3; k++) found += mine.stop_ids[i] == want_stop[k];
        CHECK_EQ_INT(found, 3);
        g4_config_free(&mine);
    }
    char *text;
    if (g4_read_file(in_dir(dir, "config.json"), &text, NULL) == 0) {
        check_sorted_patterns(text, "tiny");
        free(text);
    }
    check_manifest_vs_fixture(dir);
    check_values(dir);
    check_tokenizer(in_dir(dir, "tokenizer.json"), 512);

    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s", g4_last_error());
    if (m) {
        CHECK_EQ_INT(g4_model_vocab_size(m), 512);
        CHECK_EQ_INT(g4_model_bos_id(m), 2);
        run_tokens(m, G4_ACT_INT);
        run_tokens(m, G4_ACT_FAKE);
        run_tokens(m, G4_ACT_FLOAT);
        g4_model_free(m);
    }

    /* determinism: the bytes are a function of (preset, seed) */
    CHECK(g4_synth("tiny", dir2, 42, NULL) == 0, "%s", g4_last_error());
    static const char *const files[] = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"};
    for (int i = 0; i < 4; i++)
        CHECK(same_file(in_dir(dir, files[i]), in_dir(dir2, files[i])), "%s differs between two runs", files[i]);
    CHECK(g4_synth("tiny", dir3, 43, NULL) == 0, "%s", g4_last_error());
    CHECK(!same_file(in_dir(dir, "model.safetensors"), in_dir(dir3, "model.safetensors")), "seed has no effect");
    CHECK(same_file(in_dir(dir, "config.json"), in_dir(dir3, "config.json")), "config depends on the seed");
}

static void test_tokenizer_option_and_errors(void) {
    char src[512], dir[512];
    snprintf(src, sizeof src, "%s", tmp_path("my-tokenizer.json"));
    snprintf(dir, sizeof dir, "%s", tmp_path("tiny-tok"));
    FILE *f = fopen(src, "wb");
    if (f) {
        fputs("{\"model\": {\"type\": \"BPE\"}}\n", f);
        fclose(f);
    }
    CHECK(g4_synth("tiny", dir, 1, src) == 0, "%s", g4_last_error());
    CHECK(same_file(src, in_dir(dir, "tokenizer.json")), "--tokenizer was not copied");
    const char *missing = tmp_path("no-such-tokenizer.json");
    g4_clear_error();
    CHECK(g4_synth("tiny", tmp_path("tiny-tok2"), 1, missing) != 0 && strstr(g4_last_error(), missing), "missing tokenizer: %s",
          g4_last_error());
    g4_clear_error();
    CHECK(g4_synth("e3b", tmp_path("x"), 1, NULL) != 0 && strstr(g4_last_error(), "e3b"), "bad preset: %s", g4_last_error());
    /* an output "folder" that is a file */
    g4_clear_error();
    CHECK(g4_synth("tiny", src, 1, NULL) != 0 && strstr(g4_last_error(), src), "file as folder: %s", g4_last_error());
    /* nested folders are created */
    CHECK(g4_synth("tiny", tmp_path("a/b/c"), 1, NULL) == 0, "%s", g4_last_error());
    CHECK(g4_synth_write_tokenizer(tmp_path("small.json"), 100) != 0, "a vocab below the byte tokens was accepted");
}

static void test_big_tokenizer(void) {
    const char *p = tmp_path("tokenizer-262144.json");
    CHECK(g4_synth_write_tokenizer(p, 262144) == 0, "%s", g4_last_error());
    check_tokenizer(p, 262144);
}

/* ---- E2B, full size (G4_TEST_E2B=1) ---- */

/* The number after `key` in describe's output, or -1. */
static double describe_value(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

static void test_e2b_full(void) {
    const char *env = getenv("G4_TEST_E2B");
    if (!env || strcmp(env, "1") != 0) {
        SKIP_OPT_IN("full-size E2B synth (set G4_TEST_E2B=1; writes 2.1 GB)");
        return;
    }
    const char *dir = tmp_path("e2b");
    g4_synth_stats st;
    int ok = g4_synth_ex("e2b", dir, 7, NULL, &st) == 0;
    CHECK(ok, "%s", g4_last_error());
    if (!ok) return;
    /* checkpoint.md §7 */
    CHECK_EQ_INT(st.n_text_tensors, 1601);
    CHECK_EQ_INT(st.text_bytes, 2118056254ull);
    g4_safetensors sf;
    if (g4_st_open_dir(&sf, dir) == 0) {
        long long dead = 0;
        int n_dead = 0, n_knorm = 0;
        for (int i = 0; i < sf.n_tensors; i++) {
            int l;
            char rest[96];
            if (sscanf(sf.tensors[i].name, "model.language_model.layers.%d.%95s", &l, rest) != 2) continue;
            if (l >= 15 && (!strncmp(rest, "self_attn.k_proj.", 17) || !strncmp(rest, "self_attn.v_proj.", 17))) {
                n_dead++;
                dead += (long long)sf.tensors[i].nbytes;
            }
            n_knorm += !strcmp(rest, "self_attn.k_norm.weight");
        }
        CHECK_EQ_INT(n_dead, 160);
        CHECK_EQ_INT(dead, 9486656);
        CHECK_EQ_INT(n_knorm, 15);
        g4_st_close(&sf);
    }
    check_tokenizer(in_dir(dir, "tokenizer.json"), 262144);
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return;
    FILE *f = tmpfile();
    if (f) {
        g4_model_describe(m, f);
        long n = ftell(f);
        char *text = calloc((size_t)n + 1, 1);
        rewind(f);
        if (text && fread(text, 1, (size_t)n, f) == (size_t)n) {
            double per_token = describe_value(text, "bytes touched per decoded token: ");
            double text_bytes = describe_value(text, "(text tensors ");
            printf("e2b: bytes touched per decoded token %.0f, text tensors %.0f\n", per_token, text_bytes);
            CHECK(fabs(per_token - 795.76e6) < 0.01e6, "bytes per token %.0f (model.md §11: 795.76 MB)", per_token);
            CHECK(text_bytes == 2118056254.0, "text tensors %.0f", text_bytes);
        }
        free(text);
        fclose(f);
    }
    g4_options o;
    g4_options_default(&o);
    o.ctx = 16;
    g4_session *s = g4_session_new(m, &o);
    float *logits = malloc(sizeof *logits * 262144);
    int32_t ids[2] = {2, 105};
    CHECK(s && logits && g4_session_feed(s, ids, 2, logits, 0) == 0, "%s", g4_last_error());
    if (s && logits) {
        int finite = 1;
        for (int i = 0; i < 262144; i++) finite &= isfinite(logits[i]);
        CHECK(finite, "e2b logits not finite");
    }
    free(logits);
    g4_session_free(s);
    g4_model_free(m);
}

/* The plain BF16 layout: no quantization_config (every module float), the lm_head tied. */
static void test_bf16_config(void) {
    char *text = g4_synth_config_json("e2b-bf16");
    CHECK(text != NULL && !strstr(text, "quantization_config"), "e2b-bf16 config: %s", text ? "has a quantization_config" : g4_last_error());
    g4_config c;
    int ok = text && g4_config_parse(&c, text, "e2b-bf16/config.json") == 0;
    CHECK(ok, "%s", g4_last_error());
    free(text);
    if (!ok) return;
    CHECK(c.quant.method == G4_QUANT_NONE && c.tie_word_embeddings && c.n_layers == 35, "e2b-bf16: plain, tied");
    CHECK_EQ_INT(g4_config_module_bits(&c, "model.language_model.layers.3.mlp.up_proj"), 0);
    g4_config_free(&c);
}

/* ---- e2b-drafter ---- */

static const cJSON *obj(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }

static void check_int_field(const cJSON *o, const char *where, const char *key, double want) {
    const cJSON *v = obj(o, key);
    CHECK(cJSON_IsNumber(v) && v->valuedouble == want, "%s%s: want %g", where, key, want);
}

static void check_bool_field(const cJSON *o, const char *where, const char *key, int want) {
    const cJSON *v = obj(o, key);
    CHECK(cJSON_IsBool(v) && !!cJSON_IsTrue(v) == want, "%s%s: want %s", where, key, want ? "true" : "false");
}

static void check_str_field(const cJSON *o, const char *where, const char *key, const char *want) {
    const cJSON *v = obj(o, key);
    CHECK(cJSON_IsString(v) && !strcmp(v->valuestring, want), "%s%s: want \"%s\"", where, key, want);
}

static void check_null_field(const cJSON *o, const char *where, const char *key) {
    const cJSON *v = obj(o, key);
    CHECK(v && cJSON_IsNull(v), "%s%s: want null", where, key);
}

/* The published config.json's fields, as the integration guide lists them. */
static void check_drafter_config_text(const char *text) {
    cJSON *r = cJSON_Parse(text);
    CHECK(r != NULL, "drafter config.json is not JSON");
    if (!r) return;
    const cJSON *arch = obj(r, "architectures");
    CHECK(cJSON_GetArraySize(arch) == 1 && cJSON_IsString(cJSON_GetArrayItem(arch, 0)) &&
              !strcmp(cJSON_GetArrayItem(arch, 0)->valuestring, "Gemma4AssistantForCausalLM"),
          "architectures");
    check_str_field(r, "", "model_type", "gemma4_assistant");
    check_int_field(r, "", "backbone_hidden_size", 1536);
    check_int_field(r, "", "num_centroids", 2048);
    check_int_field(r, "", "centroid_intermediate_top_k", 32);
    check_bool_field(r, "", "use_ordered_embeddings", 1);
    check_bool_field(r, "", "tie_word_embeddings", 1);
    CHECK(!obj(r, "quantization_config"), "the drafter is plain BF16");
    const cJSON *t = obj(r, "text_config");
    CHECK(cJSON_IsObject(t), "no text_config");
    const char *w = "text_config.";
    check_str_field(t, w, "model_type", "gemma4_text");
    static const struct {
        const char *key;
        double v;
    } ints[] = {{"num_hidden_layers", 4},     {"hidden_size", 256},
                {"intermediate_size", 2048},  {"num_attention_heads", 4},
                {"num_key_value_heads", 1},   {"head_dim", 256},
                {"global_head_dim", 512},     {"sliding_window", 512},
                {"max_position_embeddings", 131072}, {"num_kv_shared_layers", 4},
                {"rms_norm_eps", 1e-6},       {"vocab_size", 262144},
                {"hidden_size_per_layer_input", 0}, {"vocab_size_per_layer_input", 0},
                {"bos_token_id", 2},          {"eos_token_id", 1},
                {"pad_token_id", 0}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) check_int_field(t, w, ints[i].key, ints[i].v);
    check_null_field(t, w, "num_global_key_value_heads");
    check_null_field(t, w, "final_logit_softcapping");
    check_bool_field(t, w, "attention_k_eq_v", 0);
    check_bool_field(t, w, "tie_word_embeddings", 1);
    check_bool_field(t, w, "use_double_wide_mlp", 0);
    check_bool_field(t, w, "enable_moe_block", 0);
    check_str_field(t, w, "hidden_activation", "gelu_pytorch_tanh");
    const cJSON *lt = obj(t, "layer_types");
    static const char *const want_lt[] = {"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"};
    CHECK_EQ_INT(cJSON_GetArraySize(lt), 4);
    for (int i = 0; i < 4 && i < cJSON_GetArraySize(lt); i++)
        CHECK(cJSON_IsString(cJSON_GetArrayItem(lt, i)) && !strcmp(cJSON_GetArrayItem(lt, i)->valuestring, want_lt[i]),
              "layer_types[%d]", i);
    const cJSON *rp = obj(t, "rope_parameters"), *fa = obj(rp, "full_attention"), *sa = obj(rp, "sliding_attention");
    CHECK(cJSON_IsObject(fa) && cJSON_IsObject(sa), "rope_parameters");
    check_int_field(fa, "rope_parameters.full_attention.", "partial_rotary_factor", 0.25);
    check_int_field(fa, "rope_parameters.full_attention.", "rope_theta", 1e6);
    check_str_field(fa, "rope_parameters.full_attention.", "rope_type", "proportional");
    check_int_field(sa, "rope_parameters.sliding_attention.", "rope_theta", 1e4);
    check_str_field(sa, "rope_parameters.sliding_attention.", "rope_type", "default");
    CHECK(!obj(sa, "partial_rotary_factor"), "sliding rope has no partial_rotary_factor");
    /* keys sorted, as HF writes them */
    const cJSON *levels[] = {r, t};
    for (int k = 0; k < 2; k++)
        for (const cJSON *e = levels[k]->child; e && e->next; e = e->next)
            CHECK(strcmp(e->string, e->next->string) < 0, "%s listed before %s", e->string, e->next->string);
    cJSON_Delete(r);
}

static void test_drafter_config(void) {
    char *text = g4_synth_config_json("e2b-drafter");
    CHECK(text != NULL, "%s", g4_last_error());
    if (!text) return;
    check_drafter_config_text(text);
    free(text);
}

/* Name, dtype and shape of every tensor Gemma4AssistantForCausalLM's save_pretrained writes
 * for that config (all but lm_head.weight, tied to model.embed_tokens.weight). */
typedef struct {
    char name[96];
    g4_dtype dt;
    int ndim;
    int64_t shape[2];
} want_tensor;

static int drafter_manifest(want_tensor *w) {
    int n = 0;
#define W(nm, d, nd, a, b) \
    (snprintf(w[n].name, sizeof w[n].name, "%s", nm), w[n].dt = d, w[n].ndim = nd, w[n].shape[0] = a, w[n].shape[1] = b, n++)
    W("model.embed_tokens.weight", G4_DT_BF16, 2, 262144, 256);
    W("model.norm.weight", G4_DT_BF16, 1, 256, 0);
    W("pre_projection.weight", G4_DT_BF16, 2, 256, 3072);
    W("post_projection.weight", G4_DT_BF16, 2, 1536, 256);
    W("masked_embedding.centroids.weight", G4_DT_BF16, 2, 2048, 256);
    W("masked_embedding.token_ordering", G4_DT_I64, 1, 262144, 0);
    char nm[96];
    for (int l = 0; l < 4; l++) {
        int64_t hd = l == 3 ? 512 : 256;
#define L(s, nd, a, b) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), W(nm, G4_DT_BF16, nd, a, b))
        L("input_layernorm.weight", 1, 256, 0);
        L("post_attention_layernorm.weight", 1, 256, 0);
        L("pre_feedforward_layernorm.weight", 1, 256, 0);
        L("post_feedforward_layernorm.weight", 1, 256, 0);
        L("layer_scalar", 1, 1, 0);
        L("self_attn.q_proj.weight", 2, 4 * hd, 256);
        L("self_attn.q_norm.weight", 1, hd, 0);
        L("self_attn.o_proj.weight", 2, 256, 4 * hd);
        L("mlp.gate_proj.weight", 2, 2048, 256);
        L("mlp.up_proj.weight", 2, 2048, 256);
        L("mlp.down_proj.weight", 2, 256, 2048);
#undef L
    }
#undef W
    return n;
}

static void check_drafter_tensors(const char *dir) {
    g4_safetensors st;
    if (g4_st_open_dir(&st, dir) != 0) {
        CHECK(0, "%s", g4_last_error());
        return;
    }
    want_tensor w[64];
    int n = drafter_manifest(w);
    CHECK_EQ_INT(n, 50);
    CHECK_EQ_INT(st.n_tensors, n); /* nothing else: no lm_head, no k/v projections, no towers */
    int64_t params = 0;
    for (int i = 0; i < n; i++) {
        const g4_tensor *t = need(&st, w[i].name);
        if (!t) continue;
        CHECK(t->dtype == w[i].dt && t->ndim == w[i].ndim && t->shape[0] == w[i].shape[0] &&
                  (w[i].ndim < 2 || t->shape[1] == w[i].shape[1]),
              "%s: %s [%lld, %lld]", w[i].name, g4_dtype_name(t->dtype), (long long)t->shape[0],
              (long long)(t->ndim > 1 ? t->shape[1] : 0));
        params += (int64_t)(t->nbytes / g4_dtype_size(t->dtype));
    }
    /* transformers: 145,102,340 parameters and buffers with the tied lm_head, 67,108,864 of them lm_head's */
    CHECK_EQ_INT(params, 145102340 - 67108864);
    /* token_ordering: a permutation of 0..262143, and not a trivial one */
    const g4_tensor *o = need(&st, "masked_embedding.token_ordering");
    if (o && o->dtype == G4_DT_I64 && o->shape[0] == 262144) {
        uint8_t *seen = calloc(262144, 1);
        int bad = 0, fixed = 0;
        for (int64_t i = 0; seen && i < 262144; i++) {
            int64_t v;
            memcpy(&v, o->data + 8 * i, 8);
            if (v < 0 || v >= 262144 || seen[v]) {
                bad++;
                continue;
            }
            seen[v] = 1;
            fixed += v == i;
        }
        CHECK(seen && bad == 0, "token_ordering is not a permutation (%d bad entries)", bad);
        CHECK(fixed < 20, "token_ordering has %d fixed points", fixed);
        free(seen);
    }
    /* plausible values: norms near 1, layer_scalar in the published drafter's 0.04..0.43 */
    char nm[96];
    for (int l = 0; l < 4; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.layer_scalar", l);
        const g4_tensor *s = need(&st, nm);
        if (s) CHECK(f32_at(s, 0) >= 0.039f && f32_at(s, 0) <= 0.431f, "%s %g", nm, f32_at(s, 0));
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        const g4_tensor *g = need(&st, nm);
        if (g)
            for (int i = 0; i < 256; i++) CHECK(f32_at(g, i) > 0.85f && f32_at(g, i) < 1.15f, "%s[%d] %g", nm, i, f32_at(g, i));
    }
    const g4_tensor *e = need(&st, "model.embed_tokens.weight");
    if (e) {
        double ss = 0;
        for (int64_t i = 0; i < 256 * 1024; i++) ss += (double)f32_at(e, i) * f32_at(e, i);
        double rms = sqrt(ss / (256 * 1024));
        CHECK(rms > 0.5 / 16 && rms < 2.0 / 16, "embed_tokens RMS %g (want about 1/sqrt(256))", rms);
    }
    g4_st_close(&st);
}

static void test_drafter(void) {
    char dir[512], dir2[512], dir3[512];
    snprintf(dir, sizeof dir, "%s", tmp_path("e2b-drafter"));
    snprintf(dir2, sizeof dir2, "%s", tmp_path("e2b-drafter-again"));
    snprintf(dir3, sizeof dir3, "%s", tmp_path("e2b-drafter-seed6"));
    g4_synth_stats st;
    int ok = g4_synth_ex("e2b-drafter", dir, 5, NULL, &st) == 0;
    CHECK(ok, "%s", g4_last_error());
    if (!ok) return;
    CHECK_EQ_INT(st.n_tensors, 50);
    CHECK_EQ_INT(st.n_text_tensors, 50);
    /* 77,731,332 BF16 values and 262,144 I64 ones */
    CHECK_EQ_INT(st.text_bytes, 77731332ull * 2 + 262144ull * 8);
    CHECK(g4_file_exists(in_dir(dir, "config.json")) && !g4_file_exists(in_dir(dir, "tokenizer.json")) &&
              !g4_file_exists(in_dir(dir, "generation_config.json")),
          "the drafter folder holds config.json and model.safetensors only");
    char *text;
    if (g4_read_file(in_dir(dir, "config.json"), &text, NULL) == 0) {
        check_drafter_config_text(text);
        free(text);
    } else {
        CHECK(0, "%s", g4_last_error());
    }
    check_drafter_tensors(dir);
    /* determinism */
    CHECK(g4_synth("e2b-drafter", dir2, 5, NULL) == 0, "%s", g4_last_error());
    CHECK(same_file(in_dir(dir, "model.safetensors"), in_dir(dir2, "model.safetensors")), "drafter differs between two runs");
    CHECK(same_file(in_dir(dir, "config.json"), in_dir(dir2, "config.json")), "drafter config differs between two runs");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir2);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir2);
    CHECK(g4_synth("e2b-drafter", dir3, 6, NULL) == 0, "%s", g4_last_error());
    g4_safetensors a, b;
    if (g4_st_open_dir(&a, dir) == 0) {
        if (g4_st_open_dir(&b, dir3) == 0) {
            static const char *const names[] = {"masked_embedding.token_ordering", "model.layers.2.mlp.up_proj.weight"};
            for (int i = 0; i < 2; i++) {
                const g4_tensor *x = g4_st_find(&a, names[i]), *y = g4_st_find(&b, names[i]);
                CHECK(x && y && x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes), "%s: seed has no effect", names[i]);
            }
            g4_st_close(&b);
        }
        g4_st_close(&a);
    }
    CHECK(same_file(in_dir(dir, "config.json"), in_dir(dir3, "config.json")), "drafter config depends on the seed");
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, dir3);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    /* no tokenizer to copy into a drafter's folder */
    g4_clear_error();
    CHECK(g4_synth("e2b-drafter", tmp_path("drafter-tok"), 5, in_dir(dir, "config.json")) != 0 &&
              strstr(g4_last_error(), "tokenizer"),
          "--tokenizer with the drafter: %s", g4_last_error());
}

int main(void) {
    g4_set_log(NULL, NULL);
    snprintf(base_tmp, sizeof base_tmp, "/tmp/g4-synth-XXXXXX");
    if (!mkdtemp(base_tmp)) return 2;
    test_writer_roundtrip();
    test_writer_rejects();
    test_e2b_config();
    test_e4b_config();
    test_q4_0_config();
    test_bf16_config();
    test_drafter_config();
    test_tiny();
    test_drafter();
    test_tokenizer_option_and_errors();
    test_big_tokenizer();
    test_e2b_full();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base_tmp);
    return check_report("test_synth");
}
