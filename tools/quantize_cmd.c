/* `g4 quantize --q4_0 IN OUT [--embed q8_0|q4_0|bf16]`: a BF16 checkpoint folder into the
 * block-scaled checkpoint format (dev/model/quantize.h). Every failure prints one line
 * "g4 quantize: error: ..." and returns 1. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "g4dev.h"

int g4_cmd_quantize(int argc, char **argv);

static int quantize_error(const char *fmt, ...) G4_PRINTF(1, 2);
static int quantize_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "g4 quantize: error: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

const command_usage usage_quantize = {
    "quantize --q4_0 IN OUT [--embed q8_0|q4_0|bf16]",
    "Rewrites the BF16 checkpoint folder IN (no quantization_config, e.g. gemma-4-E2B-it-qat-q4_0-unquantized)\n"
    "into OUT in the checkpoint format g4 reads: the decoder linears as Q4_0 (int4 codes, one float16 scale\n"
    "per block of 32 inputs, llama.cpp's rule), the embeddings and an untied lm_head as --embed, everything\n"
    "else copied, and a quantization_config (quant_method gemma, block_size 32) that says so; the folder's\n"
    "other files are copied. A BF16 matrix whose rows are not whole blocks of 32 (a 16-wide per-layer input)\n"
    "stays BF16, one line naming each.",
    (const usage_line[]){
        {"--q4_0, --q4-0", "the format to write (the one g4 quantize writes; required)"},
        {"--embed q8_0|q4_0|bf16", "the embeddings' and an untied lm_head's format (default q8_0, llama.cpp's choice; bf16: as they are)"},
        {NULL, NULL},
    },
    0,
};

int g4_cmd_quantize(int argc, char **argv) {
    const char *dirs[2] = {NULL, NULL}, *embed_name = "q8_0";
    int n_dirs = 0, q4_0 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_command_usage(stdout, &usage_quantize);
            return 0;
        } else if (!strcmp(a, "--q4_0") || !strcmp(a, "--q4-0")) {
            q4_0 = 1;
        } else if (!strcmp(a, "--embed") || !strncmp(a, "--embed=", 8)) {
            if (a[7] == '=') embed_name = a + 8;
            else if (i + 1 < argc) embed_name = argv[++i];
            else return quantize_error("--embed needs a value");
        } else if (a[0] == '-' && a[1]) {
            return quantize_error("unknown flag %s (see g4 quantize --help)", a);
        } else if (n_dirs < 2) {
            dirs[n_dirs++] = a;
        } else {
            return quantize_error("%s: one input and one output folder only", a);
        }
    }
    if (!q4_0) return quantize_error("--q4_0 is required (the one format g4 quantize writes)");
    if (n_dirs < 2) return quantize_error("needs an input and an output folder: g4 quantize --q4_0 IN OUT");
    g4_embed_quant embed;
    if (!strcmp(embed_name, "q8_0")) embed = G4_EMBED_Q8_0;
    else if (!strcmp(embed_name, "q4_0")) embed = G4_EMBED_Q4_0;
    else if (!strcmp(embed_name, "bf16")) embed = G4_EMBED_BF16;
    else return quantize_error("--embed %s: expected one of q8_0 q4_0 bf16", embed_name);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g4_quantize_stats st;
    if (g4_quantize_q4_0(dirs[0], dirs[1], embed, &st) != 0) return quantize_error("%s", g4_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (int i = 0; i < st.n_kept_bf16; i++)
        printf("g4 quantize: kept %s.weight BF16: its rows are not whole blocks of 32 (listed in modules_to_not_convert)\n",
               st.kept_bf16[i]);
    printf("g4 quantize: wrote %s (q4_0, embeddings %s): %d tensors quantized, %d copied, model.safetensors %llu bytes "
           "(from %llu), %.1f s\n",
           dirs[1], embed_name, st.n_quantized, st.n_copied, (unsigned long long)st.file_bytes, (unsigned long long)st.bytes_in, s);
    g4_quantize_stats_free(&st);
    return 0;
}
