/* Time per operation class of a session's forward pass (g4 bench): PROF_BEGIN / PROF_END
 * (session.h) charge what they bracket to a class; what no bracket covers is "other". */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>

#include "session.h"

double g4_prof_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void g4_session_set_profiling(g4_session *s, int on) {
    s->profiling = on;
    memset(s->prof, 0, sizeof s->prof);
    s->prof_total = 0;
}

void g4_session_profile(const g4_session *s, double seconds[G4_PROF_COUNT]) {
    double named = 0;
    for (int i = 0; i < G4_PROF_COUNT; i++) {
        seconds[i] = s->prof[i];
        if (i != G4_PROF_OTHER) named += s->prof[i];
    }
    seconds[G4_PROF_OTHER] = s->prof_total > named ? s->prof_total - named : 0; /* norms, RoPE, GELU, PLE block glue */
}

const char *g4_prof_op_name(g4_prof_op op) {
    static const char *names[G4_PROF_COUNT] = {"embed+ple", "linear", "attention", "lm_head", "other"};
    return op < G4_PROF_COUNT ? names[op] : "?";
}
