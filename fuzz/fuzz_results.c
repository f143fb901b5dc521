/* Fuzz target: the results-file reader used by `g4 eval gsm8k` resume and `g4 eval compare`
 * (dev/eval/results.h).
 *
 * Input: the bytes of a results file (JSON lines). g4_results_read runs with flags 0 and
 * G4_RESULTS_DROP_UNTERMINATED. On success:
 *   - every question has gold/output/status/stop strings, a non-negative index, no index
 *     twice, and g4_results_find finds it; g4_results_find(-1) is NULL;
 *   - append_offset is -1 (flags 0 only: the file ends in a valid record with no newline)
 *     or in [0, size] right after a '\n' (or 0);
 *   - the resume invariant: the prefix [0, append_offset) read again is valid and holds the
 *     same questions and header, and no summary when the offset cut a trailing one. */
#include "eval/results.h"
#include "util/err.h"

#include "fuzz_common.h"

static fz_memfile file, prefix;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    fz_memfile_open(&file, "results.jsonl");
    fz_memfile_open(&prefix, "prefix.jsonl");
    return 0;
}

static void check_results(const g4_results *r, const uint8_t *data, size_t size, unsigned flags) {
    FZ_CHECK(r->path && r->n_q >= 0 && (r->n_q == 0 || r->q), "results struct");
    FZ_CHECK(!r->header || cJSON_IsObject(r->header), "header is not an object");
    FZ_CHECK(!r->summary || cJSON_IsObject(r->summary), "summary is not an object");
    FZ_CHECK(r->n_q == 0 || r->header, "questions without a header");
    for (int i = 0; i < r->n_q; i++) {
        const g4_result_question *q = &r->q[i];
        FZ_CHECK(q->gold && q->output && q->status && q->stop, "question %d: missing string", i);
        FZ_CHECK(q->index >= 0 && q->line >= 1, "question %d: index %d line %d", i, q->index, q->line);
        FZ_CHECK(q->prompt_tokens >= 0 && q->generated_tokens >= 0 && q->seconds >= 0, "question %d: counts", i);
        FZ_CHECK(q->correct == 0 || q->correct == 1, "correct");
        FZ_CHECK(g4_results_find(r, q->index) == q, "find(%d) misses or finds a duplicate", q->index);
        if (i > 0) FZ_CHECK(q->line > r->q[i - 1].line, "questions not in file order");
    }
    FZ_CHECK(g4_results_find(r, -1) == NULL, "find(-1)");
    long off = r->append_offset;
    if (off == -1) {
        FZ_CHECK(!(flags & G4_RESULTS_DROP_UNTERMINATED), "append_offset -1 with DROP_UNTERMINATED");
        FZ_CHECK(size > 0 && data[size - 1] != '\n', "append_offset -1 but the file ends in a newline");
    } else {
        FZ_CHECK(off >= 0 && (size_t)off <= size, "append_offset %ld outside [0, %zu]", off, size);
        FZ_CHECK(off == 0 || data[off - 1] == '\n', "append_offset %ld not after a newline", off);
    }
    if (r->dropped_tail_line) FZ_CHECK(size > 0 && data[size - 1] != '\n', "dropped a terminated line");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_memfile_set(&file, data, size);
    for (unsigned flags = 0; flags < 2; flags++) {
        g4_results r;
        if (g4_results_read(file.path, flags, &r) != 0) {
            FZ_CHECK(r.path == NULL && r.q == NULL && r.header == NULL && r.summary == NULL, "failed read left state");
            FZ_CHECK(strstr(g4_last_error(), file.path) != NULL, "error does not name the file: %s", g4_last_error());
            continue;
        }
        check_results(&r, data, size, flags);
        if (r.append_offset >= 0) {
            fz_memfile_set(&prefix, data, (size_t)r.append_offset);
            g4_results p;
            FZ_CHECK(g4_results_read(prefix.path, G4_RESULTS_DROP_UNTERMINATED, &p) == 0,
                     "the prefix [0, %ld) a resumed run keeps does not read back: %s", r.append_offset, g4_last_error());
            check_results(&p, data, (size_t)r.append_offset, G4_RESULTS_DROP_UNTERMINATED);
            FZ_CHECK(p.append_offset == r.append_offset, "prefix append_offset %ld vs %ld", p.append_offset,
                     r.append_offset);
            FZ_CHECK((p.header == NULL) == (r.header == NULL), "prefix header differs");
            /* A question on an unterminated last line makes the offset -1, so every question
             * read lies inside the prefix. */
            FZ_CHECK(p.n_q == r.n_q, "prefix holds %d questions, the file %d", p.n_q, r.n_q);
            for (int i = 0; i < p.n_q; i++)
                FZ_CHECK(p.q[i].index == r.q[i].index && strcmp(p.q[i].output, r.q[i].output) == 0,
                         "prefix question %d differs", i);
            g4_results_free(&p);
        }
        g4_results_free(&r);
        FZ_CHECK(r.path == NULL && r.q == NULL && r.n_q == 0, "free did not reset");
    }
    return 0;
}
