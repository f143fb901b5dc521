/* Minimal test harness shared by every tests/test_*.c program.
 * Each program prints one closing line "N passed, N failed" and exits non-zero on failure. */
#ifndef G4_TEST_CHECK_H
#define G4_TEST_CHECK_H
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

static int check_passed, check_failed;

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

/* Where ../shared lives: $G4_SHARED, else ../shared relative to the repo root (tests run there). */
static inline const char *check_shared_dir(void) {
    const char *s = getenv("G4_SHARED");
    return s && *s ? s : "../shared";
}

static inline int check_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}
#endif
