/* Constrained generation (g4_generate_params.constraint) on the tiny fixture with random weights
 * and a synthetic 512-token BPE tokenizer (byte-fallback tokens included, g4_synth_write_tokenizer):
 * - sampled at temperature 1 over many seeds, every output that ends (a stop id) is a JSON value
 *   that Python's jsonschema (tests/structured/validate.py, nothing of g4's grammar code)
 *   validates against its schema; one that runs out of budget is an unfinished prefix;
 * - the stop id comes only where the grammar is complete, and every token is one the mask allows;
 * - greedy decoding under a constraint and a GBNF grammar; a state warmed by another
 *   generation's masks (g4_grammar_state_keep_cache) gives the same tokens as a cold one. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "cli_util.h"
#include "model/synth.h"

static const char *SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":3},"
    "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"tags\",\"ok\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":4}",
    "{\"anyOf\":[{\"type\":\"string\",\"format\":\"date\"},{\"const\":null}]}",
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,5}-[0-9]{1,3}$\"}",
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"kind\":{\"enum\":[\"x\",\"y\"]}},\"required\":[\"id\",\"kind\"],\"additionalProperties\":false}",
};
#define N_SCHEMAS (int)(sizeof SCHEMAS / sizeof *SCHEMAS)
#define SEEDS 40
#define BUDGET 160

static char tmp[256];
static g4_tokenizer *tok;
static g4_grammar_vocab *vocab;

static g4_session *new_session(const g4_model *m) {
    g4_options o;
    g4_options_default(&o);
    o.ctx = BUDGET + 16;
    return g4_session_new(m, &o);
}

/* One constrained generation from a fixed prompt; its tokens into ids (room BUDGET), count returned. */
static int generate(g4_session *s, const g4_grammar_state *start, uint64_t seed, float temp, int32_t *ids, g4_generate_result *r,
                    g4_grammar_state *warm_into) {
    static const int32_t prompt[] = {2, 105, 300, 301, 302, 106};
    g4_generate_params p = {0};
    p.max_tokens = BUDGET;
    g4_sampling_default(&p.sampling);
    p.sampling.temperature = temp;
    p.sampling.seed = seed;
    p.constraint = start;
    p.constraint_vocab = vocab;
    g4_stepper *st = g4_stepper_new(s, 0);
    g4_session_reset(s);
    CHECK(st && g4_stepper_add(st, 0, prompt, 6, &p) == 0, "add: %s", g4_last_error());
    g4_step_token ev[G4_MAX_DRAFT_TOKENS + 1];
    while (g4_stepper_active(st) > 0) CHECK(g4_stepper_step(st, ev) >= 0, "step: %s", g4_last_error());
    g4_stepper_result(st, 0, r);
    int n;
    const int32_t *got = g4_stepper_tokens(st, 0, &n);
    memcpy(ids, got, sizeof *ids * (size_t)n);
    if (warm_into) CHECK(g4_grammar_state_keep_cache(warm_into, g4_stepper_constraint(st, 0)) == 0, "keep_cache: %s", g4_last_error());
    g4_stepper_free(st);
    return n;
}

/* The text of ids (a trailing stop id left out) as the tokenizer decodes it. */
static char *text_of(const int32_t *ids, int n, const g4_generate_result *r) {
    if (r->stop == G4_STOP_EOS && r->stop_id >= 0) n--;
    char *text;
    size_t len;
    CHECK(g4_tokenizer_decode(tok, ids, (size_t)n, &text, &len) == 0, "decode");
    return text;
}

/* Every token a generation took, replayed on a fresh state: accepted, the stop only where complete. */
static int replay_ok(const g4_grammar *g, const int32_t *ids, int n, const g4_generate_result *r) {
    g4_grammar_state *st = g4_grammar_start(g);
    int ok = st != NULL, body = r->stop == G4_STOP_EOS && r->stop_id >= 0 ? n - 1 : n;
    for (int i = 0; ok && i < body; i++) ok = g4_grammar_accept_token(vocab, st, ids[i]) == 0;
    if (ok && r->stop == G4_STOP_EOS) ok = g4_grammar_is_complete(st);
    if (ok && r->stop == G4_STOP_BUDGET) ok = body == BUDGET;
    g4_grammar_state_free(st);
    return ok;
}

static void test_schemas(g4_session *s) {
    char path[300];
    snprintf(path, sizeof path, "%s/outputs.jsonl", tmp);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    int ended = 0, total = 0;
    for (int k = 0; k < N_SCHEMAS; k++) {
        g4_grammar *g = g4_grammar_from_json_schema(SCHEMAS[k], strlen(SCHEMAS[k]));
        CHECK(g != NULL, "schema %d: %s", k, g4_last_error());
        g4_grammar_state *start = g4_grammar_start(g);
        int ended_here = 0;
        for (int seed = 1; seed <= SEEDS; seed++) {
            int32_t ids[BUDGET];
            g4_generate_result r;
            int n = generate(s, start, (uint64_t)seed * 7919u + (uint64_t)k, 1.0f, ids, &r, start);
            CHECK(r.stop == G4_STOP_EOS || r.stop == G4_STOP_BUDGET, "schema %d seed %d: stop %s", k, seed, g4_stop_reason_name(r.stop));
            CHECK(replay_ok(g, ids, n, &r), "schema %d seed %d: a token the grammar refuses, or a stop where it is not complete", k, seed);
            total++;
            if (r.stop != G4_STOP_EOS) continue;
            char *text = text_of(ids, n, &r);
            json_line(f, SCHEMAS[k], text);
            if (seed == 1) printf("  schema %d, seed 1: %s\n", k, text);
            free(text);
            ended++, ended_here++;
        }
        /* the random model wanders, but most replies must finish within the budget for the check to mean much */
        CHECK(ended_here >= SEEDS / 2, "schema %d: only %d of %d replies finished in %d tokens", k, ended_here, SEEDS, BUDGET);
        g4_grammar_state_free(start);
        g4_grammar_free(g);
    }
    fclose(f);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "python3 tests/structured/validate.py %s", path);
    int rc = sh(cmd);
    CHECK(rc == 0, "jsonschema refused outputs (%s)", path);
    printf("ok schemas: %d of %d sampled replies finished, all validated by jsonschema\n", ended, total);
}

/* Greedy decoding under a GBNF grammar; the same tokens from a cold start and a warmed copy. */
static void test_grammar_greedy(g4_session *s) {
    const char *gbnf = "root ::= \"(\" expr \")\"\nexpr ::= term ([-+*/] term){0,4}\nterm ::= [0-9]{1,3} | \"x\"\n";
    g4_grammar *g = g4_grammar_compile(gbnf, strlen(gbnf));
    CHECK(g != NULL, "%s", g4_last_error());
    g4_grammar_state *cold = g4_grammar_start(g), *warm = g4_grammar_start(g);
    int32_t a[BUDGET], b[BUDGET];
    g4_generate_result ra, rb;
    int na = generate(s, cold, 0, 0.0f, a, &ra, warm); /* warm takes the first run's mask cache */
    int nb = generate(s, warm, 0, 0.0f, b, &rb, NULL);
    CHECK(ra.stop == G4_STOP_EOS && replay_ok(g, a, na, &ra), "greedy under a grammar: stop %s", g4_stop_reason_name(ra.stop));
    CHECK(na == nb && memcmp(a, b, sizeof *a * (size_t)na) == 0, "a warmed state gave other tokens (%d vs %d)", na, nb);
    char *text = text_of(a, na, &ra);
    CHECK(text[0] == '(' && text[strlen(text) - 1] == ')', "greedy output \"%s\"", text);
    printf("ok grammar greedy: \"%s\", warm == cold\n", text);
    free(text);
    g4_grammar_state_free(cold);
    g4_grammar_state_free(warm);
    g4_grammar_free(g);
}

/* g4_grammar_cache: one compile per schema text, a warmed start state giving the tokens a cold
 * one gives, least recently used entries dropped past max_entries but never one a running state
 * holds, a bad schema's compile error passed through. */
static void test_cache(g4_session *s, const g4_tokenizer *t) {
    g4_grammar_cache *c = g4_grammar_cache_new(t, 2);
    CHECK(c != NULL, "%s", g4_last_error());
    const g4_grammar_vocab *saved = vocab;
    vocab = (g4_grammar_vocab *)g4_grammar_cache_vocab(c);
    int32_t a[BUDGET], b[BUDGET];
    g4_generate_result ra, rb;
    g4_grammar *g = g4_grammar_from_json_schema(SCHEMAS[0], strlen(SCHEMAS[0]));
    g4_grammar_state *cold = g4_grammar_start(g);
    int na = generate(s, cold, 5, 1.0f, a, &ra, NULL);
    for (int r = 0; r < 3; r++) {
        g4_grammar_state *st = g4_grammar_cache_start(c, G4_CONSTRAINT_JSON_SCHEMA, SCHEMAS[0], strlen(SCHEMAS[0]));
        CHECK(st != NULL, "%s", g4_last_error());
        int nb = generate(s, st, 5, 1.0f, b, &rb, st); /* the state warms itself: the entry gets it back below */
        CHECK(nb == na && memcmp(a, b, sizeof *a * (size_t)na) == 0, "request %d from the cache: other tokens than a cold state's", r);
        g4_grammar_cache_done(c, st, st); /* st holds the generation's mask cache: the entry keeps it */
    }
    int entries;
    long compiles, hits;
    g4_grammar_cache_stats(c, &entries, &compiles, &hits);
    CHECK(entries == 1 && compiles == 1 && hits == 2, "one schema thrice: %d entries, %ld compiles, %ld hits", entries, compiles, hits);
    /* capacity 2: a held entry survives two others passing through */
    g4_grammar_state *held = g4_grammar_cache_start(c, G4_CONSTRAINT_JSON_SCHEMA, SCHEMAS[0], strlen(SCHEMAS[0]));
    for (int k = 1; k <= 3; k++) g4_grammar_cache_done(c, g4_grammar_cache_start(c, G4_CONSTRAINT_JSON_SCHEMA, SCHEMAS[k], strlen(SCHEMAS[k])), NULL);
    g4_grammar_cache_stats(c, &entries, &compiles, &hits);
    CHECK(entries == 2 && compiles == 4, "capacity 2: %d entries, %ld compiles", entries, compiles);
    CHECK(g4_grammar_accept_bytes(held, "{", 1) == 0, "the held state's grammar went away");
    g4_grammar_cache_done(c, held, NULL);
    g4_grammar_cache_done(c, g4_grammar_cache_start(c, G4_CONSTRAINT_JSON_SCHEMA, SCHEMAS[0], strlen(SCHEMAS[0])), NULL);
    g4_grammar_cache_stats(c, &entries, &compiles, &hits);
    CHECK(compiles == 4 && hits == 4, "the held entry was dropped: %ld compiles, %ld hits", compiles, hits);
    CHECK(!g4_grammar_cache_start(c, G4_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"strin\"}", 17) && strstr(g4_last_error(), "unknown type"),
          "bad schema: %s", g4_last_error());
    g4_grammar_state_free(cold);
    g4_grammar_free(g);
    g4_grammar_cache_free(c);
    vocab = (g4_grammar_vocab *)saved;
    printf("ok cache\n");
}

/* Thinking under a constraint: a first token thought_open (forced here by a logit bias, with the
 * close the same id so the thought is one token long) is free, the answer after the close follows
 * the schema; without thought_open the biased token is never taken. */
static void test_thought(g4_session *s) {
    static const int32_t prompt[] = {2, 105, 300};
    const int32_t mark = 7; /* a special token of the synthetic tokenizer: never allowed by a mask */
    float bias = 100;
    g4_grammar *g = g4_grammar_from_json_schema(SCHEMAS[1], strlen(SCHEMAS[1]));
    g4_grammar_state *start = g4_grammar_start(g);
    for (int think = 0; think < 2; think++) {
        g4_generate_params p = {0};
        p.max_tokens = BUDGET;
        g4_sampling_default(&p.sampling);
        p.sampling.temperature = 1, p.sampling.seed = 11;
        p.sampling.bias_ids = &mark, p.sampling.bias_values = &bias, p.sampling.n_bias = 1;
        p.constraint = start, p.constraint_vocab = vocab;
        if (think) p.thought_open = p.thought_close = mark;
        g4_stepper *st = g4_stepper_new(s, 0);
        g4_session_reset(s);
        CHECK(g4_stepper_add(st, 0, prompt, 3, &p) == 0, "%s", g4_last_error());
        g4_step_token ev[G4_MAX_DRAFT_TOKENS + 1];
        while (g4_stepper_active(st) > 0) CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
        g4_generate_result r;
        g4_stepper_result(st, 0, &r);
        int n;
        const int32_t *ids = g4_stepper_tokens(st, 0, &n);
        int marks = 0;
        for (int i = 0; i < n; i++) marks += ids[i] == mark;
        int skip = think ? 2 : 0;
        CHECK(marks == skip && (!think || (ids[0] == mark && ids[1] == mark)), "think %d: %d thought marks", think, marks);
        CHECK(r.stop == G4_STOP_EOS && replay_ok(g, ids + skip, n - skip, &r), "think %d: the answer after the thought breaks the grammar",
              think);
        g4_stepper_free(st);
    }
    g4_grammar_state_free(start);
    g4_grammar_free(g);
    printf("ok thought then constrained answer\n");
}

/* Bad wiring is refused by name: a constraint without the vocabulary. */
static void test_refusals(g4_session *s) {
    g4_grammar *g = g4_grammar_json(1);
    g4_grammar_state *st = g4_grammar_start(g);
    g4_generate_params p = {0};
    p.max_tokens = 4;
    g4_sampling_default(&p.sampling);
    p.constraint = st;
    g4_stepper *sp = g4_stepper_new(s, 0);
    int32_t prompt[] = {2, 3};
    CHECK(g4_stepper_add(sp, 0, prompt, 2, &p) != 0 && strstr(g4_last_error(), "constraint_vocab"), "no vocab: %s", g4_last_error());
    g4_stepper_free(sp);
    g4_grammar_state_free(st);
    g4_grammar_free(g);
    printf("ok refusals\n");
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/g4-structured-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
    CHECK(g4_synth_write_tokenizer(path, 512) == 0, "%s", g4_last_error());
    tok = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
    CHECK(tok != NULL, "%s", g4_last_error());
    vocab = g4_grammar_vocab_new(tok);
    g4_model *m = g4_model_load(tiny_dir());
    CHECK(vocab && m, "%s", g4_last_error());
    g4_session *s = new_session(m);
    CHECK(s != NULL, "%s", g4_last_error());
    test_refusals(s);
    test_grammar_greedy(s);
    test_cache(s, tok);
    test_thought(s);
    test_schemas(s);
    g4_session_free(s);
    g4_model_free(m);
    g4_grammar_vocab_free(vocab);
    g4_tokenizer_free(tok);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("structured");
}
