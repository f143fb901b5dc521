/* `g4 eval gsm8k`: the GSM8K quality run (shared/spec/gsm8k-protocol.md) with resume and shards,
 * `g4 eval merge`: a run's shards into one file, and `g4 eval compare`: the paired per-question
 * comparison of two runs. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "g4dev.h"

int cmd_eval(args_t *a);

/* ---------------------------------------------------------------- options */

enum { PROGRESS_AUTO, PROGRESS_ON, PROGRESS_OFF };

typedef struct {
    const char *dir, *data, *out;
    int n, offset, max_tokens, think, batch;
    int shard, n_shards; /* --shard I/N: the questions qK with K mod N = I */
    int progress;        /* PROGRESS_*: auto is on when stderr is a terminal */
    int ctx_given;
    g4_options o;
    draft_args draft; /* --draft: faster, the same answers (greedy); not part of the run's options */
} eval_args;

static const char *const onoff[] = {"off", "on", NULL};
static const char *const progress_modes[] = {"auto", "on", "off", NULL};

/* ---------------------------------------------------------------- usage */

const command_usage usage_eval = {
    "eval gsm8k [flags] | merge OUT.jsonl SHARD.jsonl... | compare A.jsonl B.jsonl",
    "Quality runs: g4 eval gsm8k --help, g4 eval merge --help, g4 eval compare --help.",
    (const usage_line[]){{NULL, NULL}},
    0,
};

const command_usage usage_eval_gsm8k = {
    "eval gsm8k [-m DIR] [--data test.jsonl] --out run.jsonl [flags]",
    "GSM8K quality run (the protocol's prompt, greedy, its answer extractor): one JSON record per question in --out,\n"
    "written as it is done; rerun the same command to resume. The run holds a lock on --out to its end.",
    (const usage_line[]){
        {"-m, --model DIR", "the checkpoint folder (default: the built-in model)"},
        {"--data FILE", "GSM8K-format JSON lines (default: the model folder's test.jsonl when it has one)"},
        {"-o, --out FILE", "the results, JSON lines (a regular file; rerun to resume)"},
        {"--n N", "the first N questions of the selection (default: all)"},
        {"--offset K", "start at line K of --data (0-based)"},
        {"--max-tokens N", "the budget of a reply (default 1024 thinking off, 4096 on)"},
        {"--think off|on", "thinking (default off)"},
        {"--batch B", "decode B questions at once (1-64; the same records)"},
        {"--shard I/N", "run only the questions qK with K mod N = I"},
        {"--progress auto|on|off", "a progress line on stderr (auto: on a terminal)"},
        {NULL, NULL},
    },
    USAGE_ENGINE | USAGE_DRAFT,
};

const command_usage usage_eval_merge = {
    "eval merge OUT.jsonl SHARD.jsonl...",
    "The finished shards of one run into the file the unsharded run writes (OUT must not exist).",
    (const usage_line[]){{NULL, NULL}},
    0,
};

const command_usage usage_eval_compare = {
    "eval compare A.jsonl B.jsonl",
    "Per-question differences of two runs, the accuracy delta and the exact McNemar p-value.",
    (const usage_line[]){{NULL, NULL}},
    0,
};

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
    } else if (flag_is(a, "--shard")) {
        if ((v = flag_value(a, "--shard", bad)) && g4_eval_parse_shard(v, &e->shard, &e->n_shards) != 0) {
            fprintf(stderr, "g4 %s: error: --shard %s\n", a->cmd, g4_last_error());
            *bad = 1;
        }
    } else if (flag_is(a, "--progress")) {
        if ((v = flag_value(a, "--progress", bad)) && parse_choice(a->cmd, "--progress", v, progress_modes, &e->progress)) *bad = 1;
    } else if (!draft_flag(a, &e->draft, bad)) {
        e->ctx_given |= flag_is(a, "--ctx");
        return engine_flag(a, &e->o, bad);
    }
    return 1;
}

/* The test set a model folder ships (DIR/test.jsonl, as models/gemma4-tiny-math does), if any. */
static int model_test_set(eval_args *e) {
    static char path[4096];
    if (g4_path_join(path, sizeof path, e->dir, "test.jsonl") != 0) return -1;
    if (g4_file_exists(path)) e->data = path;
    return 0;
}

static int parse_eval(args_t *a, eval_args *e) {
    memset(e, 0, sizeof *e);
    g4_options_default(&e->o);
    e->n = -1;
    e->batch = 1;
    e->n_shards = 1;
    int bad = 0;
    for (a->i = 3; a->i < a->argc && !bad; a->i++)
        if (!eval_flag(a, e, &bad)) return unknown_flag(a);
    if (bad) return 1;
    if (!e->dir) e->dir = default_model_dir();
    if (!e->data && model_test_set(e) != 0) return die_lib();
    if (!e->data) return die("g4 eval gsm8k needs --data FILE (GSM8K test.jsonl; %s has no test.jsonl)", e->dir);
    if (!e->out) return die("g4 eval gsm8k needs --out FILE (the results, JSON lines; rerun to resume)%s", "");
    /* the protocol's budgets (§4): 1024 new tokens thinking off, 4096 thinking on */
    if (!e->max_tokens) e->max_tokens = e->think ? 4096 : 1024;
    return 0;
}

/* ---------------------------------------------------------------- the header */

typedef struct {
    g4_chat_form form;
    const int *stops;
    int n_stops;
} gen_setup;

/* The eval's own options, then the engine's from the options table (ctx, which eval derives
 * from the prompts and the budget, last): a resume with a changed flag is refused naming that
 * flag's option, not the context derived from it. */
static cJSON *options_json(const eval_args *e, const g4_gsm8k_data *d, const gen_setup *g) {
    cJSON *opt = cJSON_CreateObject();
    cJSON_AddNumberToObject(opt, "max_tokens", e->max_tokens);
    cJSON_AddStringToObject(opt, "think", onoff[e->think]);
    cJSON_AddStringToObject(opt, "chat_form", g->form == G4_CHAT_FORM_E2B ? "e2b" : "26b");
    cJSON_AddStringToObject(opt, "decoding", "greedy");
    cJSON_AddItemToObject(opt, "stop_ids", cJSON_CreateIntArray(g->stops, g->n_stops));
    cJSON_AddNumberToObject(opt, "n", d->n);
    cJSON_AddNumberToObject(opt, "offset", e->offset);
    if (e->n_shards > 1) { /* absent from unsharded runs, which g4 eval merge writes */
        char shard[32];
        snprintf(shard, sizeof shard, "%d/%d", e->shard, e->n_shards);
        cJSON_AddStringToObject(opt, "shard", shard);
    }
    if (g4_eval_add_engine_options(opt, &e->o) != 0) {
        cJSON_Delete(opt);
        return NULL;
    }
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
    cJSON *opt = options_json(e, d, g);
    if (!opt) {
        cJSON_Delete(h);
        return NULL;
    }
    cJSON_AddItemToObject(h, "options", opt);
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
    int created;       /* this run created the results file */
    int n_shard;       /* the selected questions in this shard (all of them unsharded) */
    int prev_correct;  /* of the records already in the file */
    /* the questions of this invocation, and its progress */
    g4_eval_job *jobs;
    int *job_item;     /* data item of each job */
    int n_jobs, finished, correct;
    double t0, last_draw;
    int progress, tty; /* a progress display, redrawn in place on a terminal, else a line now and then */
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
    g4_checkpoint ck;
    if (g4_checkpoint_open(&ck, r->e->dir, &r->e->o, NULL) != 0) return -1;
    r->m = ck.model, r->tok = ck.tok; /* eval_run_free frees them */
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

/* Opens (or creates) the results file for appending, locked for the whole run, so that a second
 * run on the same file is refused at once instead of interleaving duplicate records. flock, not
 * fcntl: an fcntl lock is dropped when the process closes any descriptor of the file, which
 * reading it back (resume, the summary) does. A results file must be a regular file: a device
 * would be read back endlessly (/dev/zero) or refuse every write (/dev/full). */
static int open_locked(eval_run *r) {
    const char *path = r->e->out;
    int fd = open(path, O_RDWR | O_APPEND);
    if (fd < 0 && errno == ENOENT && (fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_EXCL, 0644)) >= 0) r->created = 1;
    if (fd < 0 && errno == EEXIST) fd = open(path, O_RDWR | O_APPEND); /* created meanwhile by another run */
    if (fd < 0) return g4_fail("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ? g4_fail("--out %s: not a regular file", path)
             : flock(fd, LOCK_EX | LOCK_NB) != 0         ? g4_fail("%s is in use by another g4 eval (it holds the lock)", path)
             : !(r->out = fdopen(fd, "a"))               ? g4_fail("%s: cannot open: %s", path, strerror(errno))
                                                         : 0;
    if (rc != 0) close(fd);
    return rc;
}

/* A results file this run created and wrote nothing to goes again when the run fails early (a bad
 * model, data that does not encode): a failed run leaves no file behind. */
static void remove_if_unused(eval_run *r) {
    struct stat st;
    if (r->created && r->out && fstat(fileno(r->out), &st) == 0 && st.st_size == 0) unlink(r->e->out);
}

static int in_this_shard(const eval_args *e, int index) {
    return g4_eval_in_shard(index, e->shard, e->n_shards);
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
    if (g4_results_read(path, G4_RESULTS_DROP_UNTERMINATED, &r->prev) != 0) return -1;
    if (r->prev.header) {
        char *diff = g4_eval_header_mismatch(r->prev.header, header);
        if (diff) {
            g4_fail("%s holds a run with different settings: %s (rerun with the same options and data, or choose another --out)",
                    path, diff);
            free(diff);
            return -1;
        }
    }
    for (int i = 0; i < r->prev.n_q; i++) {
        if (!selected(&r->data, r->prev.q[i].index))
            return g4_fail("%s:%d: question %d is not among the selected questions", path, r->prev.q[i].line, r->prev.q[i].index);
        if (!in_this_shard(r->e, r->prev.q[i].index))
            return g4_fail("%s:%d: question %d is not in shard %d/%d", path, r->prev.q[i].line, r->prev.q[i].index, r->e->shard,
                           r->e->n_shards);
        r->prev_correct += r->prev.q[i].correct;
    }
    long keep = r->prev.header ? r->prev.append_offset : 0;
    if (ftruncate(fileno(r->out), keep) != 0) return g4_fail("%s: cannot truncate: %s", path, strerror(errno));
    if (r->prev.dropped_tail_line)
        g4_warn("%s: line %d was cut short (an interrupted run); that question runs again", path, r->prev.dropped_tail_line);
    return r->prev.header ? 0 : write_record(r->out, header, path);
}

/* This shard's questions not in the file yet, in index order. */
static int plan_jobs(eval_run *r) {
    int n = r->data.n;
    r->jobs = malloc(sizeof *r->jobs * (size_t)n);
    r->job_item = malloc(sizeof *r->job_item * (size_t)n);
    if (!r->jobs || !r->job_item) return g4_fail("out of memory");
    for (int i = 0; i < n; i++) {
        if (!in_this_shard(r->e, r->data.items[i].index)) continue;
        r->n_shard++;
        if (g4_results_find(&r->prev, r->data.items[i].index)) continue;
        r->jobs[r->n_jobs] = (g4_eval_job){r->prompts[i], r->n_prompts[i]};
        r->job_item[r->n_jobs++] = i;
    }
    return 0;
}

/* ---- progress, on stderr (stdout stays free for what a command prints) ---- */

/* A line at most this often when stderr is not a terminal (a log file, GNU parallel, Slurm),
 * redrawn this often on one. */
#define PROGRESS_LINE_S 10.0
#define PROGRESS_DRAW_S 0.25

/* "3/8 done, acc 66.7%, 512.3 tok/s, ETA 0:00:05": the shard's questions done (earlier runs'
 * included) and their accuracy, this run's generated tokens per second of wall time, and the
 * time left at this run's pace. */
static void progress_text(const eval_run *r, long generated, char *buf, size_t cap) {
    double elapsed = now_s() - r->t0;
    int done = r->prev.n_q + r->finished, right = r->prev_correct + r->correct;
    char eta[32] = "--";
    if (r->finished > 0) {
        long left = (long)((r->n_jobs - r->finished) * (elapsed / r->finished));
        snprintf(eta, sizeof eta, "%ld:%02ld:%02ld", left / 3600, left / 60 % 60, left % 60);
    }
    snprintf(buf, cap, "%d/%d done, acc %.1f%%, %.1f tok/s, ETA %s", done, r->n_shard, done ? 100.0 * right / done : 0.0,
             elapsed > 0 ? generated / elapsed : 0.0, eta);
}

static void draw_progress(eval_run *r, long generated) {
    char text[160], shard[48] = "";
    progress_text(r, generated, text, sizeof text);
    if (r->e->n_shards > 1) snprintf(shard, sizeof shard, "shard %d/%d: ", r->e->shard, r->e->n_shards);
    if (r->tty) {
        int done = r->prev.n_q + r->finished, width = 30, fill = r->n_shard ? done * width / r->n_shard : width;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\r%s[%s] %s\033[K", shard, bar, text);
    } else {
        fprintf(stderr, "g4 eval: %s%s\n", shard, text);
    }
    fflush(stderr);
    r->last_draw = now_s();
}

static void on_step(void *user, const g4_eval_timing *t) {
    eval_run *r = user;
    if (r->progress && now_s() - r->last_draw >= (r->tty ? PROGRESS_DRAW_S : PROGRESS_LINE_S)) draw_progress(r, t->generated);
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
    draft_args draft = r->e->draft;
    if (draft_open(&draft, r->m, s) != 0) {
        draft_close(&draft);
        g4_session_free(s);
        return -1;
    }
    g4_eval_params p = {.max_tokens = r->e->max_tokens, .stop_ids = r->gen.stops, .n_stop_ids = r->gen.n_stops,
                        .draft = draft.dr, .draft_tokens = draft.tokens};
    r->last_draw = now_s(); /* the first line after an interval, not at once */
    int rc = g4_eval_greedy(s, r->jobs, r->n_jobs, &p, on_done, on_step, r, t);
    if (r->progress) {
        draw_progress(r, t->generated); /* the final state, not the last throttled one */
        if (r->tty) fputc('\n', stderr);
    }
    draft_close(&draft);
    g4_session_free(s);
    return rc;
}

/* ---- summary ---- */

static void print_summary(const g4_eval_score *sc, const g4_eval_timing *t, int evaluated, double wall, const eval_args *e) {
    fprintf(stderr, "g4 eval: gsm8k %d/%d correct = %.1f%% (95%% Wilson interval %.1f-%.1f)\n", sc->correct, sc->n,
            100 * sc->accuracy, 100 * sc->lo, 100 * sc->hi);
    fprintf(stderr, "g4 eval: cut by the budget of %d tokens: %d, by the context: %d; no number: %d; thought unclosed: %d\n",
            e->max_tokens, sc->budget, sc->context, sc->no_number, sc->thought_unclosed);
    fprintf(stderr, "g4 eval: this run: %d questions, %ld tokens in %.1f s of decoding = %.1f tokens/s (prefill %.1f s), wall %.1f s, batch %d\n",
            evaluated, t->generated, t->decode_s, t->decode_s > 0 ? t->generated / t->decode_s : 0.0, t->prefill_s, wall, e->batch);
    if (t->drafted)
        fprintf(stderr, "g4 eval: drafting: %ld rounds, %ld of %ld drafts accepted (%.3f), %.2f tokens a round\n", t->draft_rounds, t->accepted,
                t->drafted, (double)t->accepted / t->drafted, t->draft_rounds ? (double)(t->accepted + t->draft_rounds) / t->draft_rounds : 0.0);
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
    cJSON *summary = g4_eval_summary_json(&sc, t, r->finished, wall, r->e->batch);
    int rc = write_record(r->out, summary, r->e->out);
    cJSON_Delete(summary);
    if (rc == 0) print_summary(&sc, t, r->finished, wall, r->e);
    return rc;
}

static int eval_gsm8k(eval_run *r) {
    cJSON *header = NULL;
    g4_eval_timing t;
    int rc = -1;
    /* the lock before the model: a second run on the file stops at once */
    if (g4_gsm8k_data_load(r->e->data, r->e->offset, r->e->n, &r->data) != 0 || open_locked(r) != 0 || open_model(r) != 0 ||
        encode_prompts(r) != 0)
        goto done;
    if (!(header = header_json(r->e, &r->data, &r->gen)) || open_output(r, header) != 0 || plan_jobs(r) != 0) goto done;
    char shard[80] = "";
    if (r->e->n_shards > 1) snprintf(shard, sizeof shard, ", shard %d/%d: %d of them", r->e->shard, r->e->n_shards, r->n_shard);
    fprintf(stderr, "g4 eval: %d questions (q%d-q%d)%s, %d already in %s, %d to run, batch %d, context %d\n", r->data.n,
            r->data.items[0].index, r->data.items[r->data.n - 1].index, shard, r->prev.n_q, r->e->out, r->n_jobs, r->e->batch,
            r->e->o.ctx);
    r->tty = isatty(2);
    r->progress = r->e->progress == PROGRESS_ON || (r->e->progress == PROGRESS_AUTO && r->tty);
    r->t0 = now_s();
    if (run_jobs(r, &t) != 0) goto done;
    rc = finish_output(r, &t, now_s() - r->t0);
done:
    if (rc != 0) remove_if_unused(r);
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

/* ---------------------------------------------------------------- merge */

static int cmd_eval_merge(args_t *a) {
    if (a->argc < 5) return die("usage: g4 eval merge OUT.jsonl SHARD.jsonl...%s", "");
    g4_eval_score sc;
    int n_in = a->argc - 4;
    if (g4_eval_merge(a->argv[3], (const char *const *)(a->argv + 4), n_in, &sc) != 0) return die_lib();
    fprintf(stderr, "g4 eval merge: %d file%s, %d questions into %s: %d/%d correct = %.1f%% (95%% Wilson interval %.1f-%.1f)\n", n_in,
            n_in == 1 ? "" : "s", sc.n, a->argv[3], sc.correct, sc.n, 100 * sc.accuracy, 100 * sc.lo, 100 * sc.hi);
    return 0;
}

/* ---------------------------------------------------------------- dispatch */

int cmd_eval(args_t *a) {
    const char *sub = a->argc > 2 ? a->argv[2] : "";
    if (!strcmp(sub, "gsm8k")) return cmd_eval_gsm8k(a);
    if (!strcmp(sub, "merge")) return cmd_eval_merge(a);
    if (!strcmp(sub, "compare")) return cmd_eval_compare(a);
    return die("g4 eval needs a task: gsm8k -m DIR --data FILE --out FILE [...], merge OUT IN..., or compare A.jsonl B.jsonl (got \"%s\")",
               sub);
}
