/* Minimal test harness shared by every tests/test_*.c program.
 * Each program prints one closing line "name: N passed, N failed, N skipped" and exits non-zero
 * on failure, or when no check passed at all (a program that tested nothing has not passed).
 *
 * A skip is only for what this run cannot or was not asked to do: a CPU feature the machine
 * lacks (SKIP_FEATURE) or an opt-in left off (SKIP_OPT_IN). A missing fixture, binary or
 * environment variable is a failure (CHECK, or check_bin for G4_BIN): a run without it would
 * look like a pass while testing less. */
#ifndef G4_TEST_CHECK_H
#define G4_TEST_CHECK_H
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

static int check_passed, check_failed, check_skipped;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            check_passed++;                                                     \
        } else {                                                                \
            check_failed++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

#define CHECK_EQ_INT(a, b) CHECK((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))
#define CHECK_STREQ(a, b) CHECK(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))

/* Counts a skipped part and says why, on the program's output (the runner shows it). */
#define CHECK_SKIP(kind, ...)                                                   \
    do {                                                                        \
        check_skipped++;                                                        \
        printf("skip (%s): ", kind);                                            \
        printf(__VA_ARGS__);                                                    \
        putchar('\n');                                                          \
    } while (0)
#define SKIP_FEATURE(...) CHECK_SKIP("CPU feature", __VA_ARGS__)
#define SKIP_OPT_IN(...) CHECK_SKIP("opt-in", __VA_ARGS__)

/* Where ../shared lives: $G4_SHARED, else ../shared relative to the repo root (tests run there). */
static inline const char *check_shared_dir(void) {
    const char *s = getenv("G4_SHARED");
    return s && *s ? s : "../shared";
}

/* $G4_BIN, the g4 command that the command-line tests run (`make test` sets it). Its absence
 * is a failed check, not a skip; returns NULL then. */
static inline const char *check_bin(void) {
    const char *bin = getenv("G4_BIN");
    int set = bin && *bin;
    CHECK(set, "G4_BIN is not set (make test sets it): the command-line tests cannot run");
    return set ? bin : NULL;
}

static inline int check_report(const char *name) {
    if (check_passed == 0 && check_failed == 0) {
        check_failed++;
        fprintf(stderr, "FAIL %s: no check passed: the program tested nothing\n", name);
    }
    printf("%s: %d passed, %d failed, %d skipped\n", name, check_passed, check_failed, check_skipped);
    return check_failed ? 1 : 0;
}
#endif
