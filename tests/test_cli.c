/* The g4 command line, driven as a user would: generated ids against the goldens, the .npy
 * outputs, a clean one-line error with exit status 1 for every bad invocation, every command's
 * --help against the flags its parser in tools/ accepts, and the built-in model where -m is
 * missing. */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "testutil.h"
#include "cli_util.h"

static char tmp[256], out_path[512], err_path[512];
static const char *bin;

/* `g4 ARGS`, stdout and stderr into out_path and err_path; the exit status. */
static int run(const char *args) { return run_into(bin, args, out_path, err_path); }

static void expect_error(const char *args, const char *fragment) {
    int rc = run(args);
    char *err = slurp(err_path);
    int lines = 0;
    for (char *p = err; *p; p++) lines += *p == '\n';
    CHECK(rc == 1 && lines == 1 && strstr(err, "error") && strstr(err, fragment), "g4 %s: exit %d, stderr: %s", args, rc, err);
    free(err);
}

static char *ids_csv(const cJSON *arr, const char *sep) {
    static char buf[4096];
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < cJSON_GetArraySize(arr); i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%d", i ? sep : "", (int)cJSON_GetArrayItem(arr, i)->valuedouble);
    return buf;
}

/* Reads a float32 .npy written by g4: checks the header's shape string, returns the data. */
static float *read_npy(const char *path, const char *shape, size_t count) {
    char *buf;
    size_t len;
    if (g4_read_file(path, &buf, &len) != 0) {
        CHECK(0, "%s missing", path);
        return NULL;
    }
    size_t hlen = (size_t)(unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8;
    char want[128];
    snprintf(want, sizeof want, "'shape': %s", shape);
    int ok = len == 10 + hlen + count * 4 && memcmp(buf, "\x93NUMPY\x01\x00", 8) == 0 && (10 + hlen) % 64 == 0 &&
             strstr(buf + 10, want) && strstr(buf + 10, "'descr': '<f4'");
    CHECK(ok, "%s: bad npy (len %zu, header %.*s)", path, len, (int)hlen, buf + 10);
    float *data = NULL;
    if (ok) {
        data = malloc(count * 4);
        memcpy(data, buf + 10 + hlen, count * 4);
    }
    free(buf);
    return data;
}

static void test_generation(const cJSON *golden) {
    char args[16384], ids[4096];
    snprintf(ids, sizeof ids, "%s", ids_csv(cJSON_GetObjectItem(golden, "input_ids"), ","));
    struct { const char *flags, *mode; } runs[] = {
        {"--act float", "float"}, {"--act fake --profile hf", "fakequant-hf"}, {"--act fake", "fakequant-full"}};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "run -m %s --ids %s -n 16 %s", tiny_dir(), ids, runs[i].flags);
        int rc = run(args);
        char *out = slurp(out_path);
        const cJSON *gold = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "modes"), runs[i].mode), "generated_ids");
        char want[4096];
        snprintf(want, sizeof want, "%s\n", ids_csv(gold, " "));
        CHECK(rc == 0 && strcmp(out, want) == 0, "%s: got \"%s\", want \"%s\"", runs[i].mode, out, want);
        free(out);
    }
}

static void test_npy_outputs(const cJSON *golden) {
    char args[8192], dump[600], path[1024], logits_path[600];
    snprintf(dump, sizeof dump, "%s/dump", tmp);
    snprintf(logits_path, sizeof logits_path, "%s/logits.npy", tmp);
    const char *ids = ids_csv(cJSON_GetObjectItem(golden, "input_ids"), ",");
    snprintf(args, sizeof args, "run -m %s --ids %s -n 1 --act float --logits-npy %s --dump-dir %s", tiny_dir(), ids,
             logits_path, dump);
    CHECK(run(args) == 0, "run with --logits-npy/--dump-dir failed");
    g4_safetensors gs;
    snprintf(path, sizeof path, "%s/golden_float.safetensors", tiny_dir());
    if (g4_st_open_file(&gs, path) != 0) return;
    float *lg = read_npy(logits_path, "(24, 512)", 24 * 512);
    if (lg) CHECK(max_abs_diff(lg, golden_f32(&gs, "prefill_logits", NULL), 24 * 512) <= 1e-4, "npy logits");
    free(lg);
    struct { const char *name, *shape; size_t count; } files[] = {
        {"inputs_embeds", "(24, 64)", 24 * 64},          {"per_layer_inputs", "(24, 10, 16)", 24 * 160},
        {"k_layer4", "(24, 1, 32)", 24 * 32},            {"v_layer5", "(24, 1, 16)", 24 * 16},
        {"hidden_after_layer", "(10, 24, 64)", 10 * 24 * 64}, {"final_norm", "(24, 64)", 24 * 64},
        {"prefill_logits", "(24, 512)", 24 * 512}};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s.npy", dump, files[i].name);
        float *d = read_npy(path, files[i].shape, files[i].count);
        if (d) {
            double diff = max_abs_diff(d, golden_f32(&gs, files[i].name, NULL), (int64_t)files[i].count);
            CHECK(diff <= 1e-4, "%s: dump differs from golden by %g", files[i].name, diff);
        }
        free(d);
    }
    g4_st_close(&gs);
}

/* Worked example: tiny-mobile has 5 sliding producers with 1 KV head of 16 and one full producer
 * with 1 KV head of 32: (5*16 + 32) * 2 (K and V) = 224 int8 bytes, 896 as f32. */
static void test_inspect(void) {
    char args[8192];
    snprintf(args, sizeof args, "inspect -m %s", tiny_dir());
    CHECK(run(args) == 0, "inspect failed");
    char *out = slurp(out_path);
    CHECK(strstr(out, "KV cache per token: 224 B with --kv int8 (default), 896 B with --kv f32") != NULL, "inspect: %s", out);
    CHECK(strstr(out, "layer  9: full    head_dim  32  KV from    4  MLP   192 (2-bit)") != NULL, "inspect layer 9 line");
    CHECK(strstr(out, "lm_head                 2-bit     64 -> 512") != NULL, "inspect lm_head line");
    free(out);
}

/* g4 bench --json on the fixture: every promised field, consistent with itself; the bandwidth
 * probe's 1 GiB buffer lives in a child process and must not show in the peak resident memory. */
static void test_bench(void) {
    char args[8192];
    snprintf(args, sizeof args, "bench -m %s -p 16 -n 8 -r 3 -t 2 --act fake --json", tiny_dir());
    int rc = run(args);
    char *out = slurp(out_path);
    cJSON *j = cJSON_Parse(out);
    CHECK(rc == 0 && j, "bench --json: exit %d, output %s", rc, out);
    if (j) {
        double v[16];
        static const char *keys[] = {"load_s", "prefill_tok_s", "prefill_tok_s_min", "prefill_tok_s_max", "decode_tok_s",
                                     "decode_tok_s_min", "decode_tok_s_max", "peak_rss_bytes", "threads", "reps",
                                     "read_bw_bytes_s", "roofline_fraction", "decode_bytes_per_token"};
        for (int i = 0; i < 13; i++) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
            CHECK(cJSON_IsNumber(f), "bench --json: %s missing", keys[i]);
            v[i] = cJSON_IsNumber(f) ? f->valuedouble : -1;
        }
        CHECK(v[0] > 0 && v[1] > 0 && v[4] > 0, "bench: positive load time and speeds");
        CHECK(v[2] <= v[1] && v[1] <= v[3] && v[5] <= v[4] && v[4] <= v[6], "bench: medians within min..max");
        CHECK(v[7] > 1e6 && v[7] < 512e6, "bench: peak RSS %.0f B (the probe buffer must not count)", v[7]);
        CHECK(v[8] == 2 && v[9] == 3, "bench: threads %g, reps %g", v[8], v[9]);
        CHECK(v[10] > 1e8 && v[11] > 0, "bench: bandwidth %g B/s, roofline fraction %g", v[10], v[11]);
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "act");
        CHECK(cJSON_IsString(act) && strcmp(act->valuestring, "fake") == 0, "bench: act");
        /* the probe reads with the widest loads this CPU has */
        const cJSON *loads = cJSON_GetObjectItemCaseSensitive(j, "read_bw_loads");
#if defined(__x86_64__)
        const char *want_loads = __builtin_cpu_supports("avx2") ? "avx2-32" : "vec-16";
#else
        const char *want_loads = "vec-16";
#endif
        CHECK(cJSON_IsString(loads) && strcmp(loads->valuestring, want_loads) == 0, "bench: read_bw_loads %s, want %s",
              cJSON_IsString(loads) ? loads->valuestring : "(missing)", want_loads);
        /* the kernel level it ran, the one it would choose unforced, and the CPU flags behind that */
        const cJSON *kern = cJSON_GetObjectItemCaseSensitive(j, "kernels"), *best = cJSON_GetObjectItemCaseSensitive(j, "kernels_best");
        const cJSON *env = cJSON_GetObjectItemCaseSensitive(j, "kernels_env"), *flags = cJSON_GetObjectItemCaseSensitive(j, "cpu_flags");
        CHECK(cJSON_IsString(kern) && strcmp(kern->valuestring, g4_kernels_get()->name) == 0, "bench: kernels %s, want %s",
              cJSON_IsString(kern) ? kern->valuestring : "(missing)", g4_kernels_get()->name);
        CHECK(cJSON_IsString(best) && strcmp(best->valuestring, g4_kernels_best()->name) == 0, "bench: kernels_best %s, want %s",
              cJSON_IsString(best) ? best->valuestring : "(missing)", g4_kernels_best()->name);
        const char *outer = getenv("G4_DISPATCH");
        CHECK(outer && *outer ? cJSON_IsString(env) && strcmp(env->valuestring, outer) == 0 : cJSON_IsNull(env), "bench: kernels_env");
        char joined[512] = "";
        int strings = cJSON_IsArray(flags);
        for (const cJSON *f = flags ? flags->child : NULL; f; f = f->next) {
            strings &= cJSON_IsString(f);
            if (cJSON_IsString(f)) snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", joined[0] ? " " : "", f->valuestring);
        }
        CHECK(strings && strcmp(joined, g4_kernels_cpu_flags()) == 0, "bench: cpu_flags [%s], want [%s]", joined, g4_kernels_cpu_flags());
        const cJSON *ops = cJSON_GetObjectItemCaseSensitive(j, "ops_decode_s");
        double total = 0;
        for (const cJSON *o = ops ? ops->child : NULL; o; o = o->next) total += o->valuedouble;
        CHECK(cJSON_GetArraySize(ops) == 5 && total > 0, "bench: per-operation decode times");
        cJSON_Delete(j);
    }
    free(out);
    /* --weights mapped keeps the weights in the file mapping, and says so */
    snprintf(args, sizeof args, "bench -m %s -p 4 -n 2 -r 1 --bandwidth off --weights mapped --json", tiny_dir());
    rc = run(args);
    out = slurp(out_path);
    j = cJSON_Parse(out);
    const cJSON *wt = j ? cJSON_GetObjectItemCaseSensitive(j, "weights") : NULL;
    CHECK(rc == 0 && cJSON_IsString(wt) && strcmp(wt->valuestring, "mapped") == 0, "bench --weights mapped: exit %d, output %s", rc, out);
    cJSON_Delete(j);
    free(out);
    /* --kernels: reps alternate between the levels; each level's figures, its ratio to the first */
    snprintf(args, sizeof args, "bench -m %s -p 4 -n 2 -r 2 --bandwidth off --kernels portable,%s --json", tiny_dir(), g4_kernels_best()->name);
    rc = run(args);
    out = slurp(out_path);
    j = cJSON_Parse(out);
    const cJSON *by = j ? cJSON_GetObjectItemCaseSensitive(j, "by_kernels") : NULL;
    CHECK(rc == 0 && cJSON_GetArraySize(by) == 2, "bench --kernels: exit %d, output %s", rc, out);
    const cJSON *top = j ? cJSON_GetObjectItemCaseSensitive(j, "kernels") : NULL;
    CHECK(cJSON_IsString(top) && !strcmp(top->valuestring, "portable"), "bench --kernels: the top-level figures are the first level's");
    for (int l = 0; l < cJSON_GetArraySize(by); l++) {
        const cJSON *e = cJSON_GetArrayItem(by, l), *name = cJSON_GetObjectItemCaseSensitive(e, "kernels");
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(e, "prefill_ratio"), *dr = cJSON_GetObjectItemCaseSensitive(e, "decode_ratio");
        const cJSON *ds = cJSON_GetObjectItemCaseSensitive(e, "decode_tok_s");
        const char *want = l ? g4_kernels_best()->name : "portable";
        CHECK(cJSON_IsString(name) && !strcmp(name->valuestring, want) && cJSON_IsNumber(ds) && ds->valuedouble > 0 &&
                  cJSON_IsNumber(pr) && pr->valuedouble > 0 && cJSON_IsNumber(dr) && dr->valuedouble > 0 &&
                  (l || (pr->valuedouble == 1 && dr->valuedouble == 1)),
              "bench --kernels: level %d (%s): name, speed and ratios", l, want);
    }
    cJSON_Delete(j);
    free(out);
    /* --alternate steps: decode steps alternate too, each level's median step and its ratio */
    snprintf(args, sizeof args, "bench -m %s -p 4 -n 6 -r 1 --bandwidth off --kernels portable,%s --alternate steps --json", tiny_dir(),
             g4_kernels_best()->name);
    rc = run(args);
    out = slurp(out_path);
    j = cJSON_Parse(out);
    by = j ? cJSON_GetObjectItemCaseSensitive(j, "by_kernels") : NULL;
    int steps_ok = rc == 0 && cJSON_GetArraySize(by) == 2;
    for (int l = 0; steps_ok && l < 2; l++) {
        const cJSON *e = cJSON_GetArrayItem(by, l), *m = cJSON_GetObjectItemCaseSensitive(e, "decode_step_s_median");
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, "decode_step_ratio");
        steps_ok = cJSON_IsNumber(m) && m->valuedouble > 0 && cJSON_IsNumber(r) && r->valuedouble > 0 && (l || r->valuedouble == 1);
    }
    CHECK(steps_ok, "bench --alternate steps: exit %d, output %s", rc, out);
    cJSON_Delete(j);
    free(out);
    /* several -m: reps alternate between the checkpoints (the mobile fixture and the Q4_0 one);
     * each model's figures, its bytes per token and its ratio to the first */
    snprintf(args, sizeof args, "bench -m %s -m tests/fixtures/tiny-q4_0 -p 4 -n 2 -r 2 --bandwidth off --json", tiny_dir());
    rc = run(args);
    out = slurp(out_path);
    j = cJSON_Parse(out);
    by = j ? cJSON_GetObjectItemCaseSensitive(j, "by_model") : NULL;
    int models_ok = rc == 0 && cJSON_GetArraySize(by) == 2;
    double model_bytes[2] = {0, 0};
    for (int l = 0; models_ok && l < 2; l++) {
        const cJSON *e = cJSON_GetArrayItem(by, l), *name = cJSON_GetObjectItemCaseSensitive(e, "model");
        const cJSON *ds = cJSON_GetObjectItemCaseSensitive(e, "decode_tok_s"), *dr = cJSON_GetObjectItemCaseSensitive(e, "decode_ratio");
        const cJSON *by_tok = cJSON_GetObjectItemCaseSensitive(e, "decode_bytes_per_token");
        models_ok = cJSON_IsString(name) && strstr(name->valuestring, l ? "tiny-q4_0" : "tiny-mobile") && cJSON_IsNumber(ds) &&
                    ds->valuedouble > 0 && cJSON_IsNumber(dr) && (l || dr->valuedouble == 1) && cJSON_IsNumber(by_tok);
        model_bytes[l] = models_ok ? by_tok->valuedouble : 0;
    }
    CHECK(models_ok && model_bytes[0] > 0 && model_bytes[1] > 0 && model_bytes[0] != model_bytes[1], "bench -m -m: exit %d, output %s", rc,
          out);
    cJSON_Delete(j);
    free(out);
    snprintf(args, sizeof args, "bench -m %s -m %s --kernels portable", tiny_dir(), tiny_dir());
    expect_error(args, "several -m compare models");
    snprintf(args, sizeof args, "bench -m %s --alternate steps", tiny_dir());
    expect_error(args, "--alternate steps needs --kernels");
    snprintf(args, sizeof args, "bench -m %s --kernels avx2,bogus", tiny_dir());
    expect_error(args, "bogus is not a level");
    snprintf(args, sizeof args, "bench -m %s --kernels portable,portable", tiny_dir());
    expect_error(args, "given twice");
    snprintf(args, sizeof args, "bench -m %s --weights disk", tiny_dir());
    expect_error(args, "--weights");
    snprintf(args, sizeof args, "bench -m %s -t 0", tiny_dir());
    expect_error(args, "-t");
    snprintf(args, sizeof args, "bench -m %s -p 0 -n 0", tiny_dir());
    expect_error(args, "-p and -n");
}

/* ---- --help: each command's usage names exactly the flags its parser accepts ---- */

/* The body of function `name` in the source file text (from its definition to the closing brace
 * at the start of a line), or NULL. */
static const char *function_body(const char *text, const char *name, size_t *len) {
    char def[128];
    const char *prefixes[] = {"\nstatic int ", "\nint "};
    for (int i = 0; i < 2; i++) {
        snprintf(def, sizeof def, "%s%s(", prefixes[i], name);
        for (const char *start = text; (start = strstr(start, def)); start++) {
            const char *end = strstr(start, "\n}\n");
            if (end && strcspn(start, ";{") < strlen(start) && start[strcspn(start, ";{")] == '{') { /* not a declaration */
                *len = (size_t)(end - start);
                return start;
            }
        }
    }
    return NULL;
}

#define MAX_FLAGS 160

typedef struct {
    char *flag[MAX_FLAGS];
    int n;
} flag_set;

static void add_flag(flag_set *s, const char *f, size_t n) {
    for (int i = 0; i < s->n; i++)
        if (strlen(s->flag[i]) == n && !strncmp(s->flag[i], f, n)) return;
    if (s->n < MAX_FLAGS) s->flag[s->n++] = strndup(f, n);
}

static int has_flag(const flag_set *s, const char *f, size_t n) {
    for (int i = 0; i < s->n; i++)
        if (strlen(s->flag[i]) == n && !strncmp(s->flag[i], f, n)) return 1;
    return 0;
}

static void free_flags(flag_set *s) {
    for (int i = 0; i < s->n; i++) free(s->flag[i]);
    s->n = 0;
}

static void add_functions(flag_set *s, const char *file, const char *names);

/* The flags a parser function tests its argument against (flag_is(a, "-x"), is_flag(a, "-x"),
 * strcmp(a, "-x"), strncmp(a, "--x=", n)), and those of the shared parsers it calls: engine_flag
 * (every row of the options table), sampling_flag and draft_flag (their bodies in tools/cli.c). */
static void add_function(flag_set *s, const char *file, const char *name) {
    char *text = slurp(file);
    size_t len = 0;
    const char *found = function_body(text, name, &len);
    CHECK(found != NULL, "%s: no function %s", file, name);
    const char *open = found ? memchr(found, '{', len) : NULL; /* the body, not the definition's name */
    char *body = open ? strndup(open, len - (size_t)(open - found)) : NULL;
    free(text);
    if (!body) return;
    static const char *const calls[] = {"flag_is(a, \"", "is_flag(a, \"", "strcmp(a, \"", "strncmp(a, \""};
    for (size_t c = 0; c < sizeof calls / sizeof *calls; c++)
        for (const char *p = body; (p = strstr(p, calls[c]));) {
            p += strlen(calls[c]);
            size_t n = strcspn(p, "\"=");
            if (p[0] == '-') add_flag(s, p, n);
        }
    if (strstr(body, "engine_flag(a"))
        for (int i = 0; i < g4_option_count(); i++) {
            const g4_option_info *o = g4_option_at(i);
            char f[64];
            int n = snprintf(f, sizeof f, "--%s", o->name);
            for (int k = 2; k < n; k++) f[k] = f[k] == '_' ? '-' : f[k];
            add_flag(s, f, (size_t)n);
            if (o->short_flag) add_flag(s, o->short_flag, strlen(o->short_flag));
        }
    if (strstr(body, "sampling_flag(a")) add_functions(s, "tools/cli.c", "sampling_flag");
    if (strstr(body, "draft_flag(a")) add_functions(s, "tools/cli.c", "draft_flag");
    free(body);
}

static void add_functions(flag_set *s, const char *file, const char *names) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", names);
    for (char *save = NULL, *n = strtok_r(buf, " ", &save); n; n = strtok_r(NULL, " ", &save)) add_function(s, file, n);
}

/* `flag` appears in text as a word of its own ("-n" not inside "--max-tokens" or "-n8"). */
static int names_word(const char *text, const char *flag) {
    size_t n = strlen(flag);
    for (const char *p = text; (p = strstr(p, flag)); p++) {
        char before = p == text ? ' ' : p[-1], after = p[n];
        if (strchr(" ,[(|\n", before) && (after == 0 || strchr(" ,])|=\n", after))) return 1;
    }
    return 0;
}

/* The flags at the start of the usage's flag lines ("  -m, --model DIR  ..."). */
static void usage_flags(const char *out, flag_set *s) {
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, "  -", 3) != 0) continue;
        for (const char *p = line + 2; *p == '-';) {
            size_t n = strcspn(p, " ,\n");
            add_flag(s, p, n);
            p += n;
            if (*p != ',') break;
            p += strspn(p, ", ");
        }
    }
}

static void test_help(void) {
    /* each command, and its parser functions in the sources */
    static const struct {
        const char *cmd, *file, *funcs, *file2, *funcs2;
    } cmds[] = {
        {"run", "tools/main.c", "parse_run", "tools/text_cmds.c", "cmd_run_text text_flag"},
        {"chat", "tools/text_cmds.c", "cmd_chat text_flag", NULL, NULL},
        {"tokenize", "tools/text_cmds.c", "cmd_tokenize", NULL, NULL},
        {"inspect", "tools/main.c", "cmd_inspect", NULL, NULL},
        {"bench", "tools/bench_cmd.c", "parse_bench", NULL, NULL},
        {"eval gsm8k", "tools/eval_cmd.c", "eval_flag", NULL, NULL},
        {"eval merge", NULL, NULL, NULL, NULL},
        {"eval compare", NULL, NULL, NULL, NULL},
        {"eval", NULL, NULL, NULL, NULL},
        {"serve", "tools/serve_cmd.c", "parse_serve_args", NULL, NULL},
        {"synth", "tools/synth_cmd.c", "g4_cmd_synth", NULL, NULL},
        {"quantize", "tools/quantize_cmd.c", "g4_cmd_quantize", NULL, NULL},
    };
    int checked = 0;
    for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
        flag_set parsed = {0}, listed = {0};
        add_flag(&parsed, "-h", 2);
        add_flag(&parsed, "--help", 6);
        if (cmds[c].file) add_functions(&parsed, cmds[c].file, cmds[c].funcs);
        if (cmds[c].file2) add_functions(&parsed, cmds[c].file2, cmds[c].funcs2);
        const char *forms[] = {"%s --help", "%s -h", "help %s"};
        char *first = NULL;
        for (int f = 0; f < 3; f++) {
            char args[256], want[128];
            snprintf(args, sizeof args, forms[f], cmds[c].cmd);
            int rc = run(args);
            char *out = slurp(out_path), *err = slurp(err_path);
            snprintf(want, sizeof want, "usage: g4 %s", cmds[c].cmd);
            CHECK(rc == 0 && !strncmp(out, want, strlen(want)) && !*err, "g4 %s: exit %d, stdout %.80s, stderr %s", args, rc, out, err);
            CHECK(!first || !strcmp(first, out), "g4 %s: not the usage of g4 %s --help", args, cmds[c].cmd);
            free(err);
            if (first) free(out);
            else first = out;
        }
        for (int i = 0; i < parsed.n; i++)
            CHECK(names_word(first, parsed.flag[i]), "g4 %s --help does not name %s, which its parser accepts", cmds[c].cmd, parsed.flag[i]);
        usage_flags(first, &listed);
        for (int i = 0; i < listed.n; i++)
            CHECK(has_flag(&parsed, listed.flag[i], strlen(listed.flag[i])), "g4 %s --help lists %s, which its parser does not accept",
                  cmds[c].cmd, listed.flag[i]);
        checked += parsed.n;
        free(first);
        free_flags(&parsed);
        free_flags(&listed);
    }
    /* a "--help" that is a flag's value is that value */
    char args[8192];
    snprintf(args, sizeof args, "run -m %s -p --help -n 1 --chat-form e2b", tiny_dir());
    int rc = run(args);
    char *out = slurp(out_path);
    CHECK(strncmp(out, "usage:", 6) != 0, "g4 run -p --help printed the usage");
    free(out);
    (void)rc;
    printf("ok help: %d flags of 12 commands named in their usage\n", checked);
}

/* Without -m, inspect, bench and run --ids use the built-in model ($G4_MODEL here, the tiny
 * fixture): the same output as with -m (tokenize: test_text_cli, the fixture has no tokenizer). */
static void test_default_model(void) {
    char args[8192];
    const char *m = tiny_dir();
    setenv("G4_MODEL", m, 1);
    snprintf(args, sizeof args, "inspect -m %s", m);
    CHECK(run(args) == 0, "inspect -m failed");
    char *with = slurp(out_path);
    CHECK(run("inspect") == 0, "inspect without -m failed");
    char *without = slurp(out_path);
    /* all but the last line, which has the load time */
    char *a = strstr(with, "  load time:"), *b = strstr(without, "  load time:");
    CHECK(a && b && a - with == b - without && !strncmp(with, without, (size_t)(a - with)), "inspect without -m: %s", without);
    free(with);
    free(without);
    CHECK(run("run --ids 2,3 -n 4") == 0, "run --ids without -m failed");
    without = slurp(out_path);
    snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 4", m);
    CHECK(run(args) == 0, "run --ids -m failed");
    with = slurp(out_path);
    CHECK(!strcmp(with, without) && *with, "run --ids without -m: %s, with: %s", without, with);
    free(with);
    free(without);
    CHECK(run("bench -p 4 -n 2 -r 1 --bandwidth off --json") == 0, "bench without -m failed");
    char *json = slurp(out_path);
    cJSON *j = cJSON_Parse(json);
    const char *model = cJSON_GetStringValue(cJSON_GetObjectItem(j, "model"));
    CHECK(j && model && !strcmp(model, m), "bench without -m: %s", json);
    cJSON_Delete(j);
    free(json);
    unsetenv("G4_MODEL");
    printf("ok default model: inspect, run --ids and bench without -m\n");
}

static void test_errors(void) {
    char args[8192];
    const char *m = tiny_dir();
    expect_error("frobnicate", "unknown command");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --act fast", m);
    expect_error(args, "--act fast");
    snprintf(args, sizeof args, "run -m %s --ids 2,x,3", m);
    expect_error(args, "--ids");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --bogus", m);
    expect_error(args, "unknown flag --bogus");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 -n -1", m);
    expect_error(args, "-n");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --ctx", m);
    expect_error(args, "--ctx needs a value");
    /* OpenAI's sampling flags: their ranges, and a bias on a token the model lacks */
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --logit-bias 5", m);
    expect_error(args, "--logit-bias 5");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --logit-bias 5=101", m);
    expect_error(args, "--logit-bias 5=101");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --presence-penalty 2.5", m);
    expect_error(args, "--presence-penalty 2.5");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --frequency-penalty x", m);
    expect_error(args, "--frequency-penalty x");
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --temp 0 --logit-bias 600=1", m);
    expect_error(args, "token id 600 is outside the vocabulary");
    /* +100 forces its token at every step */
    snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 4 --temp 0 --logit-bias 7=100", m);
    {
        int forced_rc = run(args);
        char *forced = slurp(out_path);
        CHECK(forced_rc == 0 && !strcmp(forced, "7 7 7 7\n"), "--logit-bias 7=100 forces token 7: %s", forced);
        free(forced);
    }
    snprintf(args, sizeof args, "run -m %s --ids 2,99999", m);
    expect_error(args, "token id 99999");
    snprintf(args, sizeof args, "run -m %s --ids 2,3,4,5,6 --ctx 4", m);
    expect_error(args, "does not fit the context");
    /* generation that reaches the end of the context stops there, with a warning */
    snprintf(args, sizeof args, "run -m %s --ids 2,3 -n 8 --ctx 4", m);
    int rc = run(args);
    char *out = slurp(out_path), *err = slurp(err_path);
    int ids = 0;
    for (char *p = strtok(out, " \n"); p; p = strtok(NULL, " \n")) ids++;
    CHECK(rc == 0 && ids == 3 && strstr(err, "context of 4 tokens is full"), "ctx-limited run: exit %d, %d ids, stderr %s", rc, ids, err);
    free(out);
    free(err);
    /* the KV cache is checked against the memory available before it is allocated:
     * 8192 tokens x 224 B = 1.75 MiB, above a 1 MiB limit */
    snprintf(args, sizeof args, "run -m %s --ids 2,3 --ctx 8192", m);
    setenv("G4_MEMORY_LIMIT_MB", "1", 1);
    expect_error(args, "needs 2 MiB, but only 1 MiB of memory are available");
    unsetenv("G4_MEMORY_LIMIT_MB");
    expect_error("inspect -m /nonexistent/folder", "/nonexistent/folder");
}

int main(void) {
    if (!(bin = check_bin())) return check_report("cli");
    snprintf(tmp, sizeof tmp, "/tmp/g4-cli-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmp);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmp);
    char path[8192];
    snprintf(path, sizeof path, "%s/golden.json", tiny_dir());
    cJSON *golden = read_json(path);
    test_generation(golden);
    test_npy_outputs(golden);
    test_inspect();
    test_bench();
    test_errors();
    test_help();
    test_default_model();
    cJSON_Delete(golden);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("cli");
}
