/* `g4 eval gsm8k`: the GSM8K quality run (shared/spec/gsm8k-protocol.md) with resume, and
 * `g4 eval compare`: the paired per-question comparison of two runs. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "eval/harness.h"
#include "eval/results.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/err.h"
#include "util/file.h"

int cmd_eval(args_t *a);

/* ---------------------------------------------------------------- options */

typedef struct {
    const char *dir, *data, *out;
    int n, offset, max_tokens, think, batch;
    int ctx_given;
    g4_options o;
} eval_args;

static const char *const onoff[] = {"off", "on", NULL};

/* Returns 1 if argv[i] was an eval flag or an engine flag; sets *bad on a bad value. */
static int eval_flag(args_t *a, eval_args *e, int *bad) {
    const char *v;
    if (flag_is(a, "-m") || flag_is(a, "--model")) e->dir = flag_value(a, "-m", bad);
    else if (flag_is(a, "--data")) e->data = flag_value(a, "--data", bad);
    else if (flag_is(a, "--out") || flag_is(a, "-o")) e->out = flag_value(a, "--out", bad);
    else if (flag_is(a, "--n")) {
        if ((v = flag_value(a, "--n", bad)) && parse_int(a->cmd, "--n", v, 1, 1 << 30, &e->n)) *bad = 1;
    } else if (flag_is(a, "--offset")) {
        if ((v = flag_value(a, "--offset", bad)) && parse_int(a->cmd, "--offset", v, 0, 1 << 30, &e->offset)) *bad = 1;
    } else if (flag_is(a, "--max-tokens")) {
        if ((v = flag_value(a, "--max-tokens", bad)) && parse_int(a->cmd, "--max-tokens", v, 1, 1 << 20, &e->max_tokens)) *bad = 1;
    } else if (flag_is(a, "--think")) {
        if ((v = flag_value(a, "--think", bad)) && parse_choice(a->cmd, "--think", v, onoff, &e->think)) *bad = 1;
    } else if (flag_is(a, "--batch")) {
        if ((v = flag_value(a, "--batch", bad)) && parse_int(a->cmd, "--batch", v, 1, 64, &e->batch)) *bad = 1;
    } else {
        e->ctx_given |= flag_is(a, "--ctx");
        return engine_flag(a, &e->o, bad);
    }
    return 1;
}

static int parse_eval(args_t *a, eval_args *e) {
    memset(e, 0, sizeof *e);
    g4_options_default(&e->o);
    e->n = -1;
    e->batch = 1;
    int bad = 0;
    for (a->i = 3; a->i < a->argc && !bad; a->i++)
        if (!eval_flag(a, e, &bad)) return unknown_flag(a);
    if (bad) return 1;
    if (!e->dir) e->dir = default_model_dir();
    if (!e->data) return die("g4 eval gsm8k needs --data FILE (GSM8K test.jsonl)%s", "");
    if (!e->out) return die("g4 eval gsm8k needs --out FILE (the results, JSON lines; rerun to resume)%s", "");
    /* the protocol's budgets (§4): 1024 new tokens thinking off, 4096 thinking on */
    if (!e->max_tokens) e->max_tokens = e->think ? 4096 : 1024;
    return 0;
}

/* ---------------------------------------------------------------- the header */

static const char *qdiv_name(const g4_options *o) {
    if (o->qdiv == G4_QDIV_DEFAULT) return o->act == G4_ACT_INT ? "recip" : "div"; /* the engine's resolution */
    return o->qdiv == G4_QDIV_DIVIDE ? "div" : "recip";
}

/* The shortest decimal that reads back as the same float, so headers stay readable. */
static void float_text(char *buf, size_t cap, float x) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, cap, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

/* Every engine option, resolved as the engine uses it. */
static void add_engine_options(cJSON *opt, const g4_options *o) {
    static const char *const acts[] = {"float", "fake", "int"}, *const kv[] = {"f32", "int8"},
                             *const placements[] = {"scaled", "raw"}, *const rounds[] = {"even", "away"},
                             *const requants[] = {"f32", "f64", "tfl-double", "tfl-single", "tfl-neon", "tfl-ref"};
    char s_in[32], s_out[32], scales[80];
    cJSON_AddStringToObject(opt, "act", acts[o->act]);
    cJSON_AddStringToObject(opt, "linear_quant", onoff[!!o->linear_quant]);
    cJSON_AddStringToObject(opt, "kv", kv[!!o->kv_quant]);
    cJSON_AddStringToObject(opt, "pmp_quant", onoff[!!o->pmp_quant]);
    cJSON_AddStringToObject(opt, "pmp_placement", placements[!!o->pmp_out_raw]);
    float_text(s_in, sizeof s_in, o->pmp_s_in);
    float_text(s_out, sizeof s_out, o->pmp_s_out);
    snprintf(scales, sizeof scales, "%s,%s", s_in, s_out);
    cJSON_AddStringToObject(opt, "pmp_scales", scales);
    cJSON_AddStringToObject(opt, "round", rounds[o->round == G4_ROUND_AWAY]);
    cJSON_AddStringToObject(opt, "qdiv", qdiv_name(o));
    cJSON_AddStringToObject(opt, "requant", requants[o->requant]);
    cJSON_AddStringToObject(opt, "lmhead_dynamic_q8", onoff[!!o->lmhead_dynamic_q8]);
}

typedef struct {
    g4_chat_form form;
    const int *stops;
    int n_stops;
} gen_setup;

static cJSON *options_json(const eval_args *e, const g4_gsm8k_data *d, const gen_setup *g) {
    cJSON *opt = cJSON_CreateObject();
    add_engine_options(opt, &e->o);
    cJSON_AddNumberToObject(opt, "max_tokens", e->max_tokens);
    cJSON_AddStringToObject(opt, "think", onoff[e->think]);
    cJSON_AddStringToObject(opt, "chat_form", g->form == G4_CHAT_FORM_E2B ? "e2b" : "26b");
    cJSON_AddStringToObject(opt, "decoding", "greedy");
    cJSON_AddItemToObject(opt, "stop_ids", cJSON_CreateIntArray(g->stops, g->n_stops));
    cJSON_AddNumberToObject(opt, "n", d->n);
    cJSON_AddNumberToObject(opt, "offset", e->offset);
    /* last, so that a mismatch names the option the user gave before the context derived from it */
    cJSON_AddNumberToObject(opt, "ctx", e->o.ctx);
    return opt;
}

static cJSON *header_json(const eval_args *e, const g4_gsm8k_data *d, const gen_setup *g) {
    char fp[65];
    long long st_bytes = 0;
    if (g4_model_fingerprint(e->dir, fp, &st_bytes) != 0) return NULL;
    cJSON *h = cJSON_CreateObject(), *model = cJSON_CreateObject(), *data = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "type", "header");
    cJSON_AddStringToObject(model, "dir", e->dir);
    cJSON_AddStringToObject(model, "fingerprint", fp);
    cJSON_AddStringToObject(model, "fingerprint_method",
                            "sha256 of config.json, generation_config.json, tokenizer.json, and of model.safetensors (or "
                            "the index and each shard) the size, header and 16 sampled 64 KiB blocks");
    cJSON_AddNumberToObject(model, "safetensors_bytes", (double)st_bytes);
    cJSON_AddItemToObject(h, "model", model);
    cJSON_AddStringToObject(data, "path", e->data);
    cJSON_AddStringToObject(data, "sha256", d->sha256);
    cJSON_AddNumberToObject(data, "bytes", (double)d->bytes);
    cJSON_AddNumberToObject(data, "lines", d->n_lines);
    cJSON_AddStringToObject(data, "selected_sha256", d->selected_sha256);
    cJSON_AddItemToObject(h, "data", data);
    cJSON_AddItemToObject(h, "options", options_json(e, d, g));
    cJSON_AddStringToObject(h, "g4_version", G4_VERSION);
    return h;
}

/* ---------------------------------------------------------------- the run */

typedef struct {
    eval_args *e;
    g4_model *m;
    g4_tokenizer *tok;
    g4_gsm8k_extractor *ex;
    g4_gsm8k_data data;
    gen_setup gen;
    int32_t **prompts;
    int *n_prompts;
    g4_results prev;   /* what the output file already held */
    FILE *out;
    /* the questions of this invocation, and its progress */
    g4_eval_job *jobs;
    int *job_item;     /* data item of each job */
    int n_jobs, finished, correct;
    double t0, last_draw;
    int tty;
} eval_run;

static void eval_run_free(eval_run *r) {
    for (int i = 0; r->prompts && i < r->data.n; i++) free(r->prompts[i]);
    free(r->prompts);
    free(r->n_prompts);
    free(r->jobs);
    free(r->job_item);
    if (r->out) fclose(r->out);
    g4_results_free(&r->prev);
    g4_gsm8k_data_free(&r->data);
    g4_gsm8k_extractor_close(r->ex);
    g4_tokenizer_free(r->tok);
    g4_model_free(r->m);
}

static int open_model(eval_run *r) {
    char path[4096];
    if (!(r->m = load_model(r->e->dir))) return -1;
    if (g4_path_join(path, sizeof path, r->e->dir, "tokenizer.json") != 0 || !(r->tok = g4_tokenizer_load(path))) return -1;
    if (g4_gsm8k_extractor_open(&r->ex) != 0) return -1;
    /* E2B/E4B and 26B/31B render "thinking off" differently: the checkpoint's template says which */
    if (g4_model_chat_form(r->m, &r->gen.form) != 0) return -1;
    r->gen.n_stops = g4_model_stop_ids(r->m, &r->gen.stops);
    return 0;
}

/* The §2 prompt of every selected question in the model's chat form; sets the context to the
 * longest prompt plus the budget unless --ctx was given, so no reply is cut by the context. */
static int encode_prompts(eval_run *r) {
    int n = r->data.n, longest = 0;
    g4_chat_options chat = g4_chat_default_options();
    chat.form = r->gen.form;
    chat.thinking = r->e->think;
    r->prompts = calloc((size_t)n, sizeof *r->prompts);
    r->n_prompts = calloc((size_t)n, sizeof *r->n_prompts);
    if (!r->prompts || !r->n_prompts) return g4_fail("out of memory");
    for (int i = 0; i < n; i++) {
        char *text = g4_gsm8k_prompt(r->data.items[i].question);
        g4_chat_message msg = {G4_CHAT_USER, text};
        size_t n_ids = 0;
        int rc = text ? g4_chat_encode(r->tok, &msg, 1, &chat, &r->prompts[i], &n_ids) : g4_fail("out of memory");
        free(text);
        if (rc != 0) return -1;
        r->n_prompts[i] = (int)n_ids;
        if ((int)n_ids > longest) longest = (int)n_ids;
    }
    if (!r->e->ctx_given) r->e->o.ctx = longest + r->e->max_tokens;
    return 0;
}

/* Writes one record as one line, flushed, so that a kill leaves at most one partial line. */
static int write_record(FILE *f, const cJSON *rec, const char *path) {
    char *line = cJSON_PrintUnformatted(rec);
    int ok = line && fprintf(f, "%s\n", line) >= 0 && fflush(f) == 0;
    free(line);
    return ok ? 0 : g4_fail("%s: cannot write: %s", path, strerror(errno));
}

/* Opens (or creates) the results file for appending, with a write lock, so that a second run
 * on the same file is refused instead of interleaving duplicate records. */
static int open_locked(eval_run *r) {
    const char *path = r->e->out;
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return g4_fail("%s: cannot open: %s", path, strerror(errno));
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &lock) != 0) {
        close(fd);
        return g4_fail("%s is in use by another g4 eval (it holds the lock)", path);
    }
    if (!(r->out = fdopen(fd, "a"))) {
        close(fd);
        return g4_fail("%s: cannot open: %s", path, strerror(errno));
    }
    return 0;
}

/* 1 if a question with this index is among the selected ones (items are sorted by index). */
static int selected(const g4_gsm8k_data *d, int index) {
    int lo = 0, hi = d->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (d->items[mid].index == index) return 1;
        if (d->items[mid].index < index) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

/* Continues what the file holds (nothing, for a new one) after checking that it is the same
 * experiment: the records already there are kept, an interrupted last line and an old
 * summary are cut off. */
static int open_output(eval_run *r, const cJSON *header) {
    const char *path = r->e->out;
    if (open_locked(r) != 0 || g4_results_read(path, G4_RESULTS_DROP_UNTERMINATED, &r->prev) != 0) return -1;
    if (r->prev.header) {
        char *diff = g4_eval_header_mismatch(r->prev.header, header);
        if (diff) {
            g4_fail("%s holds a run with different settings: %s (rerun with the same options and data, or choose another --out)",
                    path, diff);
            free(diff);
            return -1;
        }
    }
    for (int i = 0; i < r->prev.n_q; i++)
        if (!selected(&r->data, r->prev.q[i].index))
            return g4_fail("%s:%d: question %d is not among the selected questions", path, r->prev.q[i].line, r->prev.q[i].index);
    long keep = r->prev.header ? r->prev.append_offset : 0;
    if (ftruncate(fileno(r->out), keep) != 0) return g4_fail("%s: cannot truncate: %s", path, strerror(errno));
    if (r->prev.dropped_tail_line)
        g4_warn("%s: line %d was cut short (an interrupted run); that question runs again", path, r->prev.dropped_tail_line);
    return r->prev.header ? 0 : write_record(r->out, header, path);
}

/* The questions not in the file yet, in index order. */
static int plan_jobs(eval_run *r) {
    int n = r->data.n;
    r->jobs = malloc(sizeof *r->jobs * (size_t)n);
    r->job_item = malloc(sizeof *r->job_item * (size_t)n);
    if (!r->jobs || !r->job_item) return g4_fail("out of memory");
    for (int i = 0; i < n; i++) {
        if (g4_results_find(&r->prev, r->data.items[i].index)) continue;
        r->jobs[r->n_jobs] = (g4_eval_job){r->prompts[i], r->n_prompts[i]};
        r->job_item[r->n_jobs++] = i;
    }
    return 0;
}

/* ---- progress (stderr, terminals only) ---- */

static void draw_progress(eval_run *r, long generated) {
    double now = now_s(), elapsed = now - r->t0;
    int done = r->prev.n_q + r->finished, total = r->data.n, width = 30, fill = total ? done * width / total : width;
    char bar[64], eta[32] = "--";
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    if (r->finished > 0) {
        long left = (long)((r->n_jobs - r->finished) * (elapsed / r->finished));
        snprintf(eta, sizeof eta, "%ld:%02ld:%02ld", left / 3600, left / 60 % 60, left % 60);
    }
    fprintf(stderr, "\r[%s] %d/%d  acc %.1f%%  %.1f tok/s  ETA %s\033[K", bar, done, total,
            r->finished ? 100.0 * r->correct / r->finished : 0.0, elapsed > 0 ? generated / elapsed : 0.0, eta);
    fflush(stderr);
    r->last_draw = now;
}

static void on_step(void *user, const g4_eval_timing *t) {
    eval_run *r = user;
    if (r->tty && now_s() - r->last_draw >= 0.25) draw_progress(r, t->generated);
}

static int on_done(void *user, const g4_eval_finished *f) {
    eval_run *r = user;
    int item = r->job_item[f->job];
    cJSON *rec = g4_gsm8k_record(r->ex, r->tok, &r->data.items[item], r->n_prompts[item], f);
    int rc = rec ? write_record(r->out, rec, r->e->out) : -1;
    if (rc == 0) {
        r->finished++;
        r->correct += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "correct"));
    }
    cJSON_Delete(rec);
    return rc;
}

static int run_jobs(eval_run *r, g4_eval_timing *t) {
    memset(t, 0, sizeof *t);
    if (r->n_jobs == 0) return 0;
    g4_options o = r->e->o;
    o.n_seq = r->e->batch < r->n_jobs ? r->e->batch : r->n_jobs; /* no KV cache for slots that would stay empty */
    g4_session *s = g4_session_new(r->m, &o);
    if (!s) return -1;
    g4_eval_params p = {.max_tokens = r->e->max_tokens, .stop_ids = r->gen.stops, .n_stop_ids = r->gen.n_stops};
    int rc = g4_eval_greedy(s, r->jobs, r->n_jobs, &p, on_done, on_step, r, t);
    if (r->tty) {
        draw_progress(r, t->generated); /* the final state, not the last throttled one */
        fputc('\n', stderr);
    }
    g4_session_free(s);
    return rc;
}

/* ---- summary ---- */

static double round3(double x) {
    return floor(x * 1000 + 0.5) / 1000;
}

static cJSON *summary_json(const g4_eval_score *sc, const g4_eval_timing *t, int evaluated, double wall, int batch) {
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

static void print_summary(const g4_eval_score *sc, const g4_eval_timing *t, int evaluated, double wall, const eval_args *e) {
    fprintf(stderr, "g4 eval: gsm8k %d/%d correct = %.1f%% (95%% Wilson interval %.1f-%.1f)\n", sc->correct, sc->n,
            100 * sc->accuracy, 100 * sc->lo, 100 * sc->hi);
    fprintf(stderr, "g4 eval: cut by the budget of %d tokens: %d, by the context: %d; no number: %d; thought unclosed: %d\n",
            e->max_tokens, sc->budget, sc->context, sc->no_number, sc->thought_unclosed);
    fprintf(stderr, "g4 eval: this run: %d questions, %ld tokens in %.1f s of decoding = %.1f tokens/s (prefill %.1f s), wall %.1f s, batch %d\n",
            evaluated, t->generated, t->decode_s, t->decode_s > 0 ? t->generated / t->decode_s : 0.0, t->prefill_s, wall, e->batch);
    if (sc->n && sc->budget * 100 > sc->n)
        g4_warn("%d of %d replies (more than 1%%) hit the --max-tokens budget: raise it and rerun (protocol section 4)", sc->budget, sc->n);
}

/* Scores the whole file (earlier runs included) and appends the summary record. */
static int finish_output(eval_run *r, const g4_eval_timing *t, double wall) {
    g4_results all;
    if (g4_results_read(r->e->out, 0, &all) != 0) return -1;
    g4_eval_score sc;
    g4_eval_score_results(&all, &sc);
    g4_results_free(&all);
    cJSON *summary = summary_json(&sc, t, r->finished, wall, r->e->batch);
    int rc = write_record(r->out, summary, r->e->out);
    cJSON_Delete(summary);
    if (rc == 0) print_summary(&sc, t, r->finished, wall, r->e);
    return rc;
}

static int eval_gsm8k(eval_run *r) {
    cJSON *header = NULL;
    g4_eval_timing t;
    int rc = -1;
    if (g4_gsm8k_data_load(r->e->data, r->e->offset, r->e->n, &r->data) != 0 || open_model(r) != 0 || encode_prompts(r) != 0)
        return -1;
    if (!(header = header_json(r->e, &r->data, &r->gen)) || open_output(r, header) != 0 || plan_jobs(r) != 0) goto done;
    fprintf(stderr, "g4 eval: %d questions (q%d-q%d), %d already in %s, %d to run, batch %d, context %d\n", r->data.n,
            r->data.items[0].index, r->data.items[r->data.n - 1].index, r->prev.n_q, r->e->out, r->n_jobs, r->e->batch,
            r->e->o.ctx);
    r->tty = isatty(2);
    r->t0 = now_s();
    if (run_jobs(r, &t) != 0) goto done;
    rc = finish_output(r, &t, now_s() - r->t0);
done:
    cJSON_Delete(header);
    return rc;
}

static int cmd_eval_gsm8k(args_t *a) {
    eval_args e;
    if (parse_eval(a, &e) != 0) return 1;
    eval_run r;
    memset(&r, 0, sizeof r);
    r.e = &e;
    int rc = eval_gsm8k(&r);
    eval_run_free(&r);
    return rc == 0 ? 0 : die_lib();
}

/* ---------------------------------------------------------------- compare */

static const char *answer_text(const char *answer) {
    return answer ? answer : "(none)";
}

static void print_rows(const char *title, const g4_compare_row *rows, int n, int both) {
    printf("\n%s: %d\n", title, n);
    if (n == 0) return;
    if (both) printf("  %-8s %-14s %-14s %s\n", "index", "A answer", "B answer", "gold");
    else printf("  %-8s %-14s %s\n", "index", "answer", "gold");
    for (int i = 0; i < n; i++) {
        char idx[16];
        snprintf(idx, sizeof idx, "q%d", rows[i].index);
        if (both) printf("  %-8s %-14s %-14s %s\n", idx, answer_text(rows[i].a->answer), answer_text(rows[i].b->answer), rows[i].a->gold);
        else printf("  %-8s %-14s %s\n", idx, answer_text(rows[i].a->answer), rows[i].a->gold);
    }
}

/* Lists every option (and the model and data) on which the two runs differ. */
static void print_setting_differences(const cJSON *ha, const cJSON *hb) {
    const cJSON *oa = cJSON_GetObjectItemCaseSensitive(ha, "options"), *ob = cJSON_GetObjectItemCaseSensitive(hb, "options"), *v;
    int any = 0;
    cJSON_ArrayForEach(v, oa) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(ob, v->string);
        if (w && cJSON_Compare(v, w, 1)) continue;
        char *x = cJSON_PrintUnformatted(v), *y = w ? cJSON_PrintUnformatted(w) : NULL;
        printf("%s%s %s vs %s", any++ ? ", " : "settings that differ: ", v->string, x ? x : "?", y ? y : "absent");
        free(x);
        free(y);
    }
    const char *fields[][2] = {{"model", "fingerprint"}, {"data", "sha256"}};
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ha, fields[i][0]), fields[i][1]);
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(hb, fields[i][0]), fields[i][1]);
        if (!x || !y || !cJSON_Compare(x, y, 1)) printf("%s%s", any++ ? ", " : "settings that differ: ", fields[i][0]);
    }
    if (any) printf("\n");
}

static void print_compare(const g4_results *a, const g4_results *b, const g4_compare *c) {
    double la, ha, lb, hb;
    g4_wilson95(c->a_correct, c->common, &la, &ha);
    g4_wilson95(c->b_correct, c->common, &lb, &hb);
    printf("A: %s (%d questions)\nB: %s (%d questions)\n", a->path, c->n_a, b->path, c->n_b);
    print_setting_differences(a->header, b->header);
    printf("common questions: %d (only in A: %d, only in B: %d); only these count\n", c->common, c->n_a - c->common, c->n_b - c->common);
    if (c->common == 0) return;
    printf("accuracy: A %d/%d = %.1f%% [%.1f, %.1f], B %d/%d = %.1f%% [%.1f, %.1f]; B - A = %+.1f points\n", c->a_correct,
           c->common, 100.0 * c->a_correct / c->common, 100 * la, 100 * ha, c->b_correct, c->common, 100.0 * c->b_correct / c->common,
           100 * lb, 100 * hb, 100.0 * (c->b_correct - c->a_correct) / c->common);
    print_rows("right in A, wrong in B", c->a_only, c->n_a_only, 1);
    print_rows("right in B, wrong in A", c->b_only, c->n_b_only, 1);
    print_rows("both wrong with the same answer", c->same_wrong, c->n_same_wrong, 0);
    printf("\nboth right: %d; both wrong with different answers: %d\n", c->both_right, c->different_wrong);
    printf("McNemar exact test (two-sided) on b = %d, c = %d: p = %.4g\n", c->n_a_only, c->n_b_only, c->p);
    if (c->gold_mismatch) g4_warn("%d common questions have different gold answers: the runs used different data", c->gold_mismatch);
}

static int read_for_compare(const char *path, g4_results *r) {
    if (g4_results_read(path, 0, r) != 0) return -1;
    if (r->dropped_tail_line) g4_warn("%s: line %d is incomplete (a run in progress?) and is left out", path, r->dropped_tail_line);
    return 0;
}

static int cmd_eval_compare(args_t *a) {
    if (a->argc != 5) return die("usage: g4 eval compare A.jsonl B.jsonl%s", "");
    g4_results ra, rb;
    g4_compare c;
    memset(&rb, 0, sizeof rb);
    int rc = read_for_compare(a->argv[3], &ra);
    if (rc == 0 && (rc = read_for_compare(a->argv[4], &rb)) != 0) g4_results_free(&ra);
    if (rc != 0) return die_lib();
    if ((rc = g4_eval_compare(&ra, &rb, &c)) == 0) {
        print_compare(&ra, &rb, &c);
        g4_compare_free(&c);
    }
    g4_results_free(&ra);
    g4_results_free(&rb);
    return rc == 0 ? 0 : die_lib();
}

/* ---------------------------------------------------------------- dispatch */

int cmd_eval(args_t *a) {
    const char *sub = a->argc > 2 ? a->argv[2] : "";
    if (!strcmp(sub, "gsm8k")) return cmd_eval_gsm8k(a);
    if (!strcmp(sub, "compare")) return cmd_eval_compare(a);
    return die("g4 eval needs a task: gsm8k -m DIR --data FILE --out FILE [...], or compare A.jsonl B.jsonl (got \"%s\")", sub);
}
