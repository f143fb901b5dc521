/* GSM8K harness: statistics, fingerprints, data, the batched greedy runner, records, scoring
 * and comparison (harness.h). */
#define _POSIX_C_SOURCE 200809L
#include "eval/harness.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/file.h"

/* ---------------------------------------------------------------- statistics */

void g4_wilson95(long k, long n, double *lo, double *hi) {
    if (n <= 0) {
        *lo = 0;
        *hi = 1;
        return;
    }
    const double z = 1.959963984540054; /* the standard normal's 0.975 quantile */
    double p = (double)k / (double)n, z2 = z * z, nn = (double)n;
    double den = 1 + z2 / nn;
    double center = (p + z2 / (2 * nn)) / den;
    double half = z * sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / den;
    /* at k = 0 and k = n one bound is exactly 0 or 1; rounding would leave it a hair off */
    *lo = k <= 0 || center - half < 0 ? 0 : center - half;
    *hi = k >= n || center + half > 1 ? 1 : center + half;
}

double g4_mcnemar_exact_p(long b, long c) {
    long n = b + c, k = b < c ? b : c;
    if (n <= 0 || k < 0) return 1;
    /* The binomial terms grow up to i = n/2 >= k, so relative to the largest one, C(n, k),
     * every term is a product of ratios below 1: no overflow or underflow whatever n is. */
    long double sum = 0, term = 1;
    for (long i = k; i >= 0; i--) {
        sum += term;
        if (i > 0) term *= (long double)i / (long double)(n - i + 1);
    }
    long double log_ck = lgammal((long double)n + 1) - lgammal((long double)k + 1) - lgammal((long double)(n - k) + 1);
    long double log_p = logl(2.0L) + log_ck + logl(sum) - (long double)n * logl(2.0L);
    return log_p >= 0 ? 1.0 : (double)expl(log_p);
}

/* ---------------------------------------------------------------- SHA-256 */

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be,
    0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa,
    0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85,
    0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
    0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f,
    0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int r) {
    return (x >> r) | (x << (32 - r));
}

static void sha_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, h, sizeof v);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) + sha_k[i] + w[i];
        uint32_t t2 = (rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof *v);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) h[i] += v[i];
}

void g4_sha256_init(g4_sha256 *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
    c->used = 0;
}

void g4_sha256_update(g4_sha256 *c, const void *data, size_t n) {
    const unsigned char *p = data;
    c->bytes += n;
    while (n > 0) {
        size_t take = 64 - c->used < n ? 64 - c->used : n;
        memcpy(c->block + c->used, p, take);
        c->used += take;
        p += take;
        n -= take;
        if (c->used == 64) {
            sha_block(c->h, c->block);
            c->used = 0;
        }
    }
}

void g4_sha256_hex(g4_sha256 *c, char hex[65]) {
    uint64_t bits = c->bytes * 8;
    unsigned char pad[72] = {0x80};
    size_t n_pad = (c->used < 56 ? 56 : 120) - c->used;
    for (int i = 0; i < 8; i++) pad[n_pad + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
    g4_sha256_update(c, pad, n_pad + 8);
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", (unsigned)c->h[i]);
}

/* ---------------------------------------------------------------- data */

void g4_gsm8k_data_free(g4_gsm8k_data *d) {
    for (int i = 0; i < d->n; i++) {
        free(d->items[i].question);
        free(d->items[i].gold);
    }
    free(d->items);
    memset(d, 0, sizeof *d);
}

static int parse_item(const char *path, int line, const char *s, size_t len, g4_gsm8k_item *it) {
    cJSON *j = cJSON_ParseWithLength(s, len);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "question"), *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
    int rc = 0;
    it->index = line;
    if (!cJSON_IsObject(j) || !cJSON_IsString(q) || !cJSON_IsString(a))
        rc = g4_fail("%s: line %d (q%d): expected a JSON object with string fields \"question\" and \"answer\"", path, line + 1, line);
    else if (!(it->gold = g4_gsm8k_gold(a->valuestring)))
        rc = g4_fail("%s: line %d (q%d): the answer has no number after its last ####", path, line + 1, line);
    else if (!(it->question = strdup(q->valuestring)))
        rc = g4_fail("out of memory");
    cJSON_Delete(j);
    return rc;
}

/* Walks the lines of text, keeping [offset, offset + n); n < 0: to the end. */
static int select_lines(const char *path, const char *text, size_t size, int offset, int n, g4_gsm8k_data *d) {
    g4_sha256 sel;
    g4_sha256_init(&sel);
    int line = 0, cap = 0;
    for (size_t pos = 0; pos < size; line++) {
        const char *nl = memchr(text + pos, '\n', size - pos);
        size_t end = nl ? (size_t)(nl - text) + 1 : size;
        /* a blank line (a trailing one, say) is no question, but still counts for qN = line N */
        int blank = strspn(text + pos, " \t\r\n") >= end - pos;
        if (!blank && line >= offset && (n < 0 || line < (long)offset + n)) {
            if (d->n == cap) {
                cap = cap ? 2 * cap : 256;
                g4_gsm8k_item *items = realloc(d->items, sizeof *items * (size_t)cap);
                if (!items) return g4_fail("out of memory");
                d->items = items;
            }
            memset(&d->items[d->n], 0, sizeof d->items[d->n]);
            d->n++;
            if (parse_item(path, line, text + pos, end - pos, &d->items[d->n - 1]) != 0) return -1;
            g4_sha256_update(&sel, text + pos, end - pos);
        }
        pos = end;
    }
    d->n_lines = line;
    g4_sha256_hex(&sel, d->selected_sha256);
    if (offset >= line) return g4_fail("%s: --offset %d is past the end of the file (%d lines)", path, offset, line);
    if (d->n == 0) return g4_fail("%s: no questions in the selected lines", path);
    return 0;
}

int g4_gsm8k_data_load(const char *path, int offset, int n, g4_gsm8k_data *d) {
    memset(d, 0, sizeof *d);
    char *text;
    size_t size;
    if (g4_read_file_bounded(path, G4_READ_FILE_MAX, G4_READ_REGULAR, &text, &size) != 0) return -1;
    g4_sha256 all;
    g4_sha256_init(&all);
    g4_sha256_update(&all, text, size);
    g4_sha256_hex(&all, d->sha256);
    d->bytes = (long)size;
    int rc = select_lines(path, text, size, offset, n, d);
    free(text);
    if (rc != 0) g4_gsm8k_data_free(d);
    return rc;
}

/* ---------------------------------------------------------------- model fingerprint */

static void sha_u64(g4_sha256 *c, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    g4_sha256_update(c, b, 8);
}

/* The file's name, length and bytes, so that moving bytes between files changes the hash. */
static int sha_small_file(g4_sha256 *c, const char *dir, const char *name, int optional) {
    char path[4096];
    if (g4_path_join(path, sizeof path, dir, name) != 0) return -1;
    g4_sha256_update(c, name, strlen(name) + 1);
    if (optional && !g4_file_exists(path)) {
        sha_u64(c, UINT64_MAX);
        return 0;
    }
    char *text;
    size_t size;
    if (g4_read_file(path, &text, &size) != 0) return -1;
    sha_u64(c, size);
    g4_sha256_update(c, text, size);
    free(text);
    return 0;
}

enum { SAMPLE_BLOCKS = 16, SAMPLE_BYTES = 65536 };

/* One safetensors file: its size, header and sampled data blocks (what a single-file checkpoint's
 * fingerprint has always held, so records made before shards were handled still resume). */
static int sha_safetensors(g4_sha256 *c, const char *dir, const char *name, long long *bytes) {
    char path[4096];
    g4_mapped_file f;
    if (g4_path_join(path, sizeof path, dir, name) != 0 || g4_map_file(path, &f) != 0) return -1;
    uint64_t header = 0;
    for (int i = 0; i < 8 && f.size >= 8; i++) header |= (uint64_t)f.data[i] << (8 * i);
    if (f.size < 8 || header > f.size - 8) {
        g4_unmap_file(&f);
        return g4_fail("%s: not a safetensors file (bad header length)", path);
    }
    size_t start = 8 + (size_t)header, len = f.size - start;
    sha_u64(c, f.size);
    g4_sha256_update(c, f.data, start);
    if (len <= (size_t)SAMPLE_BLOCKS * SAMPLE_BYTES) {
        g4_sha256_update(c, f.data + start, len);
    } else {
        for (size_t j = 0; j < SAMPLE_BLOCKS; j++)
            g4_sha256_update(c, f.data + start + (len - SAMPLE_BYTES) / (SAMPLE_BLOCKS - 1) * j, SAMPLE_BYTES);
    }
    *bytes += (long long)f.size;
    g4_unmap_file(&f);
    return 0;
}

/* A sharded checkpoint (the loader's rule: model.safetensors.index.json present): the index, then
 * each shard its weight_map names, once, in order of first mention. */
static int sha_shards(g4_sha256 *c, const char *dir, long long *bytes) {
    char path[4096], *text = NULL;
    size_t size;
    if (g4_path_join(path, sizeof path, dir, "model.safetensors.index.json") != 0 || g4_read_file(path, &text, &size) != 0) return -1;
    cJSON *j = cJSON_ParseWithLength(text, size);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    int rc = cJSON_IsObject(wm) && wm->child ? 0 : g4_fail("%s: no weight_map object", path);
    if (rc == 0) {
        sha_small_file(c, dir, "model.safetensors.index.json", 0);
        for (const cJSON *e = wm->child; e && rc == 0; e = e->next) {
            if (!cJSON_IsString(e)) {
                rc = g4_fail("%s: weight_map value of %s is not a file name", path, e->string);
                break;
            }
            int seen = 0;
            for (const cJSON *p = wm->child; p != e && !seen; p = p->next) seen = strcmp(p->valuestring, e->valuestring) == 0;
            if (seen) continue;
            g4_sha256_update(c, e->valuestring, strlen(e->valuestring) + 1);
            rc = sha_safetensors(c, dir, e->valuestring, bytes);
        }
    }
    cJSON_Delete(j);
    free(text);
    return rc;
}

int g4_model_fingerprint(const char *dir, char hex[65], long long *safetensors_bytes) {
    g4_sha256 c;
    g4_sha256_init(&c);
    char index[4096];
    *safetensors_bytes = 0;
    if (g4_path_join(index, sizeof index, dir, "model.safetensors.index.json") != 0) return -1;
    int sharded = g4_file_exists(index);
    if (sha_small_file(&c, dir, "config.json", 0) || sha_small_file(&c, dir, "generation_config.json", 1) ||
        sha_small_file(&c, dir, "tokenizer.json", 0) ||
        (sharded ? sha_shards(&c, dir, safetensors_bytes) : sha_safetensors(&c, dir, "model.safetensors", safetensors_bytes)))
        return -1;
    g4_sha256_hex(&c, hex);
    return 0;
}

/* ---------------------------------------------------------------- batched greedy decoding */

/* The jobs in flight: which job each sequence of the session holds (-1: none). */
typedef struct {
    g4_session *s;
    g4_stepper *st;
    const g4_eval_job *jobs;
    int n_jobs, next_job;
    int *job_of;
    g4_generate_params gen;
    g4_eval_done_fn done;
    void *user;
} eval_runner;

/* Hands a finished job to done(); -1 when it aborts the run. */
static int report(eval_runner *r, int job, const int32_t *ids, int n, g4_stop_reason stop, double seconds) {
    g4_eval_finished f = {.job = job, .ids = ids, .n_generated = n, .stop = stop, .seconds = seconds};
    if (r->done(r->user, &f) != 0) {
        if (!*g4_last_error()) g4_fail("the evaluation was stopped");
        return -1;
    }
    return 0;
}

/* Gives sequence q the next job, in a fresh cache. A prompt longer than the context is answered
 * at once (nothing generated, stopped by the context) and the job after it taken instead. */
static int start_next(eval_runner *r, int q) {
    static const int32_t none[1] = {0};
    while (r->next_job < r->n_jobs) {
        int j = r->next_job++;
        const g4_eval_job *job = &r->jobs[j];
        if (job->n_prompt > g4_session_ctx(r->s)) {
            if (report(r, j, none, 0, G4_STOP_CONTEXT, 0) != 0) return -1;
            continue;
        }
        g4_session_reset_seq(r->s, q);
        if (g4_stepper_add(r->st, q, job->prompt, job->n_prompt, &r->gen) != 0) return -1;
        r->job_of[q] = j;
        return 0;
    }
    return 0;
}

static int finish_job(eval_runner *r, int q) {
    int n;
    const int32_t *ids = g4_stepper_tokens(r->st, q, &n);
    g4_generate_result res;
    g4_stepper_result(r->st, q, &res);
    int j = r->job_of[q];
    r->job_of[q] = -1;
    return report(r, j, ids, n, res.stop, res.prefill_s + res.decode_s);
}

static void copy_timing(const g4_stepper *st, g4_eval_timing *t) {
    g4_stepper_stats stats;
    g4_stepper_get_stats(st, &stats);
    t->generated = stats.generated;
    t->prefill_s = stats.prefill_s;
    t->decode_s = stats.decode_s;
    g4_stepper_draft_stats(st, &t->draft_rounds, &t->drafted, &t->accepted);
}

int g4_eval_greedy(g4_session *s, const g4_eval_job *jobs, int n_jobs, const g4_eval_params *p, g4_eval_done_fn done,
                   g4_eval_step_fn step_fn, void *user, g4_eval_timing *timing) {
    memset(timing, 0, sizeof *timing);
    g4_clear_error(); /* so that report() can tell whether done() explained its abort */
    if (p->max_tokens < 1) return g4_fail("the generation budget must be at least 1 token");
    int n_seq = g4_session_n_seq(s);
    eval_runner r = {.s = s, .jobs = jobs, .n_jobs = n_jobs, .done = done, .user = user,
                     .gen = {.max_tokens = p->max_tokens, .stop_ids = p->stop_ids, .n_stop_ids = p->n_stop_ids,
                             .draft = p->draft, .draft_tokens = p->draft_tokens}};
    g4_sampling_default(&r.gen.sampling); /* greedy */
    r.st = g4_stepper_new(s, 0);
    r.job_of = malloc(sizeof *r.job_of * (size_t)n_seq);
    g4_step_token *tokens = r.st ? malloc(sizeof *tokens * (size_t)g4_stepper_max_tokens(r.st)) : NULL;
    int rc = r.st && r.job_of && tokens ? 0 : g4_fail("out of memory for %d sequences", n_seq);
    for (int q = 0; rc == 0 && q < n_seq; q++) r.job_of[q] = -1;
    while (rc == 0) {
        for (int q = 0; rc == 0 && q < n_seq; q++)
            if (r.job_of[q] < 0) rc = start_next(&r, q);
        if (rc != 0 || g4_stepper_active(r.st) == 0) break;
        int n = g4_stepper_step(r.st, tokens);
        if (n < 0) rc = -1;
        for (int k = 0; rc == 0 && k < n; k++)
            if (tokens[k].finished) rc = finish_job(&r, tokens[k].seq);
        copy_timing(r.st, timing);
        if (step_fn) step_fn(user, timing);
    }
    free(tokens);
    free(r.job_of);
    g4_stepper_free(r.st);
    return rc;
}

/* ---------------------------------------------------------------- records */

/* cJSON strings end at a NUL, which a <0x00> byte token can produce: such bytes become U+FFFD,
 * before extraction, so that re-scoring the saved text gives the same answer. */
static char *without_nul(const char *text, size_t len, size_t *out_len) {
    size_t nuls = 0;
    for (size_t i = 0; i < len; i++) nuls += text[i] == 0;
    char *out = malloc(len + 2 * nuls + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < len; i++) {
        if (text[i]) {
            *o++ = text[i];
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
    }
    *o = 0;
    *out_len = (size_t)(o - out);
    return out;
}

static cJSON *record_json(const g4_gsm8k_item *item, const char *output, const g4_gsm8k_answer *a, int correct, int n_prompt,
                          const g4_eval_finished *f) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "type", "question");
    cJSON_AddNumberToObject(r, "index", item->index);
    cJSON_AddStringToObject(r, "gold", item->gold);
    cJSON_AddStringToObject(r, "output", output);
    if (a->value) cJSON_AddStringToObject(r, "answer", a->value);
    else cJSON_AddNullToObject(r, "answer");
    cJSON_AddStringToObject(r, "status", g4_gsm8k_status_name(a->status));
    cJSON_AddBoolToObject(r, "correct", correct);
    cJSON_AddNumberToObject(r, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(r, "generated_tokens", f->n_generated);
    cJSON_AddStringToObject(r, "stop", g4_stop_reason_name(f->stop));
    cJSON_AddNumberToObject(r, "seconds", floor(f->seconds * 1000 + 0.5) / 1000);
    return r;
}

cJSON *g4_gsm8k_record(const g4_gsm8k_extractor *ex, const g4_tokenizer *tok, const g4_gsm8k_item *item, int n_prompt,
                       const g4_eval_finished *f) {
    int n_text = f->n_generated - (f->stop == G4_STOP_EOS); /* the stop id is not part of the reply */
    char *raw = NULL, *text = NULL;
    size_t raw_len = 0, len = 0;
    g4_gsm8k_answer a = {0};
    cJSON *rec = NULL;
    if (g4_tokenizer_decode(tok, f->ids, (size_t)n_text, &raw, &raw_len) != 0) return NULL;
    if (!(text = without_nul(raw, raw_len, &len))) g4_fail("out of memory");
    else if (g4_gsm8k_extract(ex, text, len, &a) == 0) {
        int correct = a.value && g4_gsm8k_is_correct(a.value, item->gold);
        rec = record_json(item, text, &a, correct, n_prompt, f);
        if (!rec) g4_fail("out of memory");
    }
    g4_gsm8k_answer_free(&a);
    free(raw);
    free(text);
    return rec;
}

/* ---------------------------------------------------------------- scores and comparisons */

void g4_eval_score_results(const g4_results *r, g4_eval_score *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < r->n_q; i++) {
        const g4_result_question *q = &r->q[i];
        s->n++;
        s->correct += q->correct;
        s->budget += !strcmp(q->stop, "budget");
        s->context += !strcmp(q->stop, "context");
        s->no_number += !strcmp(q->status, "no_number");
        s->thought_unclosed += !strcmp(q->status, "thought_unclosed");
    }
    s->accuracy = s->n ? (double)s->correct / s->n : 0;
    g4_wilson95(s->correct, s->n, &s->lo, &s->hi);
}

static int by_index(const void *x, const void *y) {
    const g4_compare_row *a = x, *b = y;
    return (a->index > b->index) - (a->index < b->index);
}

static int same_answer(const char *a, const char *b) {
    return a && b ? !strcmp(a, b) : a == b;
}

static void classify(g4_compare *c, const g4_result_question *qa, const g4_result_question *qb) {
    g4_compare_row row = {qa->index, qa, qb};
    c->common++;
    c->a_correct += qa->correct;
    c->b_correct += qb->correct;
    c->gold_mismatch += strcmp(qa->gold, qb->gold) != 0;
    if (qa->correct && qb->correct) c->both_right++;
    else if (qa->correct) c->a_only[c->n_a_only++] = row;
    else if (qb->correct) c->b_only[c->n_b_only++] = row;
    else if (same_answer(qa->answer, qb->answer)) c->same_wrong[c->n_same_wrong++] = row;
    else c->different_wrong++;
}

int g4_eval_compare(const g4_results *a, const g4_results *b, g4_compare *c) {
    memset(c, 0, sizeof *c);
    c->n_a = a->n_q;
    c->n_b = b->n_q;
    size_t cap = (size_t)(a->n_q ? a->n_q : 1);
    c->a_only = malloc(sizeof *c->a_only * cap);
    c->b_only = malloc(sizeof *c->b_only * cap);
    c->same_wrong = malloc(sizeof *c->same_wrong * cap);
    if (!c->a_only || !c->b_only || !c->same_wrong) {
        g4_compare_free(c);
        return g4_fail("out of memory");
    }
    for (int i = 0; i < a->n_q; i++) {
        const g4_result_question *qb = g4_results_find(b, a->q[i].index);
        if (qb) classify(c, &a->q[i], qb);
    }
    qsort(c->a_only, (size_t)c->n_a_only, sizeof *c->a_only, by_index);
    qsort(c->b_only, (size_t)c->n_b_only, sizeof *c->b_only, by_index);
    qsort(c->same_wrong, (size_t)c->n_same_wrong, sizeof *c->same_wrong, by_index);
    c->p = g4_mcnemar_exact_p(c->n_a_only, c->n_b_only);
    return 0;
}

void g4_compare_free(g4_compare *c) {
    free(c->a_only);
    free(c->b_only);
    free(c->same_wrong);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- header comparison */

static char *json_text(const cJSON *v) {
    return v ? cJSON_PrintUnformatted(v) : strdup("absent");
}

/* "<what> is X <in_a>, Y <in_b>" ("... in the file, ... now"), malloc'd; NULL when the two values
 * are equal. */
static char *value_mismatch(const char *what, const cJSON *a, const cJSON *b, const char *in_a, const char *in_b) {
    if (a && b && cJSON_Compare(a, b, 1)) return NULL;
    char *x = json_text(a), *y = json_text(b), *msg = NULL;
    if (x && y) {
        size_t len = strlen(what) + strlen(x) + strlen(y) + strlen(in_a) + strlen(in_b) + 32;
        if ((msg = malloc(len))) snprintf(msg, len, "%s is %s %s, %s %s", what, x, in_a, y, in_b);
    }
    free(x);
    free(y);
    return msg;
}

static const cJSON *path2(const cJSON *j, const char *a, const char *b) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, a), b);
}

/* Every option of b, in b's order (so the first difference named is the first option that
 * differs), then any option that only a has. */
static char *options_mismatch(const cJSON *a, const cJSON *b, const char *in_a, const char *in_b) {
    const cJSON *oa = cJSON_GetObjectItemCaseSensitive(a, "options"), *ob = cJSON_GetObjectItemCaseSensitive(b, "options");
    char what[300];
    const cJSON *v;
    cJSON_ArrayForEach(v, ob) {
        snprintf(what, sizeof what, "option %.250s", v->string);
        char *m = value_mismatch(what, cJSON_GetObjectItemCaseSensitive(oa, v->string), v, in_a, in_b);
        if (m) return m;
    }
    cJSON_ArrayForEach(v, oa) {
        snprintf(what, sizeof what, "option %.250s", v->string ? v->string : "?");
        if (!v->string || !cJSON_GetObjectItemCaseSensitive(ob, v->string)) return value_mismatch(what, v, NULL, in_a, in_b);
    }
    return NULL;
}

char *g4_eval_header_diff(const cJSON *a, const cJSON *b, const char *in_a, const char *in_b) {
    char *m = value_mismatch("the model fingerprint", path2(a, "model", "fingerprint"), path2(b, "model", "fingerprint"), in_a, in_b);
    if (!m) m = value_mismatch("the data sha256", path2(a, "data", "sha256"), path2(b, "data", "sha256"), in_a, in_b);
    if (!m)
        m = value_mismatch("g4_version", cJSON_GetObjectItemCaseSensitive(a, "g4_version"), cJSON_GetObjectItemCaseSensitive(b, "g4_version"),
                           in_a, in_b);
    if (!m) m = options_mismatch(a, b, in_a, in_b);
    return m;
}

char *g4_eval_header_mismatch(const cJSON *in_file, const cJSON *now) {
    return g4_eval_header_diff(in_file, now, "in the file", "now");
}

/* ---------------------------------------------------------------- header and summary records */

int g4_eval_add_engine_options(cJSON *obj, const g4_options *o) {
    g4_options resolved = *o;
    g4_options_resolve(&resolved); /* as the session runs them */
    for (int i = 0; i < g4_option_count(); i++) {
        const g4_option_info *opt = g4_option_at(i);
        char v[128];
        if (opt->kind != G4_OPTION_RESULT) continue;
        if (g4_options_get(&resolved, opt->name, v, sizeof v) < 0) return -1;
        cJSON *item = opt->integer ? cJSON_CreateNumber(strtod(v, NULL)) : cJSON_CreateString(v);
        if (!item || !cJSON_AddItemToObject(obj, opt->name, item)) {
            cJSON_Delete(item);
            return g4_fail("out of memory");
        }
    }
    return 0;
}

static double round3(double x) {
    return floor(x * 1000 + 0.5) / 1000;
}

cJSON *g4_eval_summary_json(const g4_eval_score *sc, const g4_eval_timing *t, int evaluated, double wall, int batch) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "summary");
    cJSON_AddNumberToObject(s, "n", sc->n);
    cJSON_AddNumberToObject(s, "correct", sc->correct);
    cJSON_AddNumberToObject(s, "accuracy", sc->accuracy);
    cJSON_AddNumberToObject(s, "wilson95_lo", sc->lo);
    cJSON_AddNumberToObject(s, "wilson95_hi", sc->hi);
    cJSON_AddNumberToObject(s, "budget_truncated", sc->budget);
    cJSON_AddNumberToObject(s, "context_truncated", sc->context);
    cJSON_AddNumberToObject(s, "no_number", sc->no_number);
    cJSON_AddNumberToObject(s, "thought_unclosed", sc->thought_unclosed);
    /* throughput describes this invocation only: a resumed run did not time the earlier part */
    cJSON_AddNumberToObject(s, "evaluated_this_run", evaluated);
    cJSON_AddNumberToObject(s, "generated_tokens", (double)t->generated);
    cJSON_AddNumberToObject(s, "prefill_seconds", round3(t->prefill_s));
    cJSON_AddNumberToObject(s, "decode_seconds", round3(t->decode_s));
    cJSON_AddNumberToObject(s, "tokens_per_s", round3(t->decode_s > 0 ? t->generated / t->decode_s : 0));
    cJSON_AddNumberToObject(s, "wall_seconds", round3(wall));
    cJSON_AddNumberToObject(s, "batch", batch);
    return s;
}
