/* Broken checkpoints: each case writes a damaged copy of the tiny fixture to a temporary folder
 * and expects a clean, one-line error naming the file and tensor/field, from the library and
 * from `g4 inspect` (non-zero exit, no crash). Also: a sharded copy loads and computes the same. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eval/harness.h"
#include "testutil.h"
#include "util/err.h"
#include "model/feed.h"

static char base_tmp[256];
static const char *bin; /* G4_BIN; NULL after check_bin has failed the run */
static unsigned char *orig_st;
static size_t orig_st_len;
static char *orig_config;

typedef struct {
    cJSON *header;
    const unsigned char *data; /* data section of the original file */
    size_t data_len;
} st_parts;

static st_parts split_original(void) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | orig_st[i];
    st_parts p = {cJSON_ParseWithLength((const char *)orig_st + 8, (size_t)n), orig_st + 8 + n, orig_st_len - 8 - (size_t)n};
    return p;
}

/* A safetensors file from a header object and a data section. */
static void write_safetensors(const char *path, const cJSON *header, const unsigned char *data, size_t len) {
    char *json = cJSON_PrintUnformatted(header);
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    unsigned char *buf = malloc(8 + padded + len);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, ' ', padded - n);
    memcpy(buf + 8 + padded, data, len);
    write_file_or_exit(path, buf, 8 + padded + len);
    free(buf);
    free(json);
}

static const char *case_dir(const char *name) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", base_tmp, name);
    mkdir(dir, 0777);
    return dir;
}

static void write_in(const char *dir, const char *file, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    write_file_or_exit(path, data, len);
}

/* Runs `g4 inspect -m dir`: must exit 1 with exactly one line on stderr starting "g4: error: ". */
static void check_cli_fails(const char *dir, const char *expect) {
    if (!bin) return;
    char cmd[2048], errpath[600];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", base_tmp);
    snprintf(cmd, sizeof cmd, "%s inspect -m %s > /dev/null 2> %s", bin, dir, errpath);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: g4 inspect exit status %d", dir, st);
    char *err;
    size_t len;
    if (g4_read_file(errpath, &err, &len) != 0) return;
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += err[i] == '\n';
    CHECK(lines == 1 && strncmp(err, "g4: error: ", 11) == 0 && strstr(err, expect), "%s: stderr was: %s", dir, err);
    free(err);
}

/* The library must refuse the folder with a message containing every expected fragment. */
static void expect_failure(const char *name, const char *dir, const char *frag1, const char *frag2) {
    g4_model *m = g4_model_load(dir);
    CHECK(m == NULL, "%s: loaded a broken checkpoint", name);
    if (m) {
        g4_model_free(m);
        return;
    }
    const char *msg = g4_last_error();
    CHECK(strstr(msg, frag1) && (!frag2 || strstr(msg, frag2)), "%s: message \"%s\" lacks \"%s\"/\"%s\"", name, msg, frag1,
          frag2 ? frag2 : "");
    printf("ok %-22s %s\n", name, msg);
    check_cli_fails(dir, frag1);
}

/* A case with the original config and a safetensors file built from a modified header. */
static void header_case(const char *name, void (*edit)(cJSON *), const char *frag1, const char *frag2) {
    st_parts p = split_original();
    edit(p.header);
    const char *dir = case_dir(name);
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(path, p.header, p.data, p.data_len);
    cJSON_Delete(p.header);
    expect_failure(name, dir, frag1, frag2);
}

/* A case with the original safetensors and a config.json where `from` is replaced by `to`. */
static void config_case(const char *name, const char *from, const char *to, const char *frag1, const char *frag2) {
    const char *at = strstr(orig_config, from);
    if (!at) {
        fprintf(stderr, "%s: config text \"%s\" not found\n", name, from);
        exit(2);
    }
    size_t a = (size_t)(at - orig_config), fl = strlen(from), tl = strlen(to), n = strlen(orig_config);
    char *cfg = malloc(n - fl + tl + 1);
    memcpy(cfg, orig_config, a);
    memcpy(cfg + a, to, tl);
    memcpy(cfg + a + tl, at + fl, n - a - fl + 1);
    const char *dir = case_dir(name);
    write_in(dir, "config.json", cfg, strlen(cfg));
    write_in(dir, "model.safetensors", orig_st, orig_st_len);
    free(cfg);
    expect_failure(name, dir, frag1, frag2);
}

static cJSON *entry(cJSON *h, const char *name) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive(h, name);
    if (!e) {
        fprintf(stderr, "fixture lacks %s\n", name);
        exit(2);
    }
    return e;
}

#define Q_PROJ "model.language_model.layers.0.self_attn.q_proj.weight"
#define GATE "model.language_model.layers.0.mlp.gate_proj.weight"
#define NORM "model.language_model.norm.weight"

static void edit_overlap(cJSON *h) {
    cJSON *a = entry(h, Q_PROJ), *b = entry(h, "model.language_model.layers.1.self_attn.q_proj.weight");
    cJSON_ReplaceItemInObject(a, "data_offsets", cJSON_Duplicate(cJSON_GetObjectItem(b, "data_offsets"), 1));
}
static void edit_wrong_dtype(cJSON *h) { cJSON_ReplaceItemInObject(entry(h, GATE), "dtype", cJSON_CreateString("I8")); }
static void edit_wrong_shape(cJSON *h) {
    /* [32, 32] -> [16, 64]: same byte count, so only the model's shape check can catch it */
    int dims[2] = {16, 64};
    cJSON_ReplaceItemInObject(entry(h, Q_PROJ), "shape", cJSON_CreateIntArray(dims, 2));
}
static void edit_missing(cJSON *h) { cJSON_DeleteItemFromObjectCaseSensitive(h, NORM); }
static void edit_unknown_dtype(cJSON *h) { cJSON_ReplaceItemInObject(entry(h, NORM), "dtype", cJSON_CreateString("Q9")); }
static void edit_size_mismatch(cJSON *h) {
    int dims[1] = {65};
    cJSON_ReplaceItemInObject(entry(h, NORM), "shape", cJSON_CreateIntArray(dims, 1));
}
static void edit_offsets_past_end(cJSON *h) {
    cJSON *off = cJSON_GetObjectItem(entry(h, NORM), "data_offsets");
    double end = cJSON_GetArrayItem(off, 1)->valuedouble;
    cJSON_SetNumberValue(cJSON_GetArrayItem(off, 0), end + 1e9 - 128);
    cJSON_SetNumberValue(cJSON_GetArrayItem(off, 1), end + 1e9);
}
static void edit_norm_dtype_int(cJSON *h) { cJSON_ReplaceItemInObject(entry(h, NORM), "dtype", cJSON_CreateString("I16")); }

static void raw_cases(void) {
    /* truncated: the data section is cut short */
    const char *dir = case_dir("truncated");
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    write_in(dir, "model.safetensors", orig_st, orig_st_len / 2);
    expect_failure("truncated", dir, "model.safetensors", "past the end");
    /* header length past the end of the file */
    unsigned char *copy = malloc(orig_st_len);
    memcpy(copy, orig_st, orig_st_len);
    uint64_t n = orig_st_len;
    for (int i = 0; i < 8; i++) copy[i] = (unsigned char)(n >> (8 * i));
    dir = case_dir("header_past_eof");
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    write_in(dir, "model.safetensors", copy, orig_st_len);
    expect_failure("header_past_eof", dir, "model.safetensors", "header length");
    /* header not JSON */
    memcpy(copy, orig_st, orig_st_len);
    memcpy(copy + 8, "{{{{", 4);
    dir = case_dir("header_not_json");
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    write_in(dir, "model.safetensors", copy, orig_st_len);
    expect_failure("header_not_json", dir, "model.safetensors", "not a JSON object");
    /* tiny file */
    dir = case_dir("tiny_file");
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    write_in(dir, "model.safetensors", "abc", 3);
    expect_failure("tiny_file", dir, "model.safetensors", "truncated");
    free(copy);
    /* no weights at all / no config */
    dir = case_dir("no_weights");
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    expect_failure("no_weights", dir, "no model.safetensors", NULL);
    dir = case_dir("no_config");
    write_in(dir, "model.safetensors", orig_st, orig_st_len);
    expect_failure("no_config", dir, "config.json", "cannot open");
}

/* A zero weight scale is refused: dequantization would silently zero the row. */
static void zero_scale_case(void) {
    st_parts p = split_original();
    const cJSON *off = cJSON_GetObjectItem(entry(p.header, "model.language_model.layers.2.mlp.up_proj.weight_scale"), "data_offsets");
    size_t begin = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    unsigned char *data = malloc(p.data_len);
    memcpy(data, p.data, p.data_len);
    memset(data + begin + 8, 0, 4); /* row 2 */
    const char *dir = case_dir("zero_scale");
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(path, p.header, data, p.data_len);
    free(data);
    cJSON_Delete(p.header);
    expect_failure("zero_scale", dir, "up_proj.weight_scale", "not positive");
}

/* The same tensors split over two shards with an index: loads and gives the same logits. */
/* g4_st_pread (the embedding gathers' way around the mapping) gives the mapped bytes, and refuses
 * a range that runs past its file or lies outside every mapping. */
static void pread_case(void) {
    g4_safetensors st = {0};
    CHECK(g4_st_open_dir(&st, tiny_dir()) == 0, "open %s: %s", tiny_dir(), g4_last_error());
    const g4_tensor *t = g4_st_find(&st, "model.language_model.embed_tokens_per_layer.embedding_quantized");
    CHECK(t != NULL && t->nbytes > 100, "fixture lacks the per-layer embedding table");
    if (t && t->nbytes > 100) {
        unsigned char *buf = malloc(t->nbytes);
        CHECK(g4_st_pread(&st, t->data, t->nbytes, buf) == 0 && memcmp(buf, t->data, t->nbytes) == 0,
              "pread of the whole table differs from the mapping");
        CHECK(g4_st_pread(&st, t->data + 37, 61, buf) == 0 && memcmp(buf, t->data + 37, 61) == 0, "pread of an inner range differs");
        const g4_mapped_file *f = &st.maps[t->file];
        CHECK(g4_st_pread(&st, f->data + f->size - 8, 16, buf) != 0, "a range past the end of the file was read");
        CHECK(g4_st_pread(&st, buf, 8, buf + 8) != 0, "memory outside the mappings was read as a file");
        free(buf);
    }
    g4_st_close(&st);
}

static void sharded_case(void) {
    st_parts p = split_original();
    cJSON *h1 = cJSON_CreateObject(), *h2 = cJSON_CreateObject(), *index = cJSON_CreateObject(), *wm = cJSON_CreateObject();
    cJSON_AddItemToObject(index, "weight_map", wm);
    int i = 0;
    for (cJSON *e = p.header->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        cJSON_AddItemToObject(i++ % 2 ? h2 : h1, e->string, cJSON_Duplicate(e, 1));
        cJSON_AddItemToObject(wm, e->string, cJSON_CreateString(i % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors"));
    }
    /* both shards carry the whole data section; each header only names its own tensors */
    const char *dir = case_dir("sharded");
    char path[1024];
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    write_safetensors(path, h1, p.data, p.data_len);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    write_safetensors(path, h2, p.data, p.data_len);
    char *idx = cJSON_Print(index);
    write_in(dir, "model.safetensors.index.json", idx, strlen(idx));
    write_in(dir, "config.json", orig_config, strlen(orig_config));
    free(idx);
    g4_model *a = g4_model_load(tiny_dir()), *b = g4_model_load(dir);
    CHECK(a && b, "sharded load: %s", g4_last_error());
    if (a && b) {
        g4_options o;
        g4_options_default(&o);
        o.ctx = 16;
        g4_session *sa = g4_session_new(a, &o), *sb = g4_session_new(b, &o);
        int32_t ids[4] = {2, 100, 200, 300};
        float la[512], lb[512];
        CHECK(g4_session_feed(sa, ids, 4, la, 0) == 0 && g4_session_feed(sb, ids, 4, lb, 0) == 0, "%s", g4_last_error());
        CHECK(max_abs_diff(la, lb, 512) == 0, "sharded logits differ");
        printf("ok sharded checkpoint loads and matches the single file\n");
        g4_session_free(sa);
        g4_session_free(sb);
    }
    g4_model_free(a);
    g4_model_free(b);
    /* g4 eval's fingerprint follows the shards: both counted, and a changed byte in the second
     * one's header changes it */
    write_in(dir, "tokenizer.json", "{}", 2);
    char fp1[65], fp2[65], fp3[65];
    long long bytes = 0, b2 = 0;
    CHECK(g4_model_fingerprint(dir, fp1, &bytes) == 0 && g4_model_fingerprint(dir, fp2, &b2) == 0 && strcmp(fp1, fp2) == 0,
          "sharded fingerprint: %s", g4_last_error());
    struct stat s1, s2;
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    int st1 = stat(path, &s1);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    int st2 = stat(path, &s2);
    CHECK(st1 == 0 && st2 == 0 && bytes == (long long)(s1.st_size + s2.st_size), "sharded fingerprint counts %lld bytes", bytes);
    FILE *f = fopen(path, "r+b");
    int ch = f && fseek(f, 12, SEEK_SET) == 0 ? fgetc(f) : EOF;
    if (ch != EOF && fseek(f, 12, SEEK_SET) == 0) fputc(ch == ' ' ? '\t' : ' ', f);
    if (f) fclose(f);
    CHECK(ch != EOF && g4_model_fingerprint(dir, fp3, &b2) == 0 && strcmp(fp1, fp3) != 0, "a changed shard keeps the fingerprint");
    /* an index naming a shard that is not there */
    cJSON_ReplaceItemInObject(wm, NORM, cJSON_CreateString("model-00009-of-00009.safetensors"));
    idx = cJSON_Print(index);
    write_in(dir, "model.safetensors.index.json", idx, strlen(idx));
    free(idx);
    expect_failure("sharded_missing_shard", dir, "model-00009-of-00009.safetensors", "cannot open");
    cJSON_Delete(h1);
    cJSON_Delete(h2);
    cJSON_Delete(index);
    cJSON_Delete(p.header);
}

int main(void) {
    bin = check_bin();
    snprintf(base_tmp, sizeof base_tmp, "/tmp/g4-broken-XXXXXX");
    if (!mkdtemp(base_tmp)) return 2;
    read_tiny_fixture(&orig_st, &orig_st_len, &orig_config);
    g4_set_log(NULL, NULL);

    raw_cases();
    header_case("overlap", edit_overlap, "overlap", "q_proj.weight");
    header_case("wrong_dtype", edit_wrong_dtype, GATE, "expected U8");
    header_case("wrong_shape", edit_wrong_shape, Q_PROJ, "expected U8 [32, 32]");
    header_case("missing_tensor", edit_missing, NORM, "missing");
    header_case("unknown_dtype", edit_unknown_dtype, NORM, "unknown dtype \"Q9\"");
    header_case("size_mismatch", edit_size_mismatch, NORM, "needs 130");
    header_case("offsets_past_end", edit_offsets_past_end, NORM, "past the end");
    header_case("norm_int_dtype", edit_norm_dtype_int, NORM, "expected BF16 [64]");
    zero_scale_case();
    config_case("unknown_bits", "\"language_model\\\\.layers\\\\.\\\\d+\\\\.per_layer_input_gate$\": {\n        \"num_bits\": 8",
                "\"language_model\\\\.layers\\\\.\\\\d+\\\\.per_layer_input_gate$\": {\n        \"num_bits\": 3",
                "per_layer_input_gate", "3 bits");
    config_case("invalid_regex", "\"vision_tower\": {", "\"language_model\\\\.layers\\\\.(\": {\"num_bits\": 4}, \"vision_tower\": {",
                "invalid regex", "config.json");
    config_case("missing_field", "\"hidden_size\": 64,", "", "text_config.hidden_size missing", "config.json");
    config_case("not_json", "{", "{{", "config.json", "not a JSON object");
    config_case("moe", "\"enable_moe_block\": false", "\"enable_moe_block\": true", "enable_moe_block", "config.json");
    config_case("bad_rope", "\"rope_type\": \"proportional\"", "\"rope_type\": \"yarn\"", "rope_type \"yarn\"", "config.json");
    config_case("bad_quant_method", "\"quant_method\": \"gemma\"", "\"quant_method\": \"gptq\"", "quant_method", "config.json");
    config_case("bad_layer_types", "\"full_attention\",\n      \"sliding_attention\"", "\"global\",\n      \"sliding_attention\"",
                "layer_types[4]", "config.json");
    sharded_case();
    pread_case();

    free(orig_st);
    free(orig_config);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base_tmp);
    return check_report("broken_checkpoint");
}
