#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static const g4_kernels portable = {
    .name = "portable",
    .matmul_f32 = g4_ref_matmul_f32,
    .matmul_i8 = g4_ref_matmul_i8,
};

const g4_kernels *g4_kernels_get(void) {
    /* Only the portable level exists so far; G4_DISPATCH will select among levels once the
     * vector kernels land, and the fixture tests run with each one forced. */
    const char *force = getenv("G4_DISPATCH");
    (void)force;
    return &portable;
}
