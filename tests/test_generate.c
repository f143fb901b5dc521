/* The generation loop on the tiny fixture: greedy output equals the golden ids, and each stop
 * reason (stop id, budget, callback, context) ends generation where it should. */
#include "testutil.h"

static int collect(void *user, int32_t token) {
    static int i;
    int32_t *out = user;
    out[i++ % 64] = token;
    return 0;
}

static int stop_after_two(void *user, int32_t token) {
    (void)token;
    return ++*(int *)user == 2;
}

int main(void) {
    char path[8192];
    snprintf(path, sizeof path, "%s/golden.json", tiny_dir());
    cJSON *golden = read_json(path);
    int n, n_gold;
    int32_t *ids = json_ids(cJSON_GetObjectItem(golden, "input_ids"), &n);
    int32_t *gold = json_ids(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(golden, "modes"), "fakequant-full"), "generated_ids"), &n_gold);
    g4_model *m = g4_model_load(tiny_dir());
    if (!m) return 2;
    g4_options o;
    g4_options_default(&o);
    o.ctx = 64;
    g4_session *s = g4_session_new(m, &o);
    static const int none[1] = {-1};
    g4_generate_params p = {.max_tokens = n_gold, .stop_ids = none, .n_stop_ids = 1};
    g4_sampling_default(&p.sampling);
    g4_generate_result r;
    CHECK(g4_generate(s, ids, n, &p, NULL, NULL, &r) == 0, "%s", g4_last_error());
    CHECK(r.stop == G4_STOP_BUDGET && r.n_generated == n_gold, "budget: stop %d after %d", r.stop, r.n_generated);
    CHECK_EQ_INT(g4_session_pos(s), n + n_gold - 1);

    /* a stop id: generation ends on it, reporting it */
    g4_session_reset(s);
    int stop_id = gold[3];
    p.stop_ids = &stop_id;
    CHECK(g4_generate(s, ids, n, &p, NULL, NULL, &r) == 0, "%s", g4_last_error());
    CHECK(r.stop == G4_STOP_EOS && r.stop_id == stop_id && r.n_generated == 4, "eos: stop %d id %d after %d", r.stop, r.stop_id, r.n_generated);

    /* the callback stops it */
    g4_session_reset(s);
    p.stop_ids = none;
    int count = 0;
    CHECK(g4_generate(s, ids, n, &p, stop_after_two, &count, &r) == 0, "%s", g4_last_error());
    CHECK(r.stop == G4_STOP_USER && r.n_generated == 2, "user: stop %d after %d", r.stop, r.n_generated);

    /* a second call continues in the same cache: prompt split over two calls gives the golden ids */
    g4_session_reset(s);
    p.max_tokens = 1;
    CHECK(g4_generate(s, ids, 10, &p, NULL, NULL, &r) == 0, "%s", g4_last_error());
    CHECK_EQ_INT(g4_session_pos(s), 10);
    p.max_tokens = n_gold;
    int32_t got[64];
    int n_got = 0;
    CHECK(g4_generate(s, ids + 10, n - 10, &p, collect, got, &r) == 0, "%s", g4_last_error());
    n_got = r.n_generated;
    CHECK(n_got == n_gold && memcmp(got, gold, sizeof *gold * (size_t)n_gold) == 0, "split prompt: different tokens");

    /* a prompt past the context fails before computing anything */
    g4_session_reset(s);
    int32_t *big = calloc(80, sizeof *big);
    CHECK(g4_generate(s, big, 80, &p, NULL, NULL, &r) != 0 && strstr(g4_last_error(), "does not fit the context"), "%s", g4_last_error());
    CHECK_EQ_INT(g4_session_pos(s), 0);
    free(big);
    g4_session_free(s);
    g4_model_free(m);
    free(ids);
    free(gold);
    cJSON_Delete(golden);
    return check_report("generate");
}
