/* Running the g4 command from a test, as a user would: one place for the shell plumbing the
 * command-line tests share. Include after defining _POSIX_C_SOURCE. */
#ifndef G4_TEST_CLI_UTIL_H
#define G4_TEST_CLI_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Runs a shell command; its exit status, 128 when it did not exit normally (a signal). */
static inline int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Runs `BIN ARGS` with stdin from /dev/null and stdout/stderr into out/err; its exit status. */
static inline int run_into(const char *bin, const char *args, const char *out, const char *err) {
    size_t cap = strlen(bin) + strlen(args) + strlen(out) + strlen(err) + 32;
    char *cmd = malloc(cap);
    if (!cmd) return 128;
    snprintf(cmd, cap, "%s %s > %s 2> %s < /dev/null", bin, args, out, err);
    int rc = sh(cmd);
    free(cmd);
    return rc;
}

#endif
