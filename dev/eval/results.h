/* Reader for the JSON-lines result files written by `g4 eval gsm8k`, shared by resume and
 * `g4 eval compare`.
 *
 * A results file is a header record, then one question record per evaluated question (in
 * completion order, so not necessarily by index), then optionally a summary record:
 *
 *   {"type":"header","model":{...},"data":{...},"options":{...},"g4_version":"..."}
 *   {"type":"question","index":0,"gold":"18","output":"...","answer":"18"|null,
 *    "status":"marker","correct":true,"prompt_tokens":95,"generated_tokens":120,
 *    "stop":"eos","seconds":3.2}
 *   {"type":"summary",...}
 *
 * The reader never trusts the file: a line that is not a JSON object, a record of unknown
 * type, a missing field or one of the wrong type, or an index seen twice fails with a
 * message naming the file and line. The one tolerated defect is a last line without its
 * newline: that is what a killed writer leaves behind. */
#ifndef G4_EVAL_RESULTS_H
#define G4_EVAL_RESULTS_H

#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct {
    int index;
    int line;        /* where it was read, for messages */
    char *gold;      /* normalised gold answer */
    char *output;    /* the full decoded reply */
    char *answer;    /* the extracted answer; NULL when there was none */
    char *status;    /* the extractor's status ("marker", "no_number", ...) */
    char *stop;      /* "eos", "budget" or "context" */
    int correct;
    int prompt_tokens, generated_tokens;
    double seconds;
} g4_result_question;

typedef struct {
    char *path;
    cJSON *header;               /* NULL when the file holds no complete header yet */
    cJSON *summary;              /* the last summary record, or NULL */
    g4_result_question *q;       /* in file order */
    int n_q;
    long append_offset;          /* where a resumed run continues writing: the end of the last
                                    complete record, or the start of a trailing summary (which
                                    the resumed run replaces) */
    int dropped_tail_line;       /* line number of an unterminated last line that was dropped, or 0 */
} g4_results;

enum {
    /* Drop an unterminated last line even when it parses: a resumed run rewrites that
     * question rather than appending after a line with no newline. Without this flag such a
     * line is kept when it is a valid record and dropped (dropped_tail_line set) otherwise. */
    G4_RESULTS_DROP_UNTERMINATED = 1u,
};

/* Reads `path`. Returns 0, or -1 with g4_last_error() = "<path>:<line>: <what is wrong>".
 * A file that does not exist is an error; an empty one is a valid file with no header. */
int g4_results_read(const char *path, unsigned flags, g4_results *out);
void g4_results_free(g4_results *r);

/* The record with this index, or NULL. */
const g4_result_question *g4_results_find(const g4_results *r, int index);

#endif
