/* The generation stepper on the tiny fixture: sequences with their own settings (greedy, greedy
 * with a penalty, top-k sampling with and without a penalty, sampling from every logit, forced
 * lm_head forms) run together and each gives the tokens and stop reason of a plain reference loop
 * over every logit with the same settings and seed; sequences added mid-run, prompts fed in
 * chunks while the others go on one token a step, a cancelled sequence, every stop reason, and
 * the refusals of g4_stepper_add. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "generate/sampler.h"
#include "overflow_util.h"
#include "testutil.h"
#include "model/feed.h"

enum { MAX_GEN = 64, MAX_PROMPT = 48 };

static const g4_model *model;
static int V;

/* One generation to run: its prompt and settings. */
typedef struct {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    g4_generate_params p;
    int stops[2];
} job;

/* What a generation gave. */
typedef struct {
    int32_t ids[MAX_GEN];
    int n;
    g4_stop_reason stop;
} outcome;

static g4_session *session(int act, int n_seq, int ctx) {
    g4_options o;
    g4_options_default(&o);
    o.act = (g4_act_mode)act;
    o.ctx = ctx;
    o.n_seq = n_seq;
    g4_session *s = g4_session_new(model, &o);
    CHECK(s != NULL, "%s", g4_last_error());
    return s;
}

static int is_stop(const g4_generate_params *p, int32_t t) {
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == t) return 1;
    return 0;
}

/* The reference: one sequence alone, every logit of every step (g4_session_feed), the sampler over
 * them, and the stop checks in g4.h's order (a stop id, the budget, then a full context). */
static outcome reference(int act, int ctx, const job *j) {
    outcome o = {.n = 0, .stop = G4_STOP_BUDGET};
    g4_session *s = session(act, 1, ctx);
    g4_sampler *smp = g4_sampler_new(&j->p.sampling, V);
    if (smp) g4_sampler_set_prompt(smp, j->n_prompt);
    float *logits = malloc(sizeof *logits * (size_t)V);
    int32_t hist[MAX_PROMPT + MAX_GEN];
    memcpy(hist, j->prompt, sizeof *hist * (size_t)j->n_prompt);
    int nh = j->n_prompt;
    CHECK(s && smp && g4_session_feed(s, j->prompt, j->n_prompt, logits, 0) == 0, "%s", g4_last_error());
    while (s && smp && o.n < j->p.max_tokens) {
        int32_t t = g4_sampler_sample(smp, logits, hist, nh);
        hist[nh++] = t;
        o.ids[o.n++] = t;
        if (is_stop(&j->p, t)) {
            o.stop = G4_STOP_EOS;
            break;
        }
        if (o.n == j->p.max_tokens) break;
        if (g4_session_pos(s) >= ctx) {
            o.stop = G4_STOP_CONTEXT;
            break;
        }
        CHECK(g4_session_feed(s, &t, 1, logits, 0) == 0, "%s", g4_last_error());
    }
    free(logits);
    g4_sampler_free(smp);
    g4_session_free(s);
    return o;
}

static int same_outcome(const outcome *a, const outcome *b) {
    return a->n == b->n && a->stop == b->stop && memcmp(a->ids, b->ids, sizeof *a->ids * (size_t)a->n) == 0;
}

/* The stepper's view of sequence q: its tokens and stop reason. */
static outcome stepped(const g4_stepper *st, int q) {
    outcome o = {.n = 0};
    int n;
    const int32_t *ids = g4_stepper_tokens(st, q, &n);
    g4_generate_result r;
    CHECK(g4_stepper_result(st, q, &r) == 0 && ids && n == r.n_generated && n <= MAX_GEN, "%s", g4_last_error());
    o.n = n < MAX_GEN ? n : MAX_GEN;
    if (ids) memcpy(o.ids, ids, sizeof *ids * (size_t)o.n);
    o.stop = r.stop;
    return o;
}

/* Eight settings: greedy (the greedy token), greedy with a penalty (candidates), top-k sampling
 * with and without a penalty, sampling from every logit, and greedy and sampling through forced
 * lm_head forms. */
static void make_jobs(job *jobs, int n_jobs) {
    static const g4_sampling modes[] = {
        {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64},
        {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .min_p = 0.02f, .repeat_penalty = 1.3f, .repeat_last_n = 16, .seed = 7},
        {.temperature = 1.0f, .top_k = 64, .top_p = 0.95f, .repeat_penalty = 1, .repeat_last_n = 64, .seed = 3},
        {.temperature = 0, .top_p = 1, .repeat_penalty = 1.5f, .repeat_last_n = 0},
        {.temperature = 1.0f, .top_k = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64, .seed = 11},
        {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64},
        {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64},
        {.temperature = 0.7f, .top_k = 5, .top_p = 1, .repeat_penalty = 1.1f, .repeat_last_n = 8, .seed = 5},
    };
    static const g4_output forced[] = {G4_OUTPUT_NONE, G4_OUTPUT_NONE, G4_OUTPUT_NONE, G4_OUTPUT_NONE,
                                       G4_OUTPUT_NONE, G4_OUTPUT_LOGITS, G4_OUTPUT_TOP, G4_OUTPUT_LOGITS};
    static const int lens[] = {20, 9, 33, 5, 12, 1, 26, 40}, budgets[] = {30, 25, 40, 20, 18, 22, 16, 24};
    uint32_t r = 4242;
    for (int i = 0; i < n_jobs; i++) {
        job *j = &jobs[i];
        int k = i % 8;
        j->n_prompt = lens[k];
        for (int t = 0; t < j->n_prompt; t++) j->prompt[t] = (int32_t)((r = r * 1103515245u + 12345u) >> 9) % V;
        j->stops[0] = -1;
        j->p = (g4_generate_params){.max_tokens = budgets[k], .sampling = modes[k], .stop_ids = j->stops, .n_stop_ids = 1,
                                    .output = forced[k], .output_k = 64};
        j->p.sampling.seed += (uint64_t)(i / 8) * 100;
    }
}

/* Steps until nothing is active; every step gives a sequence at most one token, and a generating
 * sequence exactly one. Returns the number of steps. */
static int run_out(g4_stepper *st, int n_seq) {
    g4_step_token ev[16];
    int steps = 0, bad = 0;
    while (g4_stepper_active(st) > 0 && steps < 1000) {
        int generating[16] = {0}, got[16] = {0};
        for (int q = 0; q < n_seq; q++) generating[q] = g4_stepper_state(st, q) == G4_SEQ_GENERATING;
        int n = g4_stepper_step(st, ev);
        CHECK(n >= 0, "%s", g4_last_error());
        if (n < 0) break;
        for (int k = 0; k < n; k++) got[ev[k].seq]++;
        for (int q = 0; q < n_seq; q++) bad += got[q] > 1 || (generating[q] && got[q] != 1);
        steps++;
    }
    CHECK(bad == 0, "%d sequence steps did not give exactly one token", bad);
    return steps;
}

/* Eight sequences with eight settings, all started at once, each against its reference alone. */
static void check_together(int act) {
    enum { N = 8, CTX = 96 };
    job jobs[N];
    make_jobs(jobs, N);
    g4_session *s = session(act, N, CTX);
    g4_stepper *st = s ? g4_stepper_new(s, 0) : NULL;
    CHECK(st != NULL, "%s", g4_last_error());
    if (!st) return;
    for (int q = 0; q < N; q++) CHECK(g4_stepper_add(st, q, jobs[q].prompt, jobs[q].n_prompt, &jobs[q].p) == 0, "%s", g4_last_error());
    run_out(st, N);
    int differ = 0, prompt_tokens = 0, generated = 0;
    for (int q = 0; q < N; q++) {
        outcome want = reference(act, CTX, &jobs[q]), got = stepped(st, q);
        differ += !same_outcome(&want, &got);
        CHECK(same_outcome(&want, &got), "act %d: sequence %d (setting %d): %d tokens, stop %d; alone %d, stop %d", act, q, q, got.n, got.stop,
              want.n, want.stop);
        CHECK_EQ_INT(g4_session_seq_pos(s, q), jobs[q].n_prompt + got.n - 1);
        prompt_tokens += jobs[q].n_prompt;
        generated += got.n;
    }
    g4_stepper_stats stats;
    g4_stepper_get_stats(st, &stats);
    CHECK(stats.prompt_tokens == prompt_tokens && stats.generated == generated && stats.prefill_s > 0 && stats.decode_s > 0,
          "stats: %ld prompt tokens (want %d), %ld generated (want %d)", stats.prompt_tokens, prompt_tokens, stats.generated, generated);
    printf("ok act %d: %d sequences with their own sampling, run together, give their tokens alone\n", act, N);
    g4_stepper_free(st);
    g4_session_free(s);
}

/* Continuous batching: prompts fed 7 tokens a step while the others go on one token a step;
 * sequences started mid-run, one in a sequence a finished generation leaves (reset first), one
 * while another's prompt is still going in; each gives its tokens alone. */
static void check_continuous(void) {
    enum { N_SEQ = 4, CTX = 96, N_JOBS = 9, CHUNK = 7 };
    job jobs[N_JOBS];
    make_jobs(jobs, N_JOBS);
    g4_session *s = session(G4_ACT_INT, N_SEQ, CTX);
    g4_stepper *st = s ? g4_stepper_new(s, CHUNK) : NULL;
    CHECK(st != NULL, "%s", g4_last_error());
    if (!st) return;
    int job_of[N_SEQ] = {-1, -1, -1, -1}, next = 0, steps = 0, prompt_steps_beside = 0, checked = 0;
    outcome got[N_JOBS];
    g4_step_token ev[N_SEQ];
    while ((g4_stepper_active(st) > 0 || next < N_JOBS) && steps < 2000) {
        /* two at the start, a third after 5 steps, a fourth after 9, the rest as sequences come free */
        for (int q = 0; q < N_SEQ && next < N_JOBS; q++) {
            if (job_of[q] >= 0 || (q == 2 && steps < 5) || (q == 3 && steps < 9)) continue;
            g4_session_reset_seq(s, q);
            CHECK(g4_stepper_add(st, q, jobs[next].prompt, jobs[next].n_prompt, &jobs[next].p) == 0, "%s", g4_last_error());
            job_of[q] = next++;
        }
        int prompting = 0, generating = 0;
        for (int q = 0; q < N_SEQ; q++) {
            prompting += g4_stepper_state(st, q) == G4_SEQ_PROMPT;
            generating += g4_stepper_state(st, q) == G4_SEQ_GENERATING;
        }
        int n = g4_stepper_step(st, ev);
        CHECK(n >= 0, "%s", g4_last_error());
        if (n < 0) break;
        steps++;
        prompt_steps_beside += prompting > 0 && generating > 0 && n >= generating;
        for (int k = 0; k < n; k++) {
            int q = ev[k].seq;
            if (!ev[k].finished) continue;
            got[job_of[q]] = stepped(st, q);
            job_of[q] = -1;
            checked++;
        }
    }
    CHECK_EQ_INT(checked, N_JOBS);
    int differ = 0;
    for (int j = 0; j < N_JOBS && checked == N_JOBS; j++) {
        outcome want = reference(G4_ACT_INT, CTX, &jobs[j]);
        differ += !same_outcome(&want, &got[j]);
    }
    CHECK(differ == 0, "continuous batching: %d of %d generations differ from alone", differ, N_JOBS);
    CHECK(prompt_steps_beside >= 10, "only %d steps fed a prompt beside generating sequences", prompt_steps_beside);
    printf("ok continuous batching: %d generations started as sequences came free, prompts fed %d tokens a step (%d steps beside "
           "others), each as alone\n",
           N_JOBS, CHUNK, prompt_steps_beside);
    g4_stepper_free(st);
    g4_session_free(s);
}

/* Cancelling one sequence (generating, or still feeding its prompt) stops it there, with
 * G4_STOP_USER, and changes nothing for the others; its sequence takes a new generation. */
static void check_cancel(void) {
    enum { N_SEQ = 4, CTX = 96 };
    job jobs[5];
    make_jobs(jobs, 5);
    g4_session *s = session(G4_ACT_INT, N_SEQ, CTX);
    g4_stepper *st = s ? g4_stepper_new(s, 4) : NULL;
    CHECK(st != NULL, "%s", g4_last_error());
    if (!st) return;
    for (int q = 0; q < 3; q++) CHECK(g4_stepper_add(st, q, jobs[q].prompt, jobs[q].n_prompt, &jobs[q].p) == 0, "%s", g4_last_error());
    g4_step_token ev[N_SEQ];
    /* until sequence 1 generates and sequence 2's prompt is going in (4 prompt tokens a step) */
    for (int i = 0; i < 100 && !(g4_stepper_state(st, 1) == G4_SEQ_GENERATING && g4_session_seq_pos(s, 2) > 0); i++)
        CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
    CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
    CHECK(g4_stepper_state(st, 1) == G4_SEQ_GENERATING && g4_stepper_state(st, 2) == G4_SEQ_PROMPT, "states %d %d",
          g4_stepper_state(st, 1), g4_stepper_state(st, 2));
    int before = g4_session_seq_pos(s, 2);
    CHECK(g4_stepper_cancel(st, 1) == 1 && g4_stepper_cancel(st, 2) == 1, "cancel of active sequences");
    CHECK(g4_stepper_cancel(st, 1) == 0 && g4_stepper_cancel(st, 3) == 0 && g4_stepper_cancel(st, 9) == -1, "cancel of others");
    outcome c1 = stepped(st, 1), c2 = stepped(st, 2), r1 = reference(G4_ACT_INT, CTX, &jobs[1]);
    CHECK(c1.stop == G4_STOP_USER && c1.n > 0 && c1.n < r1.n && memcmp(c1.ids, r1.ids, sizeof *c1.ids * (size_t)c1.n) == 0,
          "cancelled while generating: %d tokens, stop %d", c1.n, c1.stop);
    CHECK(c2.stop == G4_STOP_USER && c2.n == 0 && g4_stepper_state(st, 2) == G4_SEQ_FINISHED, "cancelled in its prompt: %d tokens", c2.n);
    CHECK(before > 0 && before < jobs[2].n_prompt && g4_session_seq_pos(s, 2) == before, "the cancelled prompt's cache: %d of %d",
          g4_session_seq_pos(s, 2), jobs[2].n_prompt);
    /* sequence 1 again, afresh, beside sequence 0, which goes on */
    g4_session_reset_seq(s, 1);
    CHECK(g4_stepper_add(st, 1, jobs[4].prompt, jobs[4].n_prompt, &jobs[4].p) == 0, "%s", g4_last_error());
    run_out(st, N_SEQ);
    outcome a0 = stepped(st, 0), a1 = stepped(st, 1), r0 = reference(G4_ACT_INT, CTX, &jobs[0]), r4 = reference(G4_ACT_INT, CTX, &jobs[4]);
    CHECK(same_outcome(&a0, &r0) && same_outcome(&a1, &r4), "beside a cancelled sequence, or after it: other tokens");
    printf("ok cancel: a generating sequence stops after %d of %d tokens, one in its prompt after %d of %d prompt tokens\n", c1.n, r1.n,
           before, jobs[2].n_prompt);
    g4_stepper_free(st);
    g4_session_free(s);
}

/* One generation alone in a stepper. */
static outcome run_alone(int ctx, const job *j, int *pos) {
    g4_session *s = session(G4_ACT_INT, 1, ctx);
    g4_stepper *st = s ? g4_stepper_new(s, 0) : NULL;
    outcome o = {.n = -1};
    CHECK(st && g4_stepper_add(st, 0, j->prompt, j->n_prompt, &j->p) == 0, "%s", g4_last_error());
    if (st && g4_stepper_active(st)) {
        run_out(st, 1);
        o = stepped(st, 0);
        *pos = g4_session_seq_pos(s, 0);
    }
    g4_stepper_free(st);
    g4_session_free(s);
    return o;
}

/* Each stop reason where the reference loop has it: a stop id (reported, and ahead of the budget
 * on the budget's last token), the budget, the context (ahead of the budget), a budget of 0. */
static void check_stops(void) {
    job jobs[1];
    make_jobs(jobs, 1);
    job j = jobs[0];
    j.p.stop_ids = j.stops;
    outcome free_run = reference(G4_ACT_INT, 96, &j);
    int at = 3; /* the first token from the fourth on that did not come before */
    for (; at < free_run.n; at++) {
        int seen = 0;
        for (int i = 0; i < at; i++) seen |= free_run.ids[i] == free_run.ids[at];
        if (!seen) break;
    }
    CHECK(at < free_run.n, "no new token to stop at");
    int pos = 0;
    j.stops[0] = free_run.ids[at];
    outcome eos = run_alone(96, &j, &pos), want = reference(G4_ACT_INT, 96, &j);
    CHECK(eos.stop == G4_STOP_EOS && eos.n == at + 1 && same_outcome(&eos, &want), "stop id: %d tokens, stop %d", eos.n, eos.stop);
    CHECK_EQ_INT(pos, j.n_prompt + at);
    j.p.max_tokens = at + 1; /* the stop id is the budget's last token */
    eos = run_alone(96, &j, &pos);
    CHECK(eos.stop == G4_STOP_EOS && eos.n == at + 1, "stop id on the budget's last token: stop %d", eos.stop);
    j.stops[0] = -1;
    j.p.max_tokens = 7;
    outcome budget = run_alone(96, &j, &pos);
    CHECK(budget.stop == G4_STOP_BUDGET && budget.n == 7 && memcmp(budget.ids, free_run.ids, 7 * sizeof *budget.ids) == 0,
          "budget: %d tokens, stop %d", budget.n, budget.stop);
    /* room for 10 tokens after the prompt: the 11th is generated, and cannot be fed */
    j.p.max_tokens = 30;
    int ctx = j.n_prompt + 10;
    outcome full = run_alone(ctx, &j, &pos);
    want = reference(G4_ACT_INT, ctx, &j);
    CHECK(full.stop == G4_STOP_CONTEXT && full.n == 11 && same_outcome(&full, &want), "context: %d tokens, stop %d", full.n, full.stop);
    CHECK_EQ_INT(pos, ctx);
    j.p.max_tokens = 11; /* the budget ends on the same token: the budget is checked first */
    full = run_alone(ctx, &j, &pos);
    CHECK(full.stop == G4_STOP_BUDGET && full.n == 11, "budget and context at once: stop %d", full.stop);
    /* a budget of 0: the prompt goes in, no token comes out */
    g4_session *s = session(G4_ACT_INT, 1, 96);
    g4_stepper *st = g4_stepper_new(s, 0);
    j.p.max_tokens = 0;
    g4_step_token ev[1];
    CHECK(g4_stepper_add(st, 0, j.prompt, j.n_prompt, &j.p) == 0, "%s", g4_last_error());
    CHECK(g4_stepper_step(st, ev) == 1 && ev[0].token == -1 && ev[0].finished && ev[0].stop == G4_STOP_BUDGET, "budget 0");
    CHECK(g4_session_seq_pos(s, 0) == j.n_prompt && g4_stepper_active(st) == 0, "budget 0: position %d", g4_session_seq_pos(s, 0));
    g4_stepper_free(st);
    g4_session_free(s);
    printf("ok stop reasons: eos, budget, context and a budget of 0 where the reference has them\n");
}

/* g4_stepper_add refuses, feeding nothing: no such sequence, a busy one, an empty prompt, one past
 * the context, a token outside the vocabulary, invalid sampling, the greedy token for sampling. */
static void check_refusals(void) {
    job jobs[2];
    make_jobs(jobs, 2);
    g4_session *s = session(G4_ACT_INT, 2, 32);
    g4_stepper *st = g4_stepper_new(s, 0);
    CHECK(g4_stepper_add(st, 0, jobs[0].prompt, jobs[0].n_prompt, &jobs[0].p) == 0, "%s", g4_last_error());
    job bad = jobs[1];
    bad.prompt[2] = V;
    g4_generate_params invalid = jobs[1].p, greedy_only = jobs[1].p;
    invalid.sampling.top_p = 0;
    greedy_only.output = G4_OUTPUT_ARGMAX;
    int32_t long_prompt[40] = {0};
    struct {
        int seq, n;
        const int32_t *prompt;
        const g4_generate_params *p;
        const char *msg;
    } cases[] = {
        {2, 5, jobs[1].prompt, &jobs[1].p, "sequence 2 does not exist"},
        {0, 5, jobs[1].prompt, &jobs[1].p, "still generating"},
        {1, 0, jobs[1].prompt, &jobs[1].p, "empty prompt"},
        {1, 40, long_prompt, &jobs[1].p, "prompt of 40 tokens does not fit the context: 32 of 32 tokens left"},
        {1, 5, bad.prompt, &jobs[1].p, "outside the vocabulary"},
        {1, 5, jobs[1].prompt, &invalid, "top-p 0: expected a number in (0, 1]"},
        {1, 5, jobs[1].prompt, &greedy_only, "greedy token alone"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        CHECK(g4_stepper_add(st, cases[c].seq, cases[c].prompt, cases[c].n, cases[c].p) != 0 && strstr(g4_last_error(), cases[c].msg),
              "case %zu: %s", c, g4_last_error());
        CHECK(g4_stepper_state(st, 1) == G4_SEQ_IDLE && g4_session_seq_pos(s, 1) == 0, "case %zu started something", c);
    }
    g4_generate_result r;
    CHECK(g4_stepper_result(st, 1, &r) != 0 && g4_stepper_tokens(st, 1, &r.n_generated) == NULL, "a result for an idle sequence");
    g4_stepper_free(st);
    g4_session_free(s);
}

/* g4_session_truncate_seq: a sequence that fed prompt A then generated, cut back to A's first k
 * tokens and given C, generates what A[0, k) + C gives from scratch (greedy and sampled, no
 * penalty: the stepper's repetition window sees only the prompt it is given). Cutting past what
 * the sequence holds, or a sequence the session lacks, is refused. */
static void check_truncate(void) {
    job jobs[3];
    make_jobs(jobs, 3);
    g4_session *s = session(G4_ACT_INT, 2, 128);
    g4_stepper *st = g4_stepper_new(s, 0);
    for (int k = 0; k < 3; k += 2) { /* job 0 greedy, job 2 top-k sampling */
        const job *a = &jobs[k];
        int keep = a->n_prompt / 2;
        g4_session_reset_seq(s, 1);
        CHECK(g4_stepper_add(st, 1, a->prompt, a->n_prompt, &a->p) == 0, "%s", g4_last_error());
        run_out(st, 2);
        int held = g4_session_seq_pos(s, 1);
        CHECK(held > a->n_prompt, "the first generation holds %d tokens", held);
        CHECK(g4_session_truncate_seq(s, 1, held + 1) != 0 && g4_session_seq_pos(s, 1) == held, "cutting past the end was accepted");
        CHECK(g4_session_truncate_seq(s, 1, keep) == 0 && g4_session_seq_pos(s, 1) == keep, "%s", g4_last_error());
        job c = jobs[1];
        c.p = a->p;
        outcome got = {0}, want;
        CHECK(g4_stepper_add(st, 1, c.prompt, c.n_prompt, &c.p) == 0, "%s", g4_last_error());
        run_out(st, 2);
        got = stepped(st, 1);
        job whole = c;
        memcpy(whole.prompt, a->prompt, sizeof *whole.prompt * (size_t)keep);
        memcpy(whole.prompt + keep, c.prompt, sizeof *whole.prompt * (size_t)c.n_prompt);
        whole.n_prompt = keep + c.n_prompt;
        want = reference(G4_ACT_INT, 128, &whole);
        CHECK(same_outcome(&got, &want), "job %d: after truncating to %d tokens: %d tokens, stop %d; from scratch %d, stop %d", k, keep, got.n,
              got.stop, want.n, want.stop);
    }
    CHECK(g4_session_truncate_seq(s, 2, 0) != 0 && g4_session_truncate_seq(s, 0, -1) != 0, "a bad sequence or length was accepted");
    g4_stepper_free(st);
    g4_session_free(s);
    printf("ok a sequence cut back to a prefix continues as that prefix would\n");
}

static int cancel_on_poll(void *user) {
    int *polls = user;
    return ++*polls >= 3;
}

/* g4_generate_params.cancel is asked before each step: a stop it asks for during a long prompt
 * ends the generation between two chunks (Ctrl-C waited for the whole prefill, issue 33), with
 * G4_STOP_USER, no token and the two chunks fed before it in the cache. */
static void check_cancel_callback(void) {
    g4_session *s = session(G4_ACT_INT, 1, 512);
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = 10 + i % 100;
    g4_generate_params p = {0};
    g4_sampling_default(&p.sampling);
    p.max_tokens = 4;
    int polls = 0;
    p.cancel = cancel_on_poll, p.cancel_user = &polls;
    g4_generate_result r;
    CHECK(g4_generate(s, prompt, 300, &p, NULL, NULL, &r) == 0, "%s", g4_last_error());
    CHECK(polls == 3 && r.stop == G4_STOP_USER && r.n_generated == 0 && g4_session_seq_pos(s, 0) == 2 * 64,
          "cancelled on the 3rd poll: %d polls, stop %d, %d tokens, %d of 300 prompt tokens fed", polls, (int)r.stop, r.n_generated,
          g4_session_seq_pos(s, 0));
    g4_session_free(s);
    printf("ok a cancel asked for during a 300-token prompt stops it after 2 chunks of 64\n");
}

/* A model whose output is NaN (overflow_util.h): every form of pick (the greedy token, top-k candidates, every
 * logit, greedy with a penalty) ends its sequence at once with G4_STOP_ERROR and no token, a
 * message for that sequence, and nothing read or written out of bounds; g4_generate fails with
 * the message. */
static void check_non_finite(void) {
    char dir[] = "/tmp/g4_test_stepper_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(write_overflowing_copy(tiny_dir(), dir) == 0, "the fixture's " OVERFLOW_TENSOR " is missing");
    g4_model *m = g4_model_load(dir);
    CHECK(m != NULL, "the overflowing checkpoint does not load: %s", g4_last_error());
    if (!m) {
        remove_overflowing_copy(dir);
        return;
    }
    const g4_model *keep = model;
    model = m;
    g4_session *s = session(G4_ACT_INT, 4, 64);
    g4_stepper *st = g4_stepper_new(s, 0);
    int32_t prompt[5] = {2, 10, 11, 12, 13};
    g4_generate_params p[4];
    for (int q = 0; q < 4; q++) {
        memset(&p[q], 0, sizeof p[q]);
        g4_sampling_default(&p[q].sampling);
        p[q].max_tokens = 8;
        p[q].sampling.seed = 7;
    }
    p[1].sampling.temperature = 1, p[1].sampling.top_k = 5;    /* G4_OUTPUT_TOP */
    p[2].sampling.temperature = 1;                            /* every logit */
    p[3].sampling.repeat_penalty = 1.3f;                      /* greedy over every logit */
    for (int q = 0; q < 4; q++) CHECK(g4_stepper_add(st, q, prompt, 5, &p[q]) == 0, "%s", g4_last_error());
    g4_step_token out[4 * (G4_MAX_DRAFT_TOKENS + 1)];
    int errors[4] = {0}, tokens = 0, steps = 0;
    while (g4_stepper_active(st) > 0 && steps++ < 20) {
        int n = g4_stepper_step(st, out);
        CHECK(n >= 0, "%s", g4_last_error());
        for (int i = 0; i < n; i++) {
            tokens += out[i].token >= 0;
            errors[out[i].seq] += out[i].finished && out[i].stop == G4_STOP_ERROR && out[i].token == -1;
        }
        if (n < 0) break;
    }
    CHECK(tokens == 0, "%d tokens from NaN logits", tokens);
    for (int q = 0; q < 4; q++) {
        g4_generate_result r;
        const char *e = g4_stepper_error(st, q);
        CHECK(errors[q] == 1 && g4_stepper_result(st, q, &r) == 0 && r.stop == G4_STOP_ERROR && r.n_generated == 0,
              "sequence %d: %d error events, stop %d", q, errors[q], (int)r.stop);
        CHECK(e && strstr(e, "the model's hidden state turned non-finite (NaN or infinite) at generated token 1"), "sequence %d: %s", q,
              e ? e : "(none)");
    }
    CHECK_STREQ(g4_stop_reason_name(G4_STOP_ERROR), "error");
    g4_stepper_free(st);
    g4_session_free(s);
    s = session(G4_ACT_INT, 1, 64);
    g4_generate_result r;
    for (int q = 0; q < 3; q++) {
        CHECK(g4_generate(s, prompt, 5, &p[q], NULL, NULL, &r) != 0 && strstr(g4_last_error(), "non-finite") && r.stop == G4_STOP_ERROR,
              "g4_generate (form %d) on NaN logits: stop %d, %s", q, (int)r.stop, g4_last_error());
        g4_session_reset(s);
    }
    g4_session_free(s);
    g4_model_free(m);
    model = keep;
    remove_overflowing_copy(dir);
    printf("ok non-finite logits: greedy, top-k, every-logit and penalised picks end with G4_STOP_ERROR and a message\n");
}

/* OpenAI's n: three generations forked from one prompt (computed once: the prompt tokens fed are
 * one prompt's and two last tokens) with their own seeds, penalties and bias, each against its
 * reference alone; and greedy n = 2 gives the same tokens twice. */
static void check_fork(int act) {
    enum { N = 4, CTX = 96 };
    job jobs[N];
    make_jobs(jobs, N);
    const int32_t bias_ids[2] = {5, 9};
    const float bias_values[2] = {3.5f, -100};
    for (int q = 0; q < N; q++) {
        memcpy(jobs[q].prompt, jobs[2].prompt, sizeof jobs[q].prompt);
        jobs[q].n_prompt = jobs[2].n_prompt;
        jobs[q].p.sampling = (g4_sampling){.temperature = q == 3 ? 0 : 0.9f, .top_k = 40, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64,
                                           .seed = 100 + (uint64_t)q, .frequency_penalty = 0.5f * (float)q, .presence_penalty = q == 1 ? 1.0f : 0,
                                           .bias_ids = bias_ids, .bias_values = bias_values, .n_bias = q == 2 ? 2 : 0};
    }
    g4_session *s = session(act, N, CTX);
    g4_stepper *st = s ? g4_stepper_new(s, 0) : NULL;
    CHECK(st != NULL, "%s", g4_last_error());
    if (!st) return;
    CHECK(g4_stepper_add(st, 0, jobs[0].prompt, jobs[0].n_prompt, &jobs[0].p) == 0, "%s", g4_last_error());
    for (int q = 1; q < N; q++) CHECK(g4_stepper_add_fork(st, q, 0, &jobs[q].p) == 0, "fork %d: %s", q, g4_last_error());
    CHECK(g4_stepper_add_fork(st, 0, 1, &jobs[0].p) != 0, "a fork of a fork, into a busy sequence, was accepted");
    run_out(st, N);
    for (int q = 0; q < N; q++) {
        outcome want = reference(act, CTX, &jobs[q]), got = stepped(st, q);
        CHECK(same_outcome(&want, &got), "act %d: fork %d: %d tokens, stop %d; alone %d, stop %d", act, q, got.n, got.stop, want.n, want.stop);
    }
    g4_stepper_stats stats;
    g4_stepper_get_stats(st, &stats);
    CHECK(stats.prompt_tokens == jobs[0].n_prompt + N - 1, "the forks fed %ld prompt tokens; one prompt and %d last tokens are %d",
          stats.prompt_tokens, N - 1, jobs[0].n_prompt + N - 1);
    int held = g4_session_seq_pos(s, 0);
    CHECK(g4_session_copy_seq(s, 0, 0, 1) != 0 && g4_session_copy_seq(s, 0, 1, held + 1) != 0 && g4_session_copy_seq(s, 0, N, 1) != 0 &&
              g4_session_seq_pos(s, 1) != held + 1,
          "a copy onto itself, of more than the sequence holds or to no sequence was accepted");
    g4_stepper_free(st);
    g4_session_free(s);
    printf("ok act %d: %d generations forked from one prompt give their tokens alone\n", act, N);
}

/* A fork's source that ends at its first token (a budget of 1) and whose sequence is then given
 * to another generation at once, as g4 serve reuses a finished slot: the forks copied its prompt
 * in the step that fed it, and give their tokens alone. */
static void check_fork_source_reused(void) {
    enum { N = 3, CTX = 96 };
    job jobs[N + 1];
    make_jobs(jobs, N + 1);
    for (int q = 0; q < N; q++) memcpy(jobs[q].prompt, jobs[2].prompt, sizeof jobs[q].prompt), jobs[q].n_prompt = jobs[2].n_prompt;
    jobs[0].p.max_tokens = 1;
    g4_session *s = session(G4_ACT_INT, N, CTX);
    g4_stepper *st = s ? g4_stepper_new(s, 0) : NULL;
    CHECK(st != NULL, "%s", g4_last_error());
    if (!st) return;
    CHECK(g4_stepper_add(st, 0, jobs[0].prompt, jobs[0].n_prompt, &jobs[0].p) == 0, "%s", g4_last_error());
    for (int q = 1; q < N; q++) CHECK(g4_stepper_add_fork(st, q, 0, &jobs[q].p) == 0, "fork %d: %s", q, g4_last_error());
    g4_step_token ev[64];
    for (int steps = 0; g4_stepper_state(st, 0) != G4_SEQ_FINISHED && steps < 100; steps++)
        CHECK(g4_stepper_step(st, ev) >= 0, "%s", g4_last_error());
    g4_session_reset_seq(s, 0);
    CHECK(g4_stepper_add(st, 0, jobs[N].prompt, jobs[N].n_prompt, &jobs[N].p) == 0, "%s", g4_last_error());
    run_out(st, N);
    for (int q = 1; q < N; q++) {
        outcome want = reference(G4_ACT_INT, CTX, &jobs[q]), got = stepped(st, q);
        CHECK(same_outcome(&want, &got), "fork %d of a source whose sequence was reused: %d tokens, stop %d; alone %d, stop %d", q, got.n,
              got.stop, want.n, want.stop);
    }
    g4_stepper_free(st);
    g4_session_free(s);
    printf("ok forks copy their source's prompt in the step that fed it: a source reused at once leaves them whole\n");
}

/* Log-probabilities: each step's chosen token and top 5 against the log-softmax, in double, of
 * every logit of the reference loop (g4_session_feed), for a greedy and a sampled generation. */
static void check_logprobs(void) {
    enum { CTX = 96, TOP = 5 };
    job jobs[3];
    make_jobs(jobs, 3);
    for (int k = 0; k < 3; k += 2) {
        job *j = &jobs[k];
        j->p.logprobs = 1;
        j->p.top_logprobs = TOP;
        outcome want = reference(G4_ACT_INT, CTX, j);
        g4_session *s = session(G4_ACT_INT, 1, CTX), *r = session(G4_ACT_INT, 1, CTX);
        g4_stepper *st = s ? g4_stepper_new(s, 0) : NULL;
        float *logits = malloc(sizeof *logits * (size_t)V);
        CHECK(st && r && logits && g4_stepper_add(st, 0, j->prompt, j->n_prompt, &j->p) == 0, "%s", g4_last_error());
        CHECK(g4_session_feed(r, j->prompt, j->n_prompt, logits, 0) == 0, "%s", g4_last_error());
        g4_step_token ev[4];
        int n_tok = 0, bad = 0;
        while (st && g4_stepper_active(st) > 0 && n_tok < MAX_GEN) {
            int n = g4_stepper_step(st, ev);
            if (n <= 0) continue;
            g4_logprobs lp;
            CHECK(g4_stepper_logprobs(st, 0, &lp) == 0 && lp.n_top == TOP, "no log-probabilities after a step");
            double max = logits[0], z = 0;
            for (int v = 1; v < V; v++) max = logits[v] > max ? logits[v] : max;
            for (int v = 0; v < V; v++) z += exp(logits[v] - max);
            double lse = max + log(z);
            bad += lp.chosen.token != ev[0].token || fabs(lp.chosen.logprob - (logits[ev[0].token] - lse)) > 1e-5;
            for (int i = 0; i < TOP; i++) {
                int32_t t = lp.top[i].token;
                int above = 0; /* tokens ranked before t: exactly i of them */
                for (int v = 0; v < V; v++) above += logits[v] > logits[t] || (logits[v] == logits[t] && v < t);
                bad += above != i || fabs(lp.top[i].logprob - (logits[t] - lse)) > 1e-5;
            }
            n_tok++;
            if (!ev[0].finished) CHECK(g4_session_feed(r, &ev[0].token, 1, logits, 0) == 0, "%s", g4_last_error());
        }
        outcome got = st ? stepped(st, 0) : (outcome){0};
        CHECK(same_outcome(&want, &got), "job %d with log-probabilities: other tokens than without", k);
        CHECK(bad == 0 && n_tok == want.n, "job %d: %d of %d steps' log-probabilities differ from the log-softmax", k, bad, n_tok);
        g4_stepper_free(st);
        g4_session_free(s);
        g4_session_free(r);
        free(logits);
    }
    printf("ok log-probabilities are the log-softmax of the step's logits\n");
}

int main(void) {
    g4_model *m = g4_model_load(tiny_dir());
    CHECK(m != NULL, "%s", g4_last_error());
    if (!m) return check_report("stepper");
    model = m;
    V = g4_model_vocab_size(m);
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) check_together(act);
    check_continuous();
    check_cancel();
    check_stops();
    check_refusals();
    check_truncate();
    check_non_finite();
    check_cancel_callback();
    for (int act = G4_ACT_FLOAT; act <= G4_ACT_INT; act++) check_fork(act);
    check_fork_source_reused();
    check_logprobs();
    g4_model_free(m);
    return check_report("stepper");
}
