#define _DEFAULT_SOURCE /* madvise */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <sys/mman.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[G4_DT_COUNT] = {
    [G4_DT_BOOL] = {"BOOL", 1}, [G4_DT_U8] = {"U8", 1},     [G4_DT_I8] = {"I8", 1},
    [G4_DT_I16] = {"I16", 2},   [G4_DT_U16] = {"U16", 2},   [G4_DT_F16] = {"F16", 2},
    [G4_DT_BF16] = {"BF16", 2}, [G4_DT_I32] = {"I32", 4},   [G4_DT_U32] = {"U32", 4},
    [G4_DT_F32] = {"F32", 4},   [G4_DT_F64] = {"F64", 8},   [G4_DT_I64] = {"I64", 8},
    [G4_DT_U64] = {"U64", 8},   [G4_DT_F8_E4M3] = {"F8_E4M3", 1}, [G4_DT_F8_E5M2] = {"F8_E5M2", 1},
};

const char *g4_dtype_name(g4_dtype dt) { return dt < G4_DT_COUNT ? dtype_info[dt].name : "?"; }
size_t g4_dtype_size(g4_dtype dt) { return dt < G4_DT_COUNT ? dtype_info[dt].size : 0; }

static int parse_dtype(const char *s, g4_dtype *out) {
    for (int i = 0; i < G4_DT_COUNT; i++)
        if (strcmp(s, dtype_info[i].name) == 0) {
            *out = (g4_dtype)i;
            return 0;
        }
    return -1;
}

float g4_load_f32(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float g4_bf16_to_f32(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float g4_f16_to_f32(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexpf((float)(man | 1024), exp - 25);
    return sign ? -v : v;
}

float g4_tensor_float(const g4_tensor *t, int64_t i) {
    const uint8_t *p = t->data + (size_t)i * g4_dtype_size(t->dtype);
    switch (t->dtype) {
    case G4_DT_F32: return g4_load_f32(p);
    case G4_DT_BF16: return g4_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
    case G4_DT_F16: return g4_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
    default: return NAN;
    }
}

const char *g4_shape_str(const g4_tensor *t, char *buf, size_t cap) {
    size_t len = 0;
    len += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const g4_tensor *)a)->name, ((const g4_tensor *)b)->name);
}

const g4_tensor *g4_st_find(const g4_safetensors *st, const char *name) {
    if (!st->n_tensors) return NULL;
    g4_tensor key = {.name = (char *)name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, cmp_tensor_name);
}

const char *g4_st_path(const g4_safetensors *st, const g4_tensor *t) { return st->paths[t->file]; }

/* The whole pages a tensor lies on, clipped to its file's mapping. */
static int tensor_pages(const g4_safetensors *st, const g4_tensor *t, void **begin, size_t *len) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), base = (uintptr_t)st->maps[t->file].data;
    uintptr_t b = (uintptr_t)t->data / page * page, e = (uintptr_t)t->data + t->nbytes;
    if (!t->nbytes || b < base) return -1;
    *begin = (void *)b;
    *len = e - b;
    return 0;
}

/* madvise is advice: a failure changes memory use or speed, never results, so it is ignored. */
void g4_st_advise_random(const g4_safetensors *st, const g4_tensor *t) {
    void *p;
    size_t len;
    if (tensor_pages(st, t, &p, &len) == 0) madvise(p, len, MADV_RANDOM);
}

void g4_st_release(const g4_safetensors *st, const g4_tensor *t) { g4_st_release_bytes(st, t->data, t->nbytes); }

int g4_st_pread(const g4_safetensors *st, const void *p, size_t len, void *out) {
    for (int i = 0; i < st->n_files; i++)
        if (g4_pread_mapped(&st->maps[i], p, len, out) == 0) return 0;
    return -1;
}

void g4_st_release_bytes(const g4_safetensors *st, const void *p, size_t len) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    for (int i = 0; i < st->n_files; i++) {
        uintptr_t base = (uintptr_t)st->maps[i].data;
        if (!len || a < base || a - base >= st->maps[i].size || len > st->maps[i].size - (a - base)) continue;
        uintptr_t b = a / page * page;
        madvise((void *)b, a + len - b, MADV_DONTNEED);
    }
}

/* A JSON number that must be a non-negative integer below 2^53 (exact in a double). */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int parse_tensor_entry(const cJSON *e, g4_tensor *t, size_t data_size, const char *path) {
    const char *name = e->string;
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo))
        return g4_fail("%s: tensor %s: header entry needs dtype, shape and data_offsets", path, name);
    if (parse_dtype(jd->valuestring, &t->dtype) != 0)
        return g4_fail("%s: tensor %s: unknown dtype \"%s\"", path, name, jd->valuestring);
    int nd = cJSON_GetArraySize(js);
    if (nd > G4_MAX_DIMS) return g4_fail("%s: tensor %s: %d dimensions (at most %d)", path, name, nd, G4_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (json_uint(cJSON_GetArrayItem(js, i), &d) != 0 || d > (1ull << 40))
            return g4_fail("%s: tensor %s: invalid shape", path, name);
        t->shape[i] = (int64_t)d;
        if (d && numel > (1ull << 50) / d) return g4_fail("%s: tensor %s: shape too large", path, name);
        numel *= d;
    }
    t->numel = (int64_t)numel;
    uint64_t b, en;
    if (cJSON_GetArraySize(jo) != 2 || json_uint(cJSON_GetArrayItem(jo, 0), &b) != 0 ||
        json_uint(cJSON_GetArrayItem(jo, 1), &en) != 0 || b > en)
        return g4_fail("%s: tensor %s: invalid data_offsets", path, name);
    if (en > data_size)
        return g4_fail("%s: tensor %s: data_offsets [%llu, %llu) past the end of the data (%zu bytes; truncated file?)",
                       path, name, (unsigned long long)b, (unsigned long long)en, data_size);
    uint64_t want = numel * g4_dtype_size(t->dtype);
    if (en - b != want)
        return g4_fail("%s: tensor %s: %llu data bytes, but %s x shape needs %llu", path, name,
                       (unsigned long long)(en - b), jd->valuestring, (unsigned long long)want);
    t->nbytes = (size_t)want;
    t->data = (const uint8_t *)(uintptr_t)b; /* relative; rebased by the caller */
    return 0;
}

static int cmp_tensor_offset(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)(*(const g4_tensor *const *)a)->data, y = (uintptr_t)(*(const g4_tensor *const *)b)->data;
    return x < y ? -1 : x > y;
}

/* Rejects two tensors whose byte ranges intersect (empty tensors take no bytes). */
static int check_no_overlap(g4_tensor *ts, int n, const char *path) {
    g4_tensor **order = malloc(sizeof *order * (size_t)(n ? n : 1));
    if (!order) return g4_fail("%s: out of memory", path);
    for (int i = 0; i < n; i++) order[i] = &ts[i];
    qsort(order, (size_t)n, sizeof *order, cmp_tensor_offset);
    const g4_tensor *prev = NULL;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const g4_tensor *t = order[i];
        if (!t->nbytes) continue;
        if (prev && (uintptr_t)t->data < (uintptr_t)prev->data + prev->nbytes)
            rc = g4_fail("%s: tensors %s and %s overlap in the file", path, prev->name, t->name);
        prev = t;
    }
    free(order);
    return rc;
}

/* Parses and validates the header of one mapped file, appending its tensors to st. */
static int load_header(g4_safetensors *st, int file) {
    const char *path = st->paths[file];
    const g4_mapped_file *m = &st->maps[file];
    if (m->size < 8) return g4_fail("%s: truncated: %zu bytes, not a safetensors file", path, m->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | m->data[i];
    if (n > m->size - 8)
        return g4_fail("%s: header length %llu runs past the end of the file (%zu bytes)", path, (unsigned long long)n, m->size);
    if (n > (100u << 20)) return g4_fail("%s: header length %llu is implausibly large", path, (unsigned long long)n);
    cJSON *root = cJSON_ParseWithLength((const char *)m->data + 8, (size_t)n);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g4_fail("%s: header is not a JSON object", path);
    }
    size_t data_size = m->size - 8 - (size_t)n;
    const uint8_t *base = m->data + 8 + n;
    int count = 0;
    for (const cJSON *e = root->child; e; e = e->next) count += strcmp(e->string, "__metadata__") != 0;
    g4_tensor *grown = realloc(st->tensors, sizeof *grown * (size_t)(st->n_tensors + count + 1));
    if (!grown) {
        cJSON_Delete(root);
        return g4_fail("%s: out of memory", path);
    }
    st->tensors = grown;
    g4_tensor *mine = st->tensors + st->n_tensors;
    int got = 0, rc = 0;
    for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        g4_tensor *t = &mine[got];
        memset(t, 0, sizeof *t);
        rc = parse_tensor_entry(e, t, data_size, path);
        if (rc == 0 && !(t->name = strdup(e->string))) rc = g4_fail("%s: out of memory", path);
        if (rc == 0) {
            t->file = file;
            got++;
        }
    }
    cJSON_Delete(root);
    if (rc == 0) rc = check_no_overlap(mine, got, path);
    for (int i = 0; i < got; i++) mine[i].data = base + (uintptr_t)mine[i].data;
    st->n_tensors += got;
    return rc;
}

static int add_file(g4_safetensors *st, const char *path) {
    for (int i = 0; i < st->n_files; i++)
        if (strcmp(st->paths[i], path) == 0) return i;
    char **p = realloc(st->paths, sizeof *p * (size_t)(st->n_files + 1));
    if (!p) return g4_fail("%s: out of memory", path);
    st->paths = p;
    g4_mapped_file *mp = realloc(st->maps, sizeof *mp * (size_t)(st->n_files + 1));
    if (!mp) return g4_fail("%s: out of memory", path);
    st->maps = mp;
    st->paths[st->n_files] = strdup(path);
    if (!st->paths[st->n_files]) return g4_fail("%s: out of memory", path);
    memset(&st->maps[st->n_files], 0, sizeof st->maps[0]);
    st->maps[st->n_files].fd = -1;
    int idx = st->n_files++;
    if (g4_map_file(path, &st->maps[idx]) != 0 || load_header(st, idx) != 0) return -1;
    return idx;
}

static int finish(g4_safetensors *st) {
    if (st->n_tensors > 1) qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
    for (int i = 1; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            return g4_fail("%s: tensor %s appears twice", st->paths[st->tensors[i].file], st->tensors[i].name);
    return 0;
}

int g4_st_open_file(g4_safetensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    if (add_file(st, path) < 0 || finish(st) != 0) {
        g4_st_close(st);
        return -1;
    }
    return 0;
}

/* Shards named by the index's weight_map; every listed tensor must be in the shard it names. */
static int open_index(g4_safetensors *st, const char *dir, const char *index_path) {
    char *text;
    if (g4_read_file(index_path, &text, NULL) != 0) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return g4_fail("%s: not JSON with a \"weight_map\" object", index_path);
    }
    int rc = wm->child ? 0 : g4_fail("%s: weight_map is empty", index_path);
    for (const cJSON *e = wm->child; e && rc == 0; e = e->next) {
        char path[4096];
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0)
            rc = g4_fail("%s: weight_map entry for %s is not a plain file name", index_path, e->string);
        else if (g4_path_join(path, sizeof path, dir, e->valuestring) != 0 || add_file(st, path) < 0)
            rc = -1;
    }
    if (rc == 0) rc = finish(st);
    for (const cJSON *e = wm->child; e && rc == 0; e = e->next) {
        const g4_tensor *t = g4_st_find(st, e->string);
        if (!t || strcmp(strrchr(st->paths[t->file], '/') + 1, e->valuestring) != 0)
            rc = g4_fail("%s: tensor %s is not in shard %s", index_path, e->string, e->valuestring);
    }
    cJSON_Delete(root);
    return rc;
}

int g4_st_open_dir(g4_safetensors *st, const char *dir) {
    memset(st, 0, sizeof *st);
    char path[4096];
    if (g4_path_join(path, sizeof path, dir, "model.safetensors.index.json") != 0) return -1;
    int rc;
    if (g4_file_exists(path)) {
        rc = open_index(st, dir, path);
    } else {
        if (g4_path_join(path, sizeof path, dir, "model.safetensors") != 0) return -1;
        if (!g4_file_exists(path))
            return g4_fail("%s: no model.safetensors or model.safetensors.index.json in this folder", dir);
        rc = add_file(st, path) < 0 ? -1 : finish(st);
    }
    if (rc != 0) g4_st_close(st);
    return rc;
}

void g4_st_close(g4_safetensors *st) {
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_files; i++) {
        g4_unmap_file(&st->maps[i]);
        free(st->paths[i]);
    }
    free(st->maps);
    free(st->paths);
    memset(st, 0, sizeof *st);
}
