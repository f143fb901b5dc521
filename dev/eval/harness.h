/* The GSM8K quality harness (shared/spec/gsm8k-protocol.md): the data file, fingerprints of
 * the model and data, batched greedy decoding of many questions at once, per-question records,
 * scoring (Wilson interval) and the paired comparison of two runs (exact McNemar test).
 *
 * The command line around it (flags, resume, progress, printing) is tools/eval_cmd.c. */
#ifndef G4_EVAL_HARNESS_H
#define G4_EVAL_HARNESS_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "eval/gsm8k.h"
#include "eval/results.h"
#include "g4.h"

/* ---- statistics ---- */

/* 95% Wilson score interval of k successes in n trials, as fractions; [0, 1] when n = 0. */
void g4_wilson95(long k, long n, double *lo, double *hi);

/* Two-sided exact McNemar test on the discordant pairs (b right only in A, c right only in
 * B): p = min(1, 2 * sum_{i <= min(b, c)} C(b + c, i) / 2^(b + c)); 1 when b + c = 0. Exact
 * to double precision for any b + c (summed in log space). */
double g4_mcnemar_exact_p(long b, long c);

/* ---- SHA-256 (FIPS 180-4), for the data and model fingerprints ---- */

typedef struct {
    uint32_t h[8];
    uint64_t bytes;
    unsigned char block[64];
    size_t used;
} g4_sha256;

void g4_sha256_init(g4_sha256 *c);
void g4_sha256_update(g4_sha256 *c, const void *data, size_t n);
/* Writes the digest as 64 lowercase hex digits and a NUL. */
void g4_sha256_hex(g4_sha256 *c, char hex[65]);

/* ---- data ---- */

typedef struct {
    int index;      /* zero-based line of the data file ("qN") */
    char *question; /* verbatim */
    char *gold;     /* normalised gold answer (g4_gsm8k_gold) */
} g4_gsm8k_item;

typedef struct {
    g4_gsm8k_item *items; /* lines [offset, offset + n) */
    int n;
    int n_lines;          /* lines in the whole file */
    char sha256[65];      /* of the whole file */
    char selected_sha256[65]; /* of the selected lines with their newlines (GSM8K-100: 1d266e...) */
    long bytes;
} g4_gsm8k_data;

/* Reads a GSM8K JSON-lines file ({"question": ..., "answer": "...#### 42"} per line) and
 * keeps the questions on lines [offset, offset + n); n < 0 means to the end. Blank lines hold
 * no question but are counted, so an item's index is always its line number. Fails naming file
 * and line for a line that is not such an object or whose gold is not a number, and when the
 * selection holds no question. */
int g4_gsm8k_data_load(const char *path, int offset, int n, g4_gsm8k_data *d);
void g4_gsm8k_data_free(g4_gsm8k_data *d);

/* ---- model fingerprint ---- */

/* A content fingerprint of a checkpoint folder that is cheap even for multi-GB weights:
 * SHA-256 over config.json, generation_config.json (if any), tokenizer.json, and of
 * model.safetensors (or, sharded, of model.safetensors.index.json and each shard it names) the
 * size, the JSON header and 16 blocks of 64 KiB spread evenly over the tensor data. Copies of a
 * checkpoint match; a retrained or requantized one does not. *safetensors_bytes: the weight
 * files' total size. */
int g4_model_fingerprint(const char *dir, char hex[65], long long *safetensors_bytes);

/* ---- batched greedy decoding ---- */

typedef struct {
    const int32_t *prompt; /* with its BOS */
    int n_prompt;
} g4_eval_job;

/* A finished question, as handed to the callback. ids holds every generated token, the stop
 * id included (as the last one) when stop == G4_STOP_EOS. */
typedef struct {
    int job;               /* position in the jobs array */
    const int32_t *ids;
    int n_generated;
    g4_stop_reason stop;   /* G4_STOP_EOS, G4_STOP_BUDGET or G4_STOP_CONTEXT */
    double seconds;        /* from the start of its prefill to its last token */
} g4_eval_finished;

typedef struct {
    int max_tokens;        /* >= 1 */
    const int *stop_ids;
    int n_stop_ids;
    g4_drafter *draft;     /* speculative decoding (g4_generate_params): the same answers, faster; NULL: none */
    int draft_tokens;
} g4_eval_params;

typedef struct {
    long generated;        /* tokens generated (stop ids included) */
    double prefill_s, decode_s;
    long draft_rounds, drafted, accepted; /* speculative decoding (--draft): rounds, drafts, drafts accepted */
} g4_eval_timing;

/* Returns non-zero to abort the run (g4_eval_greedy then fails with the error it set). */
typedef int (*g4_eval_done_fn)(void *user, const g4_eval_finished *f);
/* Called after every decoding step, for progress displays. */
typedef void (*g4_eval_step_fn)(void *user, const g4_eval_timing *so_far);

/* Answers every job greedily (argmax, first index on ties), stopping at a stop id, after
 * max_tokens, or when the sequence's context is full, through a stepper (g4_stepper): up to
 * g4_session_n_seq(s) questions are in flight at once, each in a sequence of its own; a sequence
 * whose question is finished is reset and given the next job, whose prompt is fed between the
 * steps of the others. Since a sequence gives the tokens it gives alone, every job's tokens are
 * those of a batch of one. A prompt longer than the context is finished at once, with nothing
 * generated (G4_STOP_CONTEXT). done() is called in completion order. Returns 0, or -1
 * (g4_last_error) on an engine failure or when done() aborts. */
int g4_eval_greedy(g4_session *s, const g4_eval_job *jobs, int n_jobs, const g4_eval_params *p, g4_eval_done_fn done,
                   g4_eval_step_fn step, void *user, g4_eval_timing *timing);

/* The question record for a finished job: decodes the reply (special tokens kept, the stop id
 * left out), extracts and scores the answer. NULL (g4_last_error) on failure. */
cJSON *g4_gsm8k_record(const g4_gsm8k_extractor *ex, const g4_tokenizer *tok, const g4_gsm8k_item *item, int n_prompt,
                       const g4_eval_finished *f);

/* ---- scores and comparisons of results files ---- */

typedef struct {
    int n, correct;
    int budget, context;            /* replies cut by the budget / the context */
    int no_number, thought_unclosed;
    double accuracy, lo, hi;        /* fractions; Wilson 95% */
} g4_eval_score;

void g4_eval_score_results(const g4_results *r, g4_eval_score *s);

typedef struct {
    int index;
    const g4_result_question *a, *b;
} g4_compare_row;

typedef struct {
    int n_a, n_b, common;            /* questions in A, in B, in both (only those count) */
    int a_correct, b_correct;        /* over the common questions */
    g4_compare_row *a_only;          /* right in A, wrong in B (McNemar's b), by index */
    int n_a_only;
    g4_compare_row *b_only;          /* right in B, wrong in A (c) */
    int n_b_only;
    g4_compare_row *same_wrong;      /* both wrong with the same answer (or both with none) */
    int n_same_wrong;
    int both_right, different_wrong;
    int gold_mismatch;               /* common questions whose gold differs: not the same data */
    double p;                        /* exact McNemar p-value */
} g4_compare;

int g4_eval_compare(const g4_results *a, const g4_results *b, g4_compare *c);
void g4_compare_free(g4_compare *c);

/* The first difference between two headers that makes their records incomparable: model
 * fingerprint, data sha256, g4 version or any option. NULL when there is none, otherwise a
 * malloc'd phrase such as "option act is \"fake\" in the file, \"int\" now" (in_a "in the
 * file", in_b "now"). g4_eval_header_mismatch says "in the file" and "now". */
char *g4_eval_header_diff(const cJSON *a, const cJSON *b, const char *in_a, const char *in_b);
char *g4_eval_header_mismatch(const cJSON *in_file, const cJSON *now);

/* ---- header and summary records ---- */

/* Adds every result-affecting engine option to the header's options object, resolved as the
 * session runs it, in the options table's order and words (integers as numbers). */
int g4_eval_add_engine_options(cJSON *obj, const g4_options *o);

/* The summary record: the score of every record in the file, and this invocation's throughput. */
cJSON *g4_eval_summary_json(const g4_eval_score *sc, const g4_eval_timing *t, int evaluated, double wall, int batch);

/* ---- shards ---- */

/* A shard's part of a run (`g4 eval gsm8k --shard I/N`): question qK belongs to shard K mod N, so a
 * shard's questions follow from their indices alone, whatever the selection and the batch. */
static inline int g4_eval_in_shard(int index, int shard, int n_shards) {
    return index % n_shards == shard;
}

/* Parses "I/N" (0 <= I < N <= 2^20). -1 with the error set otherwise. */
int g4_eval_parse_shard(const char *text, int *shard, int *n_shards);

/* Merges the results files of the shards of one run into what the unsharded run writes: its
 * header (no shard option), every question record (the shards' lines, byte for byte) by index,
 * and a summary scoring them all (throughput summed over the shards, wall time the longest).
 * Refuses, naming the files: an input that is not a finished run (no summary, an incomplete
 * line), inputs of different models, data, g4 versions or options, shards of different splits, a
 * shard given twice (an overlap) or not at all (a gap), a record outside its shard, and a total
 * other than the run's question count. out_path must not exist; it is written whole or not at
 * all. *score: the merged run's. */
int g4_eval_merge(const char *out_path, const char *const *in_paths, int n_in, g4_eval_score *score);

#endif
