/* The kernel levels dispatch.c chooses from (internal to src/kernels/). Each level file defines
 * its table unconditionally and says at run time whether this build and CPU can use it. */
#ifndef G4_KERNELS_LEVELS_H
#define G4_KERNELS_LEVELS_H

#include "kernels.h"

extern const g4_kernels g4_kernels_portable;

/* x86: AVX2 (kernels/avx2.c). On other targets the table's functions are the portable ones and
 * g4_avx2_supported() is 0. */
extern const g4_kernels g4_kernels_avx2;
int g4_avx2_supported(void);

/* aarch64: NEON (kernels/neon.c), always present on aarch64, 0 elsewhere. */
extern const g4_kernels g4_kernels_neon;
int g4_neon_supported(void);

#endif
