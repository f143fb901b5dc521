/* x86 CPU features for the kernel levels, read once with cpuid and xgetbv. Compiled for baseline
 * x86-64 (no target flags): it runs before anything is known about the CPU.
 *
 * A feature counts only when the OS saves the registers it uses: the AVX and AVX2 levels need the
 * YMM state enabled in XCR0 (bits 1-2), the AVX-512 level the opmask and both ZMM halves as well
 * (bits 5-7). A kernel that leaves them out of XSAVE would have its vector registers corrupted on
 * every context switch, and with CR4.OSXSAVE clear the instructions fault outright. */
#define _GNU_SOURCE /* syscall() */
#include "cpu_x86.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* XCR0 (the state components the OS enables); only valid when CPUID.1:ECX.OSXSAVE is set. The
 * instruction is written out so this file needs no -mxsave. */
static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

#define XCR0_YMM 0x06u /* SSE + AVX state */
#define XCR0_ZMM 0xE6u /* + opmask, ZMM0-15 upper halves, ZMM16-31 */
#define XCR0_TILE 0x60000u /* XTILECFG + XTILEDATA */

static g4_x86_cpu read_cpu(void) {
    g4_x86_cpu c;
    memset(&c, 0, sizeof c);
    unsigned a, b, cx, d, max = __get_cpuid_max(0, NULL);
    if (max < 1) return c;
    __cpuid(1, a, b, cx, d);
    int osxsave = cx >> 27 & 1, avx = cx >> 28 & 1, fma = cx >> 12 & 1;
    uint64_t x = osxsave ? xcr0() : 0;
    c.os_ymm = (x & XCR0_YMM) == XCR0_YMM;
    c.os_zmm = (x & XCR0_ZMM) == XCR0_ZMM;
    c.os_tile = (x & XCR0_TILE) == XCR0_TILE;
    unsigned l7b = 0, l7c = 0, l7d = 0, l7max = 0, l71a = 0;
    if (max >= 7) {
        __cpuid_count(7, 0, l7max, l7b, l7c, l7d);
        if (l7max >= 1) __cpuid_count(7, 1, l71a, b, cx, d);
    }
    int ymm = avx && c.os_ymm, zmm = ymm && c.os_zmm;
    c.fma = ymm && fma;
    c.avx2 = ymm && (l7b >> 5 & 1);
    c.avxvnni = ymm && (l71a >> 4 & 1);
    c.avx512f = zmm && (l7b >> 16 & 1);
    c.avx512bw = zmm && (l7b >> 30 & 1);
    c.avx512vl = zmm && (l7b >> 31 & 1);
    c.avx512vnni = zmm && (l7c >> 11 & 1);
    c.avx512vbmi = zmm && (l7c >> 1 & 1);
    c.amx_tile = c.os_tile && (l7d >> 24 & 1);
    c.amx_int8 = c.os_tile && (l7d >> 25 & 1);
    return c;
}

static g4_x86_cpu cpu;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static void cpu_init(void) { cpu = read_cpu(); }

const g4_x86_cpu *g4_x86_cpu_get(void) {
    pthread_once(&cpu_once, cpu_init);
    return &cpu;
}

/* Linux keeps the AMX tile data (8 KB of XSAVE state) off until a process asks for it; a kernel
 * that refuses (before 5.16, or a seccomp/sandbox policy) leaves the level unoffered, and TILELOADD
 * would otherwise die with SIGILL. */
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#endif

static int amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_init(void) {
    const g4_x86_cpu *c = g4_x86_cpu_get();
    if (!c->amx_tile || !c->amx_int8) return;
#if defined(__linux__)
    amx_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

int g4_x86_amx_granted(void) {
    pthread_once(&amx_once, amx_init);
    return amx_granted;
}

const char *g4_x86_cpu_flags(void) {
    static char buf[200];
    const g4_x86_cpu *c = g4_x86_cpu_get();
    const struct {
        const char *name;
        int on;
    } f[] = {{"avx2", c->avx2},         {"fma", c->fma},           {"avx_vnni", c->avxvnni},
             {"avx512f", c->avx512f},   {"avx512bw", c->avx512bw}, {"avx512vl", c->avx512vl},
             {"avx512_vnni", c->avx512vnni}, {"avx512vbmi", c->avx512vbmi}, {"amx_tile", c->amx_tile},
             {"amx_int8", c->amx_int8}, {"os_ymm", c->os_ymm}, {"os_zmm", c->os_zmm}, {"os_tile", c->os_tile}};
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (f[i].on) at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%s", at ? " " : "", f[i].name);
    return buf;
}

#else

const g4_x86_cpu *g4_x86_cpu_get(void) {
    static const g4_x86_cpu none;
    return &none;
}

const char *g4_x86_cpu_flags(void) { return ""; }

int g4_x86_amx_granted(void) { return 0; }

#endif
