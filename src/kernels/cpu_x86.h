/* x86 CPU features the kernel levels need (kernels/cpu_x86.c; internal to src/kernels/ and the
 * bench). Each flag is set only when the CPU has the feature and the OS saves the registers it
 * uses (XCR0); all are 0 off x86. */
#ifndef G4_KERNELS_CPU_X86_H
#define G4_KERNELS_CPU_X86_H

#include <stdint.h>

typedef struct {
    int os_ymm, os_zmm; /* XCR0 enables the YMM state; and the opmask and ZMM states */
    int avx2, fma, avxvnni;
    int avx512f, avx512bw, avx512vl, avx512vnni, avx512vbmi;
    /* AMX (cpuid amx_tile, amx_int8) with XCR0 enabling the tile state (bits 17-18); Linux must
     * still grant the process the tile data (g4_x86_amx_granted) */
    int os_tile, amx_tile, amx_int8;
} g4_x86_cpu;

/* Whether Linux lets this process use the AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA), asked once): 0 off Linux, without AMX, or when the kernel refuses. */
int g4_x86_amx_granted(void);

const g4_x86_cpu *g4_x86_cpu_get(void);

/* The usable flags above, space-separated under /proc/cpuinfo's names (os_ymm/os_zmm for XCR0),
 * e.g. "avx2 fma avx_vnni avx512f ...": for reports. */
const char *g4_x86_cpu_flags(void);

#endif
