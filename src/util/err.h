/* One error channel for the whole library: the failing function records a one-line message
 * (naming the file, tensor, field or flag) and returns an error code; callers pass it up;
 * the CLI prints g4_last_error() and exits non-zero. */
#ifndef G4_UTIL_ERR_H
#define G4_UTIL_ERR_H

#if defined(__GNUC__)
#define G4_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define G4_PRINTF(a, b)
#endif

/* Records the message and returns -1, so that `return g4_fail(...)` reads naturally. */
int g4_fail(const char *fmt, ...) G4_PRINTF(1, 2);
/* Prefixes the current message with more context ("file.json: " + old message). Returns -1. */
int g4_fail_prefix(const char *fmt, ...) G4_PRINTF(1, 2);
const char *g4_last_error(void);
void g4_clear_error(void);
/* A warning, to the log function (g4_set_log in g4.h; by default stderr, "g4: warning: ..."). */
void g4_warn(const char *fmt, ...) G4_PRINTF(1, 2);

#endif
