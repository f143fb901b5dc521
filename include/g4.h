/* g4: an inference engine for Gemma 4 QAT checkpoints with static int8 activations.
 *
 * Load a checkpoint folder (config.json + model.safetensors in the Hugging Face
 * "gemma-4-*-qat-mobile-transformers" format), open a session (run state + KV cache), feed
 * token ids, read logits. Every function that can fail returns NULL or a negative value and
 * leaves a one-line message in g4_last_error(). */
#ifndef G4_H
#define G4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define G4_VERSION "0.1.0"

typedef struct g4_model g4_model;
typedef struct g4_session g4_session;

/* How activations are treated at the linear boundaries (spec: activation-quant.md). */
typedef enum {
    G4_ACT_FLOAT = 0, /* activation scales ignored: the defective fp baseline */
    G4_ACT_FAKE = 1,  /* s * clamp(round(x / s), -128, 127) in float at every enabled point */
    G4_ACT_INT = 2,   /* true int8 x intN -> int32 -> requantized linears */
} g4_act_mode;

/* Rounding of every activation quantizer in a run: ties to even (torch.round, XNNPACK, NEON)
 * or away from zero (TFLite reference kernels). */
typedef enum { G4_ROUND_EVEN = 0, G4_ROUND_AWAY = 1 } g4_round;
/* x / s as one f32 division (HF), or x * (1/s) with 1/s rounded to f32 (XNNPACK, NEON). */
typedef enum { G4_QDIV_DEFAULT = -1, G4_QDIV_RECIPROCAL = 0, G4_QDIV_DIVIDE = 1 } g4_qdiv;
/* Requantization of an int32 accumulator in `int` mode (int8-arithmetic.md §3). */
typedef enum {
    G4_REQ_F32 = 0,         /* XNNPACK: (s_x*s_w)/s_y in f32, acc*M in f32, ties to even (default) */
    G4_REQ_F64 = 1,         /* ((acc*s_x)*s_w)/s_y in double, ties to even */
    G4_REQ_TFL_DOUBLE = 2,  /* TFLite reference: Q31 multiplier, gemmlowp double rounding */
    G4_REQ_TFL_SINGLE = 3,  /* TFLITE_SINGLE_ROUNDING / ruy */
    G4_REQ_TFL_NEON = 4,    /* TFLite's optimized kernels (LiteRT "builtin" CPU path) */
    G4_REQ_TFL_REF = 5,     /* TFLite's reference kernels: round(acc * double multiplier), ties away */
} g4_requant_rule;

typedef struct {
    g4_act_mode act;
    int linear_quant;  /* points A1-A4, A7-A17 */
    int kv_quant;      /* points A5-A6: int8 K/V storage with k/v_cache_scale */
    int pmp_quant;     /* points G1-G2: per_layer_model_projection input/output */
    int pmp_out_raw;   /* G2 placement: 0 = after x H^-1/2 ("scaled"), 1 = before ("raw") */
    float pmp_s_in, pmp_s_out;
    g4_round round;
    g4_qdiv qdiv;      /* G4_QDIV_DEFAULT: divide in fake mode, reciprocal in int mode */
    g4_requant_rule requant;
    int lmhead_dynamic_q8; /* lm_head input quantized per token at run time, as XNNPACK's qd8 path */
    int ctx;           /* KV-cache length in tokens (per sequence) */
    int n_seq;         /* independent sequences (each with its own KV cache) for batched decoding; 0 = 1 */
} g4_options;

/* Defaults of the spec's "litert" profile in `int` mode, context 4096. */
void g4_options_default(g4_options *o);

const char *g4_last_error(void);

g4_model *g4_model_load(const char *dir);
/* g4_model_load copies the weights every token streams into memory backed by transparent huge
 * pages where the system has them (faster decode, slower load, same resident memory);
 * g4_model_load_mapped leaves them in the read-only file mapping (pages shared with other
 * processes reading the same file). g4_model_weights_resident says which one a model got. */
g4_model *g4_model_load_mapped(const char *dir);
int g4_model_weights_resident(const g4_model *m);
void g4_model_free(g4_model *m);
int g4_model_vocab_size(const g4_model *m);
/* Stop ids from generation_config.json / config.json (eos). */
int g4_model_stop_ids(const g4_model *m, const int **ids);
int g4_model_bos_id(const g4_model *m);
/* The checkpoint folder the model was loaded from. */
const char *g4_model_dir(const g4_model *m);
/* Whether the model has per-layer embeddings (the E2B/E4B family; decides the chat form). */
int g4_model_has_per_layer_inputs(const g4_model *m);
/* Weight bytes one decoded token reads (packed weights, scales, norms, gathered embedding rows). */
size_t g4_model_decode_bytes(const g4_model *m);
/* Writes a human-readable description (layers, linears, totals) to `out` (a FILE*). */
void g4_model_describe(const g4_model *m, void *out);

/* Observes intermediate tensors during a forward pass (for debugging and golden comparison).
 * name: "inputs_embeds", "per_layer_inputs_token", "per_layer_inputs", "k_layer<L>",
 * "v_layer<L>", "hidden_after_layer<L>", "final_norm", "logits". The data are rows
 * [pos0, pos0 + n), each of shape row_shape[0..row_ndim) (e.g. {n_layers, ple_dim}). */
typedef void (*g4_trace_fn)(void *user, const char *name, int pos0, int n, int row_ndim, const int *row_shape,
                            const float *data);

g4_session *g4_session_new(const g4_model *m, const g4_options *o);
void g4_session_free(g4_session *s);
void g4_session_reset(g4_session *s);
int g4_session_pos(const g4_session *s); /* of sequence 0 */
int g4_session_ctx(const g4_session *s);
const g4_model *g4_session_model(const g4_session *s);
void g4_session_set_trace(g4_session *s, g4_trace_fn fn, void *user);
/* Feeds n tokens at the current position of sequence 0. logits: NULL, or room for vocab floats
 * (the last token's logits) or n * vocab floats when all_logits is set. */
int g4_session_eval(g4_session *s, const int32_t *ids, int n, float *logits, int all_logits);
/* Greedy decoding: the same, but only the last token's greedy choice is computed (next = what
 * g4_argmax would pick from its logits, bit for bit). Most logits are never finished, which
 * saves about a third of the lm_head's work. */
int g4_session_eval_argmax(g4_session *s, const int32_t *ids, int n, int32_t *next);
/* Top-k sampling's form: only what a sampler needs of the last token's logits. *n_cand = m
 * candidates cand[0, m) with their exact logits vals[0, m) (bit for bit those of
 * g4_session_eval): every token among the k largest logits and every valid id of extra[0,
 * n_extra) (a repetition penalty's tokens); no other logit exceeds *bound. *n_cand = -1 when the
 * shortcut cannot tell (the tokens are still evaluated): then g4_session_last_logits gives the
 * full logits. cand and vals: room for max_cand. */
int g4_session_eval_top(g4_session *s, const int32_t *ids, int n, int k, const int32_t *extra, int n_extra, int32_t *cand, float *vals,
                        int max_cand, float *bound, int *n_cand);
/* The full logits (vocab floats) of the token the last g4_session_eval_top evaluated. */
int g4_session_last_logits(g4_session *s, float *logits);

/* Time spent per operation class since profiling was switched on (seconds), for `g4 bench`. */
typedef enum { G4_PROF_EMBED = 0, G4_PROF_LINEAR, G4_PROF_ATTENTION, G4_PROF_LM_HEAD, G4_PROF_OTHER, G4_PROF_COUNT } g4_prof_op;
void g4_session_set_profiling(g4_session *s, int on);
void g4_session_profile(const g4_session *s, double seconds[G4_PROF_COUNT]);
const char *g4_prof_op_name(g4_prof_op op);

/* Several independent sequences in one session (g4_options.n_seq): the same for sequence `seq`,
 * and one decoding step of several sequences at once (one token each, distinct sequences, at
 * most 64): the weights are read once for all of them. logits: n * vocab floats. A sequence's
 * results do not depend on what else is in the batch. */
int g4_session_eval_seq(g4_session *s, int seq, const int32_t *ids, int n, float *logits, int all_logits);
int g4_session_eval_batch(g4_session *s, const int *seqs, const int32_t *ids, int n, float *logits);
/* Their greedy forms (see g4_session_eval_argmax); next: one token per sequence or batch row. */
int g4_session_eval_argmax_seq(g4_session *s, int seq, const int32_t *ids, int n, int32_t *next);
int g4_session_eval_batch_argmax(g4_session *s, const int *seqs, const int32_t *ids, int n, int32_t *next);
void g4_session_reset_seq(g4_session *s, int seq);
int g4_session_seq_pos(const g4_session *s, int seq);
int g4_session_n_seq(const g4_session *s);

/* Index of the largest logit (the first one on ties). */
int g4_argmax(const float *logits, int n);

/* Sampling parameters. temperature 0 means greedy (argmax); the rest then has no effect. */
typedef struct {
    float temperature;
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off: drop tokens below min_p x the top token's probability */
    float repeat_penalty; /* 1 = off: HF rule, logit / p if positive, logit * p if negative */
    int repeat_last_n;    /* how many recent tokens the penalty looks at (0 = all) */
    uint64_t seed;
} g4_sampling;

/* Greedy decoding (temperature 0), seed 0. */
void g4_sampling_default(g4_sampling *p);
/* The model's own sampling defaults from generation_config.json (greedy if it has none). */
void g4_model_sampling_defaults(const g4_model *m, g4_sampling *p);

typedef enum {
    G4_STOP_EOS = 0,     /* a stop id was generated (it is reported, then generation ends) */
    G4_STOP_BUDGET = 1,  /* max_tokens reached */
    G4_STOP_CONTEXT = 2, /* the KV cache is full */
    G4_STOP_USER = 3,    /* the token callback asked to stop */
} g4_stop_reason;

typedef struct {
    int max_tokens;
    g4_sampling sampling;
    const int *stop_ids; /* NULL: the model's (generation_config.json / config.json eos) */
    int n_stop_ids;
} g4_generate_params;

typedef struct {
    int n_prompt, n_generated;
    g4_stop_reason stop;
    int32_t stop_id;     /* the stop id generated, when stop == G4_STOP_EOS */
    double prefill_s, decode_s;
} g4_generate_result;

/* Called with each generated token (a stop id included); return non-zero to stop. */
typedef int (*g4_token_fn)(void *user, int32_t token);

/* Feeds `prompt` at the session's current position (the KV cache keeps earlier turns), then
 * generates. Fails, before computing anything, when the prompt does not fit the context.
 * The last generated token (e.g. the stop id) is not fed back: the session's position is
 * n_prompt + n_generated - 1 past where it was, and a follow-up turn starts with that token. */
int g4_generate(g4_session *s, const int32_t *prompt, int n_prompt, const g4_generate_params *params, g4_token_fn on_token,
                void *user, g4_generate_result *result);
const char *g4_stop_reason_name(g4_stop_reason r);

#ifdef __cplusplus
}
#endif
#endif
