/* `g4 synth --preset e2b|e4b|e2b-q4_0|e2b-bf16|tiny|e2b-drafter -o DIR [--seed N] [--tokenizer FILE] [--towers]`: writes a random
 * checkpoint folder with the real on-disk layout (dev/model/synth.h). Every failure prints one
 * line "g4 synth: error: ..." and returns 1. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "g4dev.h"

int g4_cmd_synth(int argc, char **argv);

static int synth_error(const char *fmt, ...) G4_PRINTF(1, 2);
static int synth_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "g4 synth: error: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* "--flag value" or "--flag=value"; NULL (after printing the error) when the value is missing. */
static const char *value_of(int argc, char **argv, int *i, const char *flag) {
    const char *arg = argv[*i];
    size_t n = strlen(flag);
    if (arg[n] == '=') return arg + n + 1;
    if (*i + 1 >= argc) {
        synth_error("%s needs a value", flag);
        return NULL;
    }
    return argv[++*i];
}

static int is_flag(const char *arg, const char *flag) {
    size_t n = strlen(flag);
    /* "=value" only for long flags, so "-ofoo" is not mistaken for "-o" */
    return strncmp(arg, flag, n) == 0 && (arg[n] == 0 || (arg[n] == '=' && flag[1] == '-'));
}

static int parse_seed(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    if (!*v || *v == '-' || *v == '+') return -1; /* strtoull would wrap a sign silently */
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || end == v || *end) return -1;
    *out = (uint64_t)x;
    return 0;
}

const command_usage usage_synth = {
    "synth --preset e2b|e4b|e2b-q4_0|e2b-bf16|tiny|e2b-drafter -o DIR [--seed N] [--tokenizer FILE] [--towers]",
    "Writes DIR/{config.json, generation_config.json, tokenizer.json, model.safetensors}:\n"
    "random weights in the exact on-disk layout of a Gemma 4 checkpoint: e2b and e4b, the QAT mobile\n"
    "checkpoints (2.1 and 3.2 GB of text tensors); e2b-q4_0, E2B as g4 quantize --q4_0 writes it (4.0 GB);\n"
    "e2b-bf16, the plain BF16 E2B (9.3 GB); tiny: the shape of the shared tiny fixture;\n"
    "e2b-drafter: E2B's MTP drafter gemma-4-E2B-it-assistant (158 MB BF16; config.json and\n"
    "model.safetensors only, as it runs on the target's tokenizer).",
    (const usage_line[]){
        {"--preset NAME", "e2b, e4b, e2b-q4_0, e2b-bf16, tiny or e2b-drafter"},
        {"-o, --out DIR", "the folder to write"},
        {"--seed N", "values are a function of (preset, seed); default 0"},
        {"--tokenizer FILE", "copy this tokenizer.json instead of generating a synthetic one"},
        {"--towers", "also a vision tower and an audio conformer of the real sizes (e2b, e4b, tiny), for image and audio input"},
        {NULL, NULL},
    },
    0,
};

int g4_cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *tok = NULL;
    uint64_t seed = 0;
    int towers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_flag(a, "-h") || is_flag(a, "--help")) {
            print_command_usage(stdout, &usage_synth);
            return 0;
        } else if (is_flag(a, "--preset")) {
            if (!(preset = value_of(argc, argv, &i, "--preset"))) return 1;
        } else if (is_flag(a, "-o") || is_flag(a, "--out")) {
            if (!(out = value_of(argc, argv, &i, is_flag(a, "-o") ? "-o" : "--out"))) return 1;
        } else if (is_flag(a, "--seed")) {
            const char *v = value_of(argc, argv, &i, "--seed");
            if (!v) return 1;
            if (parse_seed(v, &seed) != 0) return synth_error("--seed %s: expected a non-negative integer below 2^64", v);
        } else if (is_flag(a, "--towers")) {
            towers = 1;
        } else if (is_flag(a, "--tokenizer")) {
            if (!(tok = value_of(argc, argv, &i, "--tokenizer"))) return 1;
        } else {
            return synth_error("unknown flag %s (see g4 synth --help)", a);
        }
    }
    if (!preset) return synth_error("--preset is required (e2b, e4b, e2b-q4_0, e2b-bf16, tiny or e2b-drafter)");
    int known = 0;
    for (int k = 0; g4_synth_presets[k]; k++) known |= strcmp(g4_synth_presets[k], preset) == 0;
    if (!known) return synth_error("--preset %s: expected one of e2b, e4b, e2b-q4_0, e2b-bf16, tiny, e2b-drafter", preset);
    if (!out || !*out) return synth_error("-o DIR is required");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g4_synth_stats st;
    if (g4_synth_towers(preset, out, seed, tok, towers, &st) != 0) return synth_error("%s", g4_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("g4 synth: wrote %s (preset %s, seed %llu): %d tensors (%d text, %llu bytes), model.safetensors %llu bytes, "
           "%.1f s\n",
           out, preset, (unsigned long long)seed, st.n_tensors, st.n_text_tensors, (unsigned long long)st.text_bytes,
           (unsigned long long)st.file_bytes, s);
    return 0;
}
