/* The end-to-end quality gate on the built-in trained model (models/gemma4-tiny-math): `g4 eval
 * gsm8k` on its held-out problems in `int` mode must score no lower than the accuracy the training
 * script measured in PyTorch with the same quantization, minus 2 points. `fake` and `float` are
 * reported (on the first 200, to keep the test within a few minutes on 2 cores). */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>

#include "testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation" /* fixed buffers far above the paths used */

#define MODEL "models/gemma4-tiny-math"

/* Runs the eval and returns the summary record's accuracy (or -1). */
static double eval_accuracy(const char *bin, const char *act, int n, const char *out) {
    char cmd[4096], limit[32] = "";
    if (n) snprintf(limit, sizeof limit, "--n %d", n);
    snprintf(cmd, sizeof cmd, "rm -f %s && %s eval gsm8k -m %s --data %s/test.jsonl --act %s --batch 8 %s --out %s 2>&1 | tail -3", out,
             bin, MODEL, MODEL, act, limit, out);
    int st = system(cmd);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
    FILE *f = fopen(out, "r");
    char *line = NULL;
    size_t cap = 0;
    double acc = -1;
    while (f && getline(&line, &cap, f) > 0) {
        cJSON *r = cJSON_Parse(line);
        const cJSON *type = cJSON_GetObjectItem(r, "type"), *a = cJSON_GetObjectItem(r, "accuracy");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "summary") && cJSON_IsNumber(a)) acc = a->valuedouble;
        cJSON_Delete(r);
    }
    free(line);
    if (f) fclose(f);
    return acc;
}

int main(void) {
    const char *bin = getenv("G4_BIN");
    if (!bin) return 2;
    cJSON *metrics = read_json(MODEL "/metrics.json");
    const cJSON *torch = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(metrics, "accuracy"), "export_full_fakequant"), "accuracy");
    CHECK(cJSON_IsNumber(torch), "metrics.json lacks accuracy.export_full_fakequant.accuracy");
    double want = cJSON_IsNumber(torch) ? torch->valuedouble - 0.02 : 1;
    double acc_int = eval_accuracy(bin, "int", 0, "/tmp/g4-quality-int.jsonl");
    printf("quality: int   %.1f%% on all held-out problems (PyTorch, same quantization: %.1f%%; gate %.1f%%)\n", 100 * acc_int,
           100 * (want + 0.02), 100 * want);
    CHECK(acc_int >= want, "int accuracy %.3f below %.3f", acc_int, want);
    double acc_fake = eval_accuracy(bin, "fake", 200, "/tmp/g4-quality-fake.jsonl");
    double acc_float = eval_accuracy(bin, "float", 200, "/tmp/g4-quality-float.jsonl");
    CHECK(acc_fake >= 0 && acc_float >= 0, "fake/float runs failed");
    printf("quality: fake  %.1f%%, float %.1f%% on the first 200 (reported, not gated)\n", 100 * acc_fake, 100 * acc_float);
    cJSON_Delete(metrics);
    return check_report("quality");
}
