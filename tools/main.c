/* g4: command-line interface. Every failure prints one line "g4: error: ..." and exits 1. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "g4.h"
#include "g4dev.h"

/* ---- commands ---- */

static const command_usage usage_inspect = {
    "inspect [-m DIR]",
    "Describes the checkpoint as loaded: each layer, every linear with its bit width and bytes, totals, load time\n"
    "and peak memory.",
    (const usage_line[]){{"-m, --model DIR", "the checkpoint folder (default: the built-in model)"}, {NULL, NULL}},
    0,
};

static int cmd_inspect(args_t *a) {
    const char *dir = NULL;
    int bad = 0;
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        if (flag_is(a, "-m") || flag_is(a, "--model")) dir = flag_value(a, "-m", &bad);
        else return unknown_flag(a);
    }
    if (bad) return 1;
    if (!dir) dir = default_model_dir();
    g4_options o;
    g4_options_default(&o);
    double t0 = now_s();
    g4_model *m = load_model(dir, &o);
    if (!m) return die_lib();
    double load_s = now_s() - t0;
    g4_model_describe(m, stdout);
    printf("  load time: %.3f s, peak resident memory: %.1f MB\n", load_s, peak_rss_kb() / 1024.0);
    g4_model_free(m);
    return 0;
}

typedef struct {
    const char *dir, *ids, *logits_npy, *dump_dir;
    int n_new;
    g4_options o;
    g4_sampling sampling;
    int sampling_given;
    draft_args draft;
} run_args;

static int parse_run(args_t *a, run_args *r) {
    int bad = 0;
    g4_options_default(&r->o);
    g4_sampling_default(&r->sampling);
    r->n_new = 16;
    for (a->i = 2; a->i < a->argc && !bad; a->i++) {
        if (flag_is(a, "-m") || flag_is(a, "--model")) r->dir = flag_value(a, "-m", &bad);
        else if (flag_is(a, "--ids")) r->ids = flag_value(a, "--ids", &bad);
        else if (flag_is(a, "-n") || flag_is(a, "--max-tokens")) {
            const char *v = flag_value(a, "-n", &bad);
            if (v && parse_int(a->cmd, "-n", v, 0, 1 << 20, &r->n_new)) bad = 1;
        } else if (flag_is(a, "--logits-npy")) r->logits_npy = flag_value(a, "--logits-npy", &bad);
        else if (flag_is(a, "--dump-dir")) r->dump_dir = flag_value(a, "--dump-dir", &bad);
        else if (!engine_flag(a, &r->o, &bad) && !sampling_flag(a, &r->sampling, &r->sampling_given, &bad) &&
                 !draft_flag(a, &r->draft, &bad))
            return unknown_flag(a);
    }
    if (bad) return 1;
    if (!r->dir) r->dir = default_model_dir();
    if (!r->ids) return die("g4 run needs --ids (comma-separated token ids)%s", "");
    return 0;
}

/* ids[0, n) fed to sequence 0 in one g4_decode call, every row's logits at logits + t * vocab. */
static int feed_all_logits(g4_session *s, const int32_t *ids, int n, float *logits) {
    size_t V = (size_t)g4_model_vocab_size(g4_session_model(s));
    g4_batch_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) return g4_fail("out of memory for %d rows", n);
    for (int t = 0; t < n; t++) rows[t] = (g4_batch_row){.seq = 0, .token = ids[t], .output = G4_OUTPUT_LOGITS, .logits = logits + (size_t)t * V};
    int rc = g4_decode(s, rows, n);
    free(rows);
    return rc;
}

/* Prefill only, for --logits-npy and --dump-dir: all prompt logits and intermediate tensors. */
static int write_prefill_outputs(g4_session *s, const run_args *r, const int32_t *ids, int n) {
    int V = g4_model_vocab_size(g4_session_model(s));
    float *logits = malloc(sizeof *logits * (size_t)V * (size_t)n);
    g4_capture cap = {0};
    int rc = -1;
    if (!logits) {
        g4_fail("out of memory for %d x %d logits", n, V);
        return -1;
    }
    if (r->dump_dir) g4_session_set_trace(s, g4_capture_trace, &cap);
    if (feed_all_logits(s, ids, n, logits) == 0 && (!r->dump_dir || g4_capture_write_npy(&cap, r->dump_dir) == 0)) {
        int64_t shape[2] = {n, V};
        rc = r->logits_npy ? g4_npy_write_f32(r->logits_npy, logits, 2, shape) : 0;
    }
    g4_session_set_trace(s, NULL, NULL);
    g4_session_reset(s);
    g4_capture_free(&cap);
    free(logits);
    return rc;
}

static int print_id(void *user, int32_t token) {
    int *count = user;
    printf((*count)++ ? " %d" : "%d", token);
    fflush(stdout);
    return 0;
}

static int cmd_run(args_t *a) {
    run_args r = {0};
    if (parse_run(a, &r) != 0) return 1;
    int32_t *ids;
    int n_ids;
    if (parse_ids(a->cmd, r.ids, &ids, &n_ids) != 0) return 1;
    if (r.dump_dir && mkdir(r.dump_dir, 0777) != 0 && errno != EEXIST) {
        free(ids);
        return die("--dump-dir %s: cannot create the folder", r.dump_dir);
    }
    g4_model *m = load_model(r.dir, &r.o);
    g4_session *s = m ? g4_session_new(m, &r.o) : NULL;
    int rc = 1, printed = 0;
    if (!s) goto done;
    if (draft_open(&r.draft, m, s) != 0) goto done;
    if ((r.logits_npy || r.dump_dir) && write_prefill_outputs(s, &r, ids, n_ids) != 0) goto done;
    if (r.n_new > 0) {
        /* token ids in and out: greedy unless sampling flags are given, and no stop ids, so the
         * output has exactly -n ids (the tests compare it with golden sequences) */
        g4_generate_params gp = {.max_tokens = r.n_new, .sampling = r.sampling, .stop_ids = NULL, .n_stop_ids = 0};
        static const int none[1] = {-1};
        gp.stop_ids = none;
        draft_apply(&r.draft, &gp);
        g4_generate_result res;
        if (g4_generate(s, ids, n_ids, &gp, print_id, &printed, &res) != 0) goto done;
        printf("\n");
        if (res.stop == G4_STOP_CONTEXT)
            fprintf(stderr, "g4: warning: generation stopped after %d tokens: the context of %d tokens is full (--ctx)\n",
                    res.n_generated, r.o.ctx);
    }
    rc = 0;
done:
    if (rc) die_lib();
    free(ids);
    draft_close(&r.draft);
    g4_session_free(s);
    g4_model_free(m);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f,
            "g4 %s: Gemma 4 QAT (static int8 activation) inference engine\n"
            "usage:\n"
            "  g4 run -m DIR -p \"text\" [-n N]         answer a prompt (chat template; --raw for none), streaming\n"
            "      -f FILE or standard input give the prompt; --system TEXT, --think on|off, --show-thinking,\n"
            "      --chat-form e2b|26b, --parse-special on|off (raw prompts), --ignore-eos, --verbose (ids on stderr)\n"
            "  g4 chat -m DIR                         interactive chat (/reset, /think on|off, /exit; Ctrl-C stops an answer)\n"
            "  g4 serve -m DIR [--host 127.0.0.1] [--port 8080] [--parallel 4] [--queue 4xN] [--ctx N] [--api-key KEY]\n"
            "        [--alias NAME] [--max-body 4M] [--max-messages 1024] [--max-tools 128] [--timeout 60] [--drain-timeout 30]\n"
            "        [--prompt-cache on|off] [--prompt-chunk 64] [--max-unread 1M] [--cors-origin ORIGIN]... [--pooling mean|last]\n"
            "        [--api-key-file F] [--strict-model] [--header-timeout 10] [--body-timeout 60] [--max-conn-per-ip 64]\n"
            "        [--max-body-total 64M] [--max-json-values N] [--verbose] [engine options]   (--host, --api-key repeatable)\n"
            "        [-n/--max-tokens N] [sampling defaults: --temp T ... as below, but --seed and --logit-bias]\n"
            "                                         OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions,\n"
            "                                         /v1/models, /v1/embeddings, /tokenize, /detokenize, /props, /health,\n"
            "                                         /metrics, a chat page at /; N conversations batched together\n"
            "  g4 tokenize [-m DIR | --tokenizer FILE] [--add-bos] [--plain] [--decode]\n"
            "                                         JSON lines: a string -> its ids (--decode: ids -> string)\n"
            "  g4 eval gsm8k -m DIR --data test.jsonl --out run.jsonl [--n N] [--offset K] [--max-tokens N] [--think off|on]\n"
            "        [--batch B] [--shard I/N] [--progress auto|on|off] [engine options]\n"
            "                                         GSM8K quality run (protocol prompt, greedy); rerun the same command to resume;\n"
            "                                         --shard I/N runs the questions qK with K mod N = I\n"
            "  g4 eval merge OUT.jsonl SHARD.jsonl... the finished shards of one run into the file the unsharded run writes\n"
            "  g4 eval compare A.jsonl B.jsonl        per-question differences, accuracy delta, exact McNemar p-value\n"
            "  g4 inspect [-m DIR]                    describe the checkpoint as loaded\n"
            "  g4 run -m DIR --ids 2,651,9 [-n 16]    greedy-decode from token ids; prints the new ids\n"
            "  g4 synth --preset e2b|e4b|e2b-q4_0|e2b-bf16|tiny -o DIR\n"
            "                                         write a random checkpoint in a real layout (E2B/E4B mobile, E2B as\n"
            "                                         g4 quantize --q4_0 writes it, E2B BF16)\n"
            "  g4 quantize --q4_0 IN OUT [--embed q8_0|q4_0|bf16]\n"
            "                                         a BF16 checkpoint as Q4_0 (int4, one scale per 32 inputs) in g4's format\n"
            "  g4 bench -m DIR [-t N] [-p 512] [-n 128] [-r 3] [--json] [--bandwidth on|off] [--logits greedy|full|top]\n"
            "           [--kernels LEVEL,LEVEL... [--alternate reps|steps]]  reps (and decode steps) alternate between kernel\n"
            "           levels; each level's speed over the first's\n"
            "           [--draft DIR [--draft-costs]]  reps alternate with and without the drafter; --draft-costs instead\n"
            "           times verifying K+1 rows (K = 0..8) and one draft step after a -p prompt, and the speedups they imply\n"
            "           [engine options]\n"
            "                                         load, prefill and decode speed, memory, per-operation time;\n"
            "                                         --logits full computes every logit (sampling without top-k),\n"
            "                                         top only what top-k sampling needs (g4 run's default)\n"

            "      --logits-npy FILE   write the prefill logits [prompt_len, vocab] as .npy\n"
            "      --dump-dir DIR      write intermediate prefill tensors as .npy (golden names)\n"
            "multi-token prediction (run, chat, eval, bench, serve): --draft DIR  a gemma4_assistant drafter made for the model;\n"
            "  greedy decoding verifies its drafts and gives the same tokens, faster; --draft-tokens K (1-16, default 3)\n"
            "sampling (run -p, chat; run --ids is greedy unless given):\n"
            "  --temp T  --top-k K  --top-p P  --min-p P  --repeat-penalty R  --repeat-last-n N  --seed S\n"
            "  --frequency-penalty F  --presence-penalty P (OpenAI's, [-2, 2])  --logit-bias ID=B (repeatable, [-100, 100])\n",
            G4_VERSION);
    fprintf(f, "engine options (run, chat, eval, bench: --NAME VALUE or --NAME=VALUE; g4_options_parse takes NAME=VALUE):\n");
    print_engine_options(f);
    fprintf(f, "g4 COMMAND --help (or g4 help COMMAND): that command's flags, one line each\n");
}

typedef struct {
    const char *name;
    const command_usage *usage;
} command_help;

/* Every command's usage; eval's tasks are "eval gsm8k", ... */
static const command_help helps[] = {
    {"run", &usage_run},           {"chat", &usage_chat},
    {"serve", &usage_serve},       {"tokenize", &usage_tokenize},
    {"eval", &usage_eval},         {"eval gsm8k", &usage_eval_gsm8k},
    {"eval merge", &usage_eval_merge}, {"eval compare", &usage_eval_compare},
    {"inspect", &usage_inspect},   {"bench", &usage_bench},
    {"synth", &usage_synth},       {"quantize", &usage_quantize},
};

/* The usage of `cmd` (and of its task `sub`, for eval), or NULL; *first is where its flags start. */
static const command_usage *usage_of(const char *cmd, const char *sub, int *first) {
    char name[64];
    *first = 2;
    if (sub && snprintf(name, sizeof name, "%s %s", cmd, sub) < (int)sizeof name)
        for (size_t i = 0; i < sizeof helps / sizeof *helps; i++)
            if (!strcmp(helps[i].name, name)) {
                *first = 3;
                return helps[i].usage;
            }
    for (size_t i = 0; i < sizeof helps / sizeof *helps; i++)
        if (!strcmp(helps[i].name, cmd)) return helps[i].usage;
    return NULL;
}

int main(int argc, char **argv) {
    args_t a = {.argc = argc, .argv = argv, .i = 1, .cmd = argc > 1 ? argv[1] : ""};
    int first;
    const command_usage *u;
    if (argc > 2 && !strcmp(argv[1], "help")) { /* g4 help COMMAND [TASK] */
        if (!(u = usage_of(argv[2], argc > 3 ? argv[3] : NULL, &first)))
            return die("help %s: no such command (commands: run, chat, serve, tokenize, eval, inspect, bench, synth, quantize)", argv[2]);
        print_command_usage(stdout, u);
        return 0;
    }
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if ((u = usage_of(argv[1], argc > 2 ? argv[2] : NULL, &first)) && asks_help(u, argc, argv, first)) {
        print_command_usage(stdout, u);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("g4 %s\n", G4_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(&a);
    if (!strcmp(argv[1], "synth")) return g4_cmd_synth(argc - 1, argv + 1);
    if (!strcmp(argv[1], "quantize")) return g4_cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "run")) {
        /* token ids in and out (--ids), or text (-p, -f, standard input) */
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "--ids") || !strncmp(argv[i], "--ids=", 6)) return cmd_run(&a);
        return cmd_run_text(&a);
    }
    if (!strcmp(argv[1], "chat")) return cmd_chat(&a);
    if (!strcmp(argv[1], "bench")) return cmd_bench(&a);
    if (!strcmp(argv[1], "eval")) return cmd_eval(&a);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(&a);
    if (!strcmp(argv[1], "serve")) return cmd_serve(&a);
    fprintf(stderr, "g4: error: unknown command %s (commands: run, chat, serve, tokenize, eval, inspect, bench, synth, quantize, help)\n", argv[1]);
    return 1;
}
