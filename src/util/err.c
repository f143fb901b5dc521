#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "g4.h"

static _Thread_local char last_error[1024];
/* Where warnings go (g4_set_log): set before other calls, read by any thread that warns. */
static g4_log_fn log_fn = g4_log_stderr;
static void *log_user;

int g4_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return -1;
}

int g4_fail_prefix(const char *fmt, ...) {
    char prefix[512], old[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    size_t n = strlen(prefix);
    if (n >= sizeof last_error) n = sizeof last_error - 1;
    memcpy(last_error, prefix, n);
    size_t rest = strlen(old);
    if (rest > sizeof last_error - 1 - n) rest = sizeof last_error - 1 - n;
    memcpy(last_error + n, old, rest);
    last_error[n + rest] = 0;
    return -1;
}

const char *g4_version(void) { return G4_VERSION; }

const char *g4_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

void g4_clear_error(void) { last_error[0] = 0; }

void g4_log_stderr(void *user, g4_log_level level, const char *message) {
    (void)user;
    (void)level; /* warnings are the only level */
    fprintf(stderr, "g4: warning: %s\n", message);
}

void g4_set_log(g4_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

void g4_warn(const char *fmt, ...) {
    g4_log_fn fn = log_fn;
    if (!fn) return;
    char msg[4096]; /* room for a path or two */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fn(log_user, G4_LOG_WARNING, msg);
}
