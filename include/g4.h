/* g4: an inference engine for Gemma 4 QAT checkpoints with static int8 activations.
 *
 * Load a checkpoint folder (config.json + model.safetensors in the Hugging Face
 * "gemma-4-*-qat-mobile-transformers" format), open a session (run state + KV cache), feed
 * token ids, read logits. Every function that can fail returns NULL or a negative value and
 * leaves a one-line message in g4_last_error().
 *
 * python/g4/_capi.py mirrors the structs the Python package uses (ctypes): a change to one of them
 * goes there too (make python-test compares every mirrored layout with this header's). */
#ifndef G4_H
#define G4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define G4_VERSION "0.1.0"
/* The library's G4_VERSION, for a program that finds it at run time (a binding checking the copy
 * it loaded has the struct layouts it was written against). */
const char *g4_version(void);

typedef struct g4_model g4_model;
typedef struct g4_session g4_session;
typedef struct g4_drafter g4_drafter; /* an MTP drafter's working state (Multi-token prediction, below) */

/* How activations are treated at the linear boundaries (spec: activation-quant.md). */
typedef enum {
    G4_ACT_FLOAT = 0, /* activation scales ignored: the defective fp baseline */
    G4_ACT_FAKE = 1,  /* s * clamp(round(x / s), -128, 127) in float at every enabled point */
    G4_ACT_INT = 2,   /* true int8 x intN -> int32 -> requantized linears */
} g4_act_mode;

/* Rounding of every activation quantizer in a run (src/quant/int8.h uses the same enum). */
typedef enum {
    G4_ROUND_EVEN = 0, /* ties to even: torch.round, lrintf, vcvtnq (HF, XNNPACK, NEON) */
    G4_ROUND_AWAY = 1, /* ties away from zero: std::round (TFLite reference kernels) */
} g4_round;
/* How an activation quantizer forms x / s. */
typedef enum {
    G4_QDIV_DEFAULT = -1,   /* options only: divide in fake mode, reciprocal in int mode (g4_options_resolve) */
    G4_QDIV_RECIPROCAL = 0, /* x * (1/s), 1/s rounded once to f32: XNNPACK, NEON */
    G4_QDIV_DIVIDE = 1,     /* x / s as one f32 division: HF, TFLite reference */
} g4_qdiv;
/* Requantization of an int32 accumulator in `int` mode (int8-arithmetic.md §3). */
typedef enum {
    G4_REQUANT_F32 = 0,        /* XNNPACK: (s_x*s_w)/s_y in f32, acc*M in f32, ties to even (default) */
    G4_REQUANT_F64 = 1,        /* ((acc*s_x)*s_w)/s_y in double, ties to even (unit_linear's y_codes) */
    G4_REQUANT_TFL_DOUBLE = 2, /* TFLite reference: Q31 multiplier, gemmlowp double rounding */
    G4_REQUANT_TFL_SINGLE = 3, /* TFLITE_SINGLE_ROUNDING / ruy: Q31 multiplier, one rounding */
    G4_REQUANT_TFL_NEON = 4,   /* TFLite's optimized NEON helper, double rounding half-up (LiteRT "builtin" CPU path) */
    G4_REQUANT_TFL_REF = 5,    /* TFLite's reference kernels: round(acc * double multiplier), ties away */
} g4_requant_rule;

/* Where a model's streamed weights live (g4_model_load_options). */
typedef enum {
    G4_WEIGHTS_RESIDENT = 0, /* copied into (huge-page) memory at load: g4_model_load */
    G4_WEIGHTS_MAPPED = 1,   /* left in the read-only file mapping: g4_model_load_mapped */
} g4_weights;

/* The engine options. Each field is set by one row of the options table below (n_seq is the
 * caller's: how many sequences a session holds). */
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
    /* How it runs, not what it computes (g4_model_load_options applies both): */
    int threads;       /* the matmul threads of the process (g4_set_threads); 0 = leave them as they are */
    g4_weights weights;
} g4_options;

/* Every option's default, from the table (the spec's "litert" profile in `int` mode, context 4096). */
void g4_options_default(g4_options *o);

/* ---- the options table ----
 *
 * One row per engine option: its name, the values it takes, the g4_options field(s) it sets, its
 * default and whether it changes results. Everything that names options reads it: name=value
 * parsing, the command line's flags (--NAME with '_' written '-', e.g. --pmp-scales), `g4 help`,
 * the eval header (every result-affecting option, resolved) and g4_options_default. */
typedef enum {
    G4_OPTION_RESULT = 0, /* changes what is computed: recorded in the eval header, a resume with another value is refused */
    G4_OPTION_RUN = 1,    /* changes only how it runs (threads, weight placement): the same results whatever its value */
    G4_OPTION_PRESET = 2, /* sets several result-affecting options at once (profile); not recorded itself */
} g4_option_kind;

typedef struct {
    const char *name; /* what the option takes as its value */
    int value;        /* what the field gets (presets: the index of the setting) */
} g4_option_choice;

typedef struct {
    const char *name;       /* "pmp_scales": name=value, and the key in the eval header */
    const char *short_flag; /* "-t", or NULL */
    const g4_option_choice *choices; /* the values of an option with named values (ended by a NULL name), or NULL */
    const char *values;     /* the values of the others, in words: "N in [1, 1048576]" */
    const char *fields;     /* the g4_options field(s) it sets: "pmp_s_in, pmp_s_out" */
    const char *def;        /* its default, a value it takes (g4_options_default sets it) */
    g4_option_kind kind;
    int integer;            /* its value is an integer (a JSON number in the eval header) */
    const char *help;       /* what it does, one line */
} g4_option_info;

/* The rows, in table order (the eval header's order); NULL past the end. */
int g4_option_count(void);
const g4_option_info *g4_option_at(int i);
/* The row named `name` ("pmp_scales"), or whose flag it is ("--pmp-scales", "-t"); NULL if none. */
const g4_option_info *g4_option_find(const char *name);

/* Sets option `name` (a name or a flag, as g4_option_find takes) from its text. Fails, changing
 * nothing, on an unknown option or a value it does not take; the message names the option as
 * given and the values it takes ("--act fast: expected one of float fake int"). */
int g4_options_set(g4_options *o, const char *name, const char *value);
/* The same from "name=value". */
int g4_options_parse(g4_options *o, const char *assignment);
/* Option `name`'s value as text (what g4_options_set takes), NUL-terminated in buf; the length,
 * or -1 when it does not fit or there is no such option. "auto" stands for a value the engine
 * chooses (qdiv, threads); g4_options_resolve first for what it chooses. */
int g4_options_get(const g4_options *o, const char *name, char *buf, size_t cap);
/* Replaces each value the engine chooses from other options by the one it uses: qdiv by
 * divide in fake and float mode, reciprocal in int mode. Sessions run the resolved options. */
void g4_options_resolve(g4_options *o);

/* ---- logging ----
 *
 * The library never writes to stderr itself: each warning (a checkpoint oddity, an option with
 * no effect, a bad environment variable) goes to the log function, by default g4_log_stderr
 * ("g4: warning: MESSAGE" on a line). The message has no prefix and no newline. The function may
 * be called from any thread that calls into the library; set it before other calls. */
typedef enum { G4_LOG_WARNING = 0 } g4_log_level;
typedef void (*g4_log_fn)(void *user, g4_log_level level, const char *message);
/* fn NULL: nothing is logged. */
void g4_set_log(g4_log_fn fn, void *user);
void g4_log_stderr(void *user, g4_log_level level, const char *message);

/* ---- threads ----
 *
 * The matmuls of every session run on one process-wide pool. g4_set_threads sets its size (the
 * caller's thread included; n <= 0: one per online CPU, the default); call it while no session
 * computes. g4_threads gives the size in effect.
 *
 * Sessions may compute in different threads at once, sessions of one model as well as of several
 * (a loaded model is only read), each getting what it gets alone (tests/test_generate.c); a
 * session, with the stepper and the conversation over it, is one thread's at a time.
 * g4_last_error() is per thread. */
void g4_set_threads(int n);
int g4_threads(void);

const char *g4_last_error(void);

g4_model *g4_model_load(const char *dir);
/* g4_model_load copies the weights every token streams into memory backed by transparent huge
 * pages where the system has them (faster decode, slower load, same resident memory);
 * g4_model_load_mapped leaves them in the read-only file mapping (pages shared with other
 * processes reading the same file). g4_model_weights_resident says which one a model got. */
g4_model *g4_model_load_mapped(const char *dir);
int g4_model_weights_resident(const g4_model *m);
/* g4_model_load or g4_model_load_mapped as o->weights says, after setting the threads to
 * o->threads (g4_set_threads) unless it is 0. */
g4_model *g4_model_load_options(const char *dir, const g4_options *o);
void g4_model_free(g4_model *m);
int g4_model_vocab_size(const g4_model *m);
/* Stop ids from generation_config.json / config.json (eos). */
int g4_model_stop_ids(const g4_model *m, const int **ids);
int g4_model_bos_id(const g4_model *m);
/* The checkpoint folder the model was loaded from. */
const char *g4_model_dir(const g4_model *m);
/* Whether the model has per-layer embeddings (the E2B/E4B family; g4_model_chat_form falls back on it). */
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
/* Independent sequences of a session (g4_options.n_seq), each with its own KV cache. Resetting one
 * empties its cache (its position back to 0). */
int g4_session_n_seq(const g4_session *s);
int g4_session_seq_pos(const g4_session *s, int seq);
void g4_session_reset_seq(g4_session *s, int seq);
/* Keeps the first n tokens of sequence seq's cache and drops the rest: the next token goes at
 * position n, and the sequence computes what it would after feeding those n tokens alone (a
 * shared prompt prefix reused, g4 serve's prompt cache). Fails when n is past what it holds. */
int g4_session_truncate_seq(g4_session *s, int seq, int n);
/* Sequence `to` holds a copy of the first n tokens of sequence `from`'s cache (from's are kept):
 * a shared prompt computed once. Fails when from holds fewer than n or to == from. */
int g4_session_copy_seq(g4_session *s, int from, int to, int n);

/* ---- decoding: one call for a batch of rows ----
 *
 * g4_decode feeds a batch of rows, each one token appended to one sequence of the session at that
 * sequence's next position (several rows of one sequence take consecutive positions, in batch
 * order), and computes what each row asks for. Prompt tokens of some sequences and decode tokens
 * of others can share a batch; the weights are read once per 64 rows. Every row is computed as it
 * would be alone: a sequence's results never depend on what else is in the batch, bit for bit,
 * whatever each row asks for. */

/* What a batch row asks of the lm_head. */
typedef enum {
    G4_OUTPUT_NONE = 0,   /* nothing: the token only extends its sequence's KV cache (a prompt token) */
    G4_OUTPUT_LOGITS = 1, /* every logit, softcapped: vocab floats into the row's `logits` */
    G4_OUTPUT_ARGMAX = 2, /* the greedy token into `argmax`: what g4_argmax picks from the logits, bit for bit,
                             with most logits never finished (about a third of the lm_head's work saved); -1 when
                             the logits hold a NaN or an infinity */
    G4_OUTPUT_TOP = 3,    /* top-k sampling's candidates into `*top` (g4_candidates) */
} g4_output;

/* A G4_OUTPUT_TOP request and its answer: the few logits a top-k sampler needs. */
typedef struct {
    int k;                /* in: every token among the k largest logits is a candidate */
    const int32_t *extra; /* in: ids whose exact logits are wanted too (a repetition penalty's); invalid ids are skipped */
    int n_extra;
    int32_t *ids;         /* in: room for cap candidates, their ids ... */
    float *logits;        /* ... and their exact logits, bit for bit those of G4_OUTPUT_LOGITS */
    int cap;
    int n;                /* out: the number of candidates, or -1 where the shortcut cannot tell (more than cap, a
                             near tie, an lm_head it does not apply to): g4_decode_logits then gives every logit */
    float bound;          /* out, when n >= 0: no logit outside the candidates exceeds it */
} g4_candidates;

/* One row of a batch. */
typedef struct {
    int seq;            /* the sequence the token extends */
    int32_t token;
    g4_output output;
    float *logits;      /* G4_OUTPUT_LOGITS: room for vocab floats; rows whose buffers follow one another
                           (the next row's = this row's + vocab) share one pass over the lm_head */
    g4_candidates *top; /* G4_OUTPUT_TOP */
    int32_t argmax;     /* out, G4_OUTPUT_ARGMAX: the greedy token */
    const float *embd;  /* NULL: the row feeds `token`. Otherwise g4_model_hidden_size floats, all finite, fed
                           as the row's input embedding instead of a token's (an image or audio soft token):
                           used as given (not scaled by sqrt(hidden)); the per-layer-input table is looked up
                           with the pad id while per_layer_model_projection sees this embedding, as
                           transformers' Gemma4Model does at soft-token positions. `token` is then unused. */
} g4_batch_row;

/* Feeds rows[0, n) and fills in what they ask for. Fails before computing anything (nothing is
 * fed) on an unknown sequence, a token outside the vocabulary, an embedding row holding a NaN or
 * an infinity, a sequence that would run past
 * the context, an unknown output or a request without its buffers. */
int g4_decode(g4_session *s, g4_batch_row *rows, int n);
/* The full logits (vocab floats) of row `row` of the last g4_decode call, which asked for
 * G4_OUTPUT_ARGMAX or G4_OUTPUT_TOP: computed now from the row's final hidden state (kept until
 * the next call), bit for bit what G4_OUTPUT_LOGITS would have given. For a sampler that the
 * candidates could not settle. */
int g4_decode_logits(g4_session *s, int row, float *logits);
/* The final-normed hidden state (g4_model_hidden_size floats) of row `row` of the last g4_decode
 * call, which asked for any output: what an MTP drafter continues from (g4_drafter_step). */
int g4_decode_hidden(const g4_session *s, int row, float *hidden);

/* ---- Multi-token prediction: a Gemma 4 assistant drafter (gemma4_assistant) -------------------
 *
 * A drafter is a small decoder tied to one target model: its input is the target's scaled input
 * embedding of the last token with the target's last final-normed hidden state (pre_projection),
 * its layers attend, read-only, to the target's K/V cache (the last K/V-producing layer of each
 * attention type), all at the position of the token drafted from; post_projection of its output is
 * the hidden state of its next step. The stepper verifies K drafted tokens in one multi-row pass of
 * the target and keeps what the target itself would have produced (g4_stepper_set_draft). */
typedef struct g4_draft g4_draft;
/* Loads a drafter folder (config.json model_type gemma4_assistant, model.safetensors) for
 * `target`: fails, naming the file and field, when its shapes do not fit the target's. */
g4_draft *g4_draft_load(const char *dir, const g4_model *target);
void g4_draft_free(g4_draft *d);
int g4_model_hidden_size(const g4_model *m);

/* A drafter's working state over one target session: buffers for up to 64 rows, one per
 * sequence drafted at once. The session and the drafter must outlive it. */
g4_drafter *g4_drafter_new(const g4_draft *d, g4_session *target);
void g4_drafter_free(g4_drafter *dr);
/* The session it drafts over. */
const g4_session *g4_drafter_session(const g4_drafter *dr);
/* One draft step for n rows: row i drafts in sequence seqs[i] from tokens[i] (the token at the
 * sequence's next position, not fed yet) with hidden[i] (g4_model_hidden_size floats: the target's
 * final-normed hidden state of the row that gave tokens[i], or the last step's output), reading the
 * sequence's K/V as it stands. Writes each row's greedy draft into next[i], its logits into
 * logits + i x vocab when logits is not NULL (centroid-masked tokens get the row's smallest
 * selected logit - 1, as transformers' Gemma4AssistantMaskedEmbedder), and replaces hidden[i]
 * with the next step's hidden state. */
int g4_drafter_step(g4_drafter *dr, int n, const int *seqs, const int32_t *tokens, float *hidden, int32_t *next, float *logits);

/* Time spent per operation class since profiling was switched on (seconds), for `g4 bench`. */
typedef enum { G4_PROF_EMBED = 0, G4_PROF_LINEAR, G4_PROF_ATTENTION, G4_PROF_LM_HEAD, G4_PROF_OTHER, G4_PROF_COUNT } g4_prof_op;
void g4_session_set_profiling(g4_session *s, int on);
void g4_session_profile(const g4_session *s, double seconds[G4_PROF_COUNT]);
const char *g4_prof_op_name(g4_prof_op op);


/* ---- Text: tokenizer.json, the Gemma 4 chat template, the model's reply ------------------------ */

/* Text tokenizer for Hugging Face tokenizer.json files of the Gemma 3 / Gemma 4 kind.
 *
 * Supported pipeline (anything else in the file is rejected at load with a message naming
 * the field, rather than silently tokenizing differently):
 *   1. added_tokens matched on the raw text, leftmost-longest (lstrip/rstrip/single_word/
 *      normalized must be false);
 *   2. normalizer Replace(" " -> U+2581) or none;
 *   3. pre_tokenizer Split(" ", MergedWithPrevious) (a no-op after step 2) or none;
 *   4. BPE: merges by rank (lowest rank first, leftmost among equals), byte_fallback <0xNN>,
 *      unk_token/fuse_unk when there is no byte fallback;
 *   5. decoder Sequence[Replace(U+2581 -> " "), ByteFallback, Fuse].
 * No BOS is ever added: chat prompts carry a literal "<bos>" (encode with parse_special=1).
 *
 * Invalid UTF-8 in the input never fails: each byte that is not part of a valid UTF-8
 * sequence becomes its own byte token <0xNN> (or unk without byte fallback). Decoding runs
 * byte tokens through a UTF-8 decoder that replaces each maximal invalid subsequence with
 * U+FFFD (the WHATWG rule, same as the JavaScript reference), so decode output is always
 * valid UTF-8 and valid input round-trips exactly (except a literal U+2581, which decodes
 * to a space, as in Hugging Face).
 *
 * Loading parses the JSON with cJSON (slow for the 14-33 MB Gemma files) and then writes a
 * binary cache "<path>.g4cache" next to it when the directory is writable; later loads use
 * the cache if it matches the source's size, mtime and content hash and passes its own
 * checksum, otherwise it is ignored and rewritten. G4_TOKENIZER_CACHE=off in the environment
 * turns the cache off for g4_tokenizer_load (as G4_TOKENIZER_NO_CACHE does for _ex).
 *
 * A loaded tokenizer is immutable: encode/decode may run concurrently from many threads.
 * Errors leave their message in g4_last_error(). */
typedef struct g4_tokenizer g4_tokenizer;

/* Flags for g4_tokenizer_load_ex. */
enum {
    G4_TOKENIZER_NO_CACHE = 1u, /* neither read nor write "<path>.g4cache" */
};

/* Returns NULL on error; g4_last_error() names the file and what is wrong. g4_tokenizer_load
 * uses the cache unless $G4_TOKENIZER_CACHE is "off"; _ex does what its flags say. */
g4_tokenizer *g4_tokenizer_load(const char *path);
g4_tokenizer *g4_tokenizer_load_ex(const char *path, unsigned flags);
void g4_tokenizer_free(g4_tokenizer *tok);
/* 1 when the last load of this tokenizer came from a valid "<path>.g4cache". */
int g4_tokenizer_loaded_from_cache(const g4_tokenizer *tok);

/* Encodes len bytes of text (NULs allowed) into *ids (malloc'd, caller frees; never NULL
 * on success). No BOS/EOS is added.
 * parse_special=1: every added token (control tokens included) is matched in the text.
 * parse_special=0: tokens marked "special" (<bos>, <|turn>, <|channel>, ...) are NOT
 * matched and are tokenized as ordinary text, for untrusted input; non-special added tokens
 * (newline/tab runs, <unusedN>, HTML tags) are still matched because ordinary text
 * tokenization depends on them (same as Hugging Face split_special_tokens=True). */
int g4_tokenizer_encode(const g4_tokenizer *tok, const char *text, size_t len, int parse_special,
                        int32_t **ids, size_t *n_ids);

/* Decodes ids to UTF-8 text in *out (malloc'd, NUL-terminated, caller frees). Special
 * tokens are rendered as their literal text (callers filter with g4_tokenizer_is_special). */
int g4_tokenizer_decode(const g4_tokenizer *tok, const int32_t *ids, size_t n, char **out,
                        size_t *out_len);

/* One more than the largest token id (model vocab plus added tokens beyond it). */
size_t g4_tokenizer_vocab_size(const g4_tokenizer *tok);
/* -1 when the piece is not a token (lookup is exact, on the stored piece: "▁Hello"). */
int32_t g4_tokenizer_piece_to_id(const g4_tokenizer *tok, const char *piece);
/* NULL when id is out of range or unused. */
const char *g4_tokenizer_id_to_piece(const g4_tokenizer *tok, int32_t id);
/* 1 for added tokens marked "special" in tokenizer.json (<pad>, <eos>, <bos>, <|turn>...). */
int g4_tokenizer_is_special(const g4_tokenizer *tok, int32_t id);

/* Streaming decoder for generation: each push returns the bytes that became final, always
 * whole UTF-8 characters; an incomplete UTF-8 tail from byte tokens is held back until the
 * next push or flush. The concatenation of all pushes plus flush equals
 * g4_tokenizer_decode of the same ids. The returned pointer is valid until the next call on
 * the same decoder. */
typedef struct g4_detokenizer g4_detokenizer;
g4_detokenizer *g4_detokenizer_new(const g4_tokenizer *tok);
int g4_detokenizer_push(g4_detokenizer *d, int32_t id, const char **bytes, size_t *len);
int g4_detokenizer_flush(g4_detokenizer *d, const char **bytes, size_t *len);
void g4_detokenizer_reset(g4_detokenizer *d);
void g4_detokenizer_free(g4_detokenizer *d);
/* The length of the longest prefix of s[0, n) that is valid UTF-8 (shortest forms, no
 * surrogates, at most U+10FFFF): n when all of it is. What a front end keeps of untrusted text
 * before it echoes it back (a request body, an error message quoting it). */
size_t g4_text_utf8_prefix(const char *s, size_t n);

/* Gemma 4 chat prompt rendering and parsing of the model's reply (thought, answer, tool calls).
 *
 * Rendering follows the Gemma 4 chat templates (spec chat-and-tokenizer.md, section C; the
 * upstream E2B template of 2026-07-09 for tool calls and turn closing):
 *
 *   <bos>[<|turn>system\n[<|think|>\n]{system text}[<|tool>{declaration}<tool|>...]<turn|>\n]
 *   <|turn>user\n{text}<turn|>\n
 *   <|turn>model\n{earlier answer, thought spans removed}<turn|>\n
 *   <|turn>model\n{its tool calls}<|tool_response>response:NAME{value:<|"|>{tool text}<|"|>}<tool_response|>...
 *   ...
 *   <|turn>model\n                          generation prompt (none right after tool responses:
 *   [<|channel>thought\n<channel|>]          the model goes on in its turn, in a thought if thinking)
 *                                            26B/31B form with thinking off only
 *
 * The system turn appears when thinking is on, tools are declared or the first message is a
 * system message. Every content is trimmed of leading/trailing whitespace (Unicode whitespace,
 * like the template's Python `trim`); a tool's text is not. A model message holds the model's
 * text as it wrote it: its complete tool-call spans "<|tool_call>call:NAME{ARGS}<tool_call|>" are
 * rendered first, as the template renders a message's tool_calls, then the rest with its thought
 * spans removed. The tool messages after a model message answer its calls in order (Gemma's calls
 * carry no ids) and go into its turn; a model message right after another model message or after
 * tool responses continues the same turn. A call nobody answered ends the turn with
 * "<|tool_response>", where the model stopped. Images/audio and the template's `reasoning`
 * re-insertion are not supported; tool declarations are given in Gemma's syntax
 * ("declaration:NAME{description:<|"|>...<|"|>,parameters:{...}}"), not as JSON schemas.
 *
 * The rendered string holds the control tokens as literals: encode it with
 * parse_special=1, and do not add another BOS. g4_chat_encode does both and also keeps
 * control-token strings typed by the user from becoming control tokens: only the template's
 * parts, and the tool syntax's markers (<|tool_call>, <tool_call|>, <|"|>) in model messages and
 * declarations, are encoded as control tokens. */
typedef enum {
    G4_CHAT_SYSTEM,
    G4_CHAT_USER,
    G4_CHAT_MODEL,
    G4_CHAT_TOOL, /* a tool's response to a call of the model message before it */
} g4_chat_role;

typedef struct {
    g4_chat_role role;
    const char *content; /* UTF-8, NUL-terminated; NULL is treated as "" */
} g4_chat_message;

typedef enum {
    /* E2B / E4B template: thinking off renders the plain generation prompt "<|turn>model\n". */
    G4_CHAT_FORM_E2B,
    /* 26B-A4B / 31B template: thinking off appends an empty thought channel
     * "<|channel>thought\n<channel|>" to the generation prompt. */
    G4_CHAT_FORM_26B,
} g4_chat_form;

typedef struct {
    g4_chat_form form;
    int thinking;              /* put <|think|> at the top of the system turn */
    int add_generation_prompt; /* end with the open model turn */
    int add_bos;               /* start with the literal "<bos>" */
    const char *const *tools;  /* tool declarations in Gemma's syntax, in the system turn; NULL: none */
    size_t n_tools;
} g4_chat_options;

/* E2B form, thinking off, generation prompt and BOS on, no tools. */
g4_chat_options g4_chat_default_options(void);

/* The form the model's checkpoint asks for, derived from its chat template (chat_template.jinja,
 * else tokenizer_config.json's chat_template): the 26B form when the template pre-fills an empty
 * thought with thinking off, else the E2B form. A checkpoint without a template gets its family's:
 * E2B/E4B have per-layer embeddings, 26B/31B not. Fails on a template file it cannot read. */
int g4_model_chat_form(const g4_model *m, g4_chat_form *form);

/* "system"/"developer", "user", "model"/"assistant", "tool" -> role; -1 (g4_last_error says why) otherwise. */
int g4_chat_role_parse(const char *name, g4_chat_role *role);

/* Renders the prompt text into *out (malloc'd, NUL-terminated, caller frees). Fails on an
 * invalid role or a tool message that answers no call. */
int g4_chat_render(const g4_chat_message *msgs, size_t n, const g4_chat_options *opt, char **out, size_t *out_len);

/* Renders and encodes in one go: template parts with parse_special=1, message contents
 * with parse_special=0 (untrusted), so "<|turn>" typed by a user stays plain text. For
 * contents without control-token strings the ids equal encoding g4_chat_render's text. */
int g4_chat_encode(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, const g4_chat_options *opt,
                   int32_t **ids, size_t *n_ids);
/* What g4_chat_render refuses, without rendering: bad options, an invalid role, a tool message
 * that answers no call (a server checks a request's messages before it queues them). */
int g4_chat_check(const g4_chat_message *msgs, size_t n, const g4_chat_options *opt);
/* Python's str.strip on s[0, n) (what the template's `trim` removes from every content): the kept
 * span [*start, *end). */
void g4_chat_trim(const char *s, size_t n, size_t *start, size_t *end);

/* The template's strip_thinking for earlier model turns: drops every
 * "<|channel>...<channel|>" span, then trims. *out is malloc'd. */
int g4_chat_strip_thinking(const char *text, size_t len, char **out, size_t *out_len);

/* The spans of a reply (spec section C.3):
 *  - thought: every "<|channel>...<channel|>" span, its markers and "thought\n" header dropped;
 *  - tool call: every "<|tool_call>...<tool_call|>" span, its markers kept (the text can go back
 *    into a model message as it is); inside it only "<tool_call|>" is a marker;
 *  - answer: the rest. A stray "<channel|>" in the answer is dropped (a stray "<tool_call|>" is text). */
typedef enum { G4_SPAN_ANSWER = 0, G4_SPAN_THOUGHT = 1, G4_SPAN_TOOL_CALL = 2 } g4_span;

typedef struct {
    g4_span span;
    const char *text; /* not NUL-terminated */
    size_t len;
} g4_span_text;

/* A complete tool call "<|tool_call>call:NAME{ARGS}<tool_call|>". */
typedef struct {
    char *name;      /* NAME; "" when the call's text is not of the form call:NAME{...} */
    char *arguments; /* "{ARGS}" in Gemma's syntax (key:value, strings in <|"|>), or the call's whole text */
} g4_tool_call;

/* A finished reply split into its spans:
 *  - a "<channel|>" before any "<|channel>" closes a thought that began at the start of
 *    the output (a prompt that prefilled "<|channel>thought\n"): everything before it is
 *    thinking;
 *  - a "<|channel>" never closed leaves thought_unclosed set: the answer is missing
 *    ("truncated in thought"), what follows the marker is thinking; a "<|tool_call>" never
 *    closed leaves tool_call_unclosed set and is in no list.
 * answer and thinking are trimmed and malloc'd, like the tool calls (free with
 * g4_chat_reply_free). The text must not include the stop token. */
typedef struct {
    char *answer;
    size_t answer_len;
    char *thinking;
    size_t thinking_len;
    int thought_blocks;   /* thought spans seen, including an unclosed one */
    int thought_unclosed; /* output ended inside a thought */
    g4_tool_call *tool_calls; /* the complete tool calls, in order */
    int n_tool_calls;
    int tool_call_unclosed;   /* output ended inside a tool call */
} g4_chat_reply;

int g4_chat_parse_reply(const char *text, size_t len, g4_chat_reply *reply);
void g4_chat_reply_free(g4_chat_reply *reply);

/* Tools given the OpenAI way (JSON) in Gemma's tool syntax, and back, by the upstream E2B
 * template's rules (its format_function_declaration, format_parameters and format_argument
 * macros): keys in Jinja's dictsort order (case ignored), strings in <|"|>, numbers as Python
 * prints them, except that JSON keeps no int/float distinction: an integral number is written as
 * an int (2, where the template writes 2.0 for a JSON 2.0). Results are malloc'd.
 *
 * g4_tool_declaration: one tool object {"type":"function","function":{"name","description",
 * "parameters"[,"response"]}} as JSON text -> "declaration:NAME{...}", for g4_chat_options.tools.
 * g4_tool_call_text: a call the way the model writes it, "<|tool_call>call:NAME{ARGS}<tool_call|>",
 * from its name and arguments (a JSON object as text; empty or null: none), as the template
 * renders an assistant message's tool_calls; it goes into a model message's content.
 * g4_tool_arguments_json: a call's arguments as the model wrote them ("{city:<|"|>Paris<|"|>}",
 * g4_tool_call.arguments) -> JSON text ({"city":"Paris"}); JSON "strings" and bare words are
 * taken too (a bare word that is no number, true, false or null is a string). Fails on anything
 * else, on text after the closing brace, or past 64 levels of nesting. */
int g4_tool_declaration(const char *tool_json, size_t len, char **out);
int g4_tool_call_text(const char *name, const char *args_json, size_t len, char **out);
int g4_tool_arguments_json(const char *args, size_t len, char **json);
/* A whole call as the model writes it, "<|tool_call>call:NAME{ARGS}<tool_call|>" (a tool-call
 * span), into its name and JSON arguments (g4_tool_arguments_json's). */
int g4_tool_call_parse(const char *text, size_t len, char **name, char **json);

/* Streaming version for showing a reply while it is generated, for thought and answer: push
 * decoded text as it comes (e.g. from g4_detokenizer), get back the bytes that are final, split
 * into answer and thought (tool calls are answer text here; a conversation splits them out too).
 * A marker split across pushes is held back until it is complete. The
 * retroactive rule for a bare "<channel|>" cannot apply to text already shown, so say at
 * creation whether the prompt left a thought open (ended with "<|channel>thought\n");
 * a stray "<channel|>" is otherwise just dropped. Returned pointers are valid until the
 * next call on the same filter. */
typedef struct g4_thought_filter g4_thought_filter;
g4_thought_filter *g4_thought_filter_new(int starts_in_thought);
int g4_thought_filter_push(g4_thought_filter *f, const char *text, size_t len, const char **answer, size_t *answer_len,
                           const char **thought, size_t *thought_len);
/* Releases anything held back (an incomplete marker is plain text after all). */
int g4_thought_filter_finish(g4_thought_filter *f, const char **answer, size_t *answer_len, const char **thought,
                             size_t *thought_len);
int g4_thought_filter_in_thought(const g4_thought_filter *f);
int g4_thought_filter_blocks(const g4_thought_filter *f);
void g4_thought_filter_free(g4_thought_filter *f);

/* ---- Generation ------------------------------------------------------------------------------- */

/* Index of the largest logit (the first one on ties). */
int g4_argmax(const float *logits, int n);

/* Sampling parameters. temperature 0 (below G4_GREEDY_TEMPERATURE) means greedy (argmax); top-k,
 * top-p and min-p then have no effect. */
typedef struct {
    float temperature;
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off: drop tokens below min_p x the top token's probability */
    float repeat_penalty; /* 1 = off: HF rule, logit / p if positive, logit * p if negative */
    int repeat_last_n;    /* how many recent tokens the penalty looks at (0 = all) */
    uint64_t seed;
    /* OpenAI's penalties, over the tokens generated so far (not the prompt), after the repetition
     * penalty: a token's logit loses frequency_penalty x its count, and presence_penalty once if
     * it occurred. 0 = off. */
    float frequency_penalty;
    float presence_penalty;
    /* OpenAI's logit_bias: bias_values[i] (in [-100, 100]) added to token bias_ids[i]'s logit
     * after the penalties, before the temperature; a later entry for the same id adds to it.
     * Borrowed: a sampler (and so g4_stepper_add, g4_generate) copies them. */
    const int32_t *bias_ids;
    const float *bias_values;
    int n_bias;
} g4_sampling;

#define G4_MAX_LOGIT_BIAS 100.0f

/* Greedy decoding (temperature 0), seed 0. */
void g4_sampling_default(g4_sampling *p);
/* Temperatures below this are greedy decoding, as 0 is. At 1e-5 a gap of 1e-3 between the two
 * best logits already weighs e^-100 against the second (the draw is the argmax but for exact
 * ties), while below it logit / T leaves float's range for ever smaller logits (at T = 1e-40, any
 * |logit| above 0.034): vLLM draws the same line. */
#define G4_GREEDY_TEMPERATURE 1e-5f
/* The bounds every front end applies (flags, server fields, Python arguments, generation_config.json):
 * temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1], repeat_penalty finite
 * and > 0, repeat_last_n >= 0, finite frequency and presence penalties, logit biases in [-100, 100].
 * 0, or -1 with a one-line message naming the first one out of bounds. */
int g4_sampling_check(const g4_sampling *p);
/* 1 when these parameters decode greedily: temperature below G4_GREEDY_TEMPERATURE. */
int g4_sampling_greedy(const g4_sampling *p);
/* The model's own sampling defaults from generation_config.json (greedy if it has none). */
void g4_model_sampling_defaults(const g4_model *m, g4_sampling *p);
/* The fields of g4_sampling as bits of a mask: the ones a front end was given (a flag, a request
 * field, a Python argument), to lay over a base (the model's defaults, a server's). */
enum {
    G4_SAMPLE_TEMP = 1, G4_SAMPLE_TOP_K = 2, G4_SAMPLE_TOP_P = 4, G4_SAMPLE_MIN_P = 8, G4_SAMPLE_PENALTY = 16,
    G4_SAMPLE_LAST_N = 32, G4_SAMPLE_SEED = 64, G4_SAMPLE_FREQUENCY = 128, G4_SAMPLE_PRESENCE = 256,
    G4_SAMPLE_BIAS = 512 /* bias_ids, bias_values and n_bias together (borrowed, as ever) */
};
/* Copies the fields marked in `given` (G4_SAMPLE_* bits) from `from` into `to`; the others keep
 * to's values. */
void g4_sampling_override(g4_sampling *to, const g4_sampling *from, int given);

/* Why a generation stopped. */
typedef enum {
    G4_STOP_EOS = 0,     /* a stop id was generated (it is reported, then generation ends) */
    G4_STOP_BUDGET = 1,  /* max_tokens reached */
    G4_STOP_CONTEXT = 2, /* the KV cache is full */
    G4_STOP_USER = 3,    /* the caller stopped it: the token callback asked to, or g4_stepper_cancel */
    G4_STOP_ERROR = 4,   /* the model's output turned non-finite (NaN or infinite logits or hidden state: weights or a
                            config that overflow float); g4_stepper_error says where. g4_generate then fails */
} g4_stop_reason;

/* One generation's settings. */
typedef struct {
    int max_tokens;      /* the budget of generated tokens, a stop id included */
    g4_sampling sampling;
    const int *stop_ids; /* NULL: the model's (generation_config.json / config.json eos) */
    int n_stop_ids;
    /* What each step asks of the lm_head. G4_OUTPUT_NONE (0, the default): the least that decides
     * the pick (the greedy token for greedy decoding without a penalty, candidates for top-k
     * sampling, else every logit). G4_OUTPUT_LOGITS, or G4_OUTPUT_TOP with at least output_k
     * candidates, force that form (g4 bench --logits): the same tokens at another cost.
     * G4_OUTPUT_ARGMAX only for greedy decoding without a penalty. */
    g4_output output;
    int output_k;
    /* Speculative decoding (multi-token prediction): with a drafter (made for the session the
     * generation runs in), each step drafts up to draft_tokens tokens (0: G4_DRAFT_TOKENS_DEFAULT,
     * at most G4_MAX_DRAFT_TOKENS), verifies them with the last token in one multi-row pass of the
     * target, keeps the longest prefix the target agrees with plus the target's own next token and
     * rolls the cache back over the rest. Greedy decoding gives exactly the tokens it gives
     * without; a generation that samples or uses a repetition penalty ignores the drafter. One
     * stepper takes one drafter: every generation in it that drafts uses the same. */
    g4_drafter *draft;
    int draft_tokens;
    /* Asked before each step (each prompt chunk, each token) with cancel_user: non-zero stops the
     * generation there with G4_STOP_USER, in the middle of a long prompt too (its cache keeps the
     * chunks fed; a conversation's reply gives them back). For a caller whose stop comes from
     * another thread (Ctrl-C). NULL: never asked. */
    int (*cancel)(void *cancel_user);
    void *cancel_user;
    /* Log-probabilities (g4_stepper_logprobs): non-zero records, for each generated token, its
     * log-probability and those of the top_logprobs (0..G4_MAX_TOP_LOGPROBS) most likely tokens
     * under the model's own distribution: the log-softmax of the row's softcapped logits, before
     * any penalty, bias or temperature (what vLLM reports by default). Its rows then ask for every
     * logit (G4_OUTPUT_LOGITS) and it does not draft. */
    int logprobs;
    int top_logprobs;
    /* Structured output (README "Structured output"): with a grammar state, every generated token
     * is one whose bytes the grammar accepts after the tokens before it (g4_grammar_mask over
     * constraint_vocab, the model's tokenizer's), and a stop id only where the grammar is
     * complete; once complete with no byte able to follow, only the stop ids (or, with none, the
     * generation ends there: G4_STOP_EOS with stop_id -1). The state is copied at g4_stepper_add
     * (sharing its warm mask cache, g4_grammar_state_copy); g4_stepper_constraint gives the
     * generation's own. Its rows ask for every logit and it does not draft (a drafter is ignored). */
    const struct g4_grammar_state *constraint;
    const struct g4_grammar_vocab *constraint_vocab;
    /* Thinking under a constraint (Gemma 4's <|channel> and <channel|> ids; 0: none): the first
     * token may also be thought_open, and then every token is free up to thought_close, after
     * which the constraint applies to the answer. */
    int32_t thought_open, thought_close;
} g4_generate_params;

#define G4_MAX_TOP_LOGPROBS 20

/* A token and its log-probability. */
typedef struct {
    int32_t token;
    float logprob;
} g4_token_logprob;

/* One generated token's log-probabilities: the chosen token's, then the n_top most likely tokens,
 * most likely first (the lower id first on equal logits). */
typedef struct {
    g4_token_logprob chosen;
    int n_top;
    g4_token_logprob top[G4_MAX_TOP_LOGPROBS];
} g4_logprobs;

#define G4_DRAFT_TOKENS_DEFAULT 3
#define G4_MAX_DRAFT_TOKENS 16

typedef struct {
    int n_prompt, n_generated;
    g4_stop_reason stop;
    int32_t stop_id;     /* the stop id generated, when stop == G4_STOP_EOS */
    double prefill_s;    /* from feeding the prompt's first token to the first generated one */
    double decode_s;     /* from then to the last */
} g4_generate_result;

/* ---- generation in many sequences at once (continuous batching) ----
 *
 * A stepper runs generations in the sequences of a session. g4_stepper_add starts one in a
 * sequence, with its own settings (sampling and its generator, repetition window, stop ids,
 * budget). Each g4_stepper_step advances every sequence that is generating by one token (a
 * drafting round's 1 to draft_tokens + 1: g4_generate_params.draft), all of them in one
 * g4_decode call, then feeds up to prompt_chunk tokens of the prompts still waiting (first
 * added, first fed; several sequences' in one call): a sequence can be added at any time
 * between steps and joins the others once its prompt is in, and any one can be cancelled. A
 * sequence gives exactly the tokens it gives alone with the same settings, whatever runs beside
 * it, sampled ones included. A stepper drives the session it is given (one stepper per session at
 * a time) and does not own it; while a sequence feeds a prompt or generates, its cache is the
 * stepper's (no g4_decode or reset of it from outside). */
typedef struct g4_stepper g4_stepper;

/* Where a sequence's generation stands. */
typedef enum {
    G4_SEQ_IDLE = 0,       /* none started in this stepper */
    G4_SEQ_PROMPT = 1,     /* its prompt is being fed */
    G4_SEQ_GENERATING = 2, /* one token a step */
    G4_SEQ_FINISHED = 3,   /* stopped; g4_stepper_result says why */
} g4_seq_state;

/* What a step did for one sequence. */
typedef struct {
    int seq;
    int32_t token;       /* the token generated, a stop id included; -1 for a budget of 0, which ends at the prompt */
    int finished;        /* the sequence stopped here: stop says why */
    g4_stop_reason stop;
} g4_step_token;

/* Why sequence seq stopped with G4_STOP_ERROR (one line, valid until its next g4_stepper_add);
 * NULL for any other sequence. */
const char *g4_stepper_error(const g4_stepper *st, int seq);

/* Totals over a stepper's life. */
typedef struct {
    long steps, prompt_tokens, generated;
    double prefill_s, decode_s; /* seconds in the prompt calls and in the decode calls, their token choices included */
} g4_stepper_stats;

/* prompt_chunk: the prompt tokens a step feeds at most (0: 64, one pass over the weights). */
g4_stepper *g4_stepper_new(g4_session *s, int prompt_chunk);
void g4_stepper_free(g4_stepper *st);
/* Starts a generation in sequence seq (one that is not feeding a prompt or generating): the
 * prompt goes in at the sequence's current position (the cache keeps earlier turns;
 * g4_session_reset_seq first for a new conversation). Fails, before anything is fed, on an empty
 * prompt, one that does not fit the context, a token outside the vocabulary or invalid sampling
 * parameters. The prompt and the stop ids are copied. */
int g4_stepper_add(g4_stepper *st, int seq, const int32_t *prompt, int n_prompt, const g4_generate_params *p);
/* A run of a prompt's positions fed as embeddings (image or audio soft tokens) instead of their
 * tokens: g4_batch_row.embd rows. */
typedef struct {
    int at;            /* the prompt position of its first row */
    int n;             /* its rows */
    const float *embd; /* n x g4_model_hidden_size floats */
} g4_embd_span;
/* g4_stepper_add with a prompt of tokens and embedding spans: the prompt's tokens at a span's
 * positions stay its history (the placeholders a repetition penalty sees, e.g. the image soft
 * token's id) while the span's rows are fed. Fails, before anything is fed, as g4_stepper_add does
 * and on a span that is empty, outside the prompt, overlapping another or not finite. The
 * embeddings are copied. A fork (g4_stepper_add_fork) of it feeds the same embeddings. */
int g4_stepper_add_embd(g4_stepper *st, int seq, const int32_t *prompt, int n_prompt, const g4_embd_span *spans, int n_spans,
                        const g4_generate_params *p);
/* Starts a generation in seq on the prompt of sequence `from`'s (added before and not yet
 * generating: n sequences of one prompt, OpenAI's n): the prompt is computed once. Once `from`
 * has fed all but its prompt's last token, seq's cache becomes a copy of from's up to there
 * (g4_session_copy_seq) and seq feeds that last token itself; its own settings p (seed,
 * sampling, budget). It gives exactly the tokens g4_stepper_add with from's prompt and cache
 * would. */
int g4_stepper_add_fork(g4_stepper *st, int seq, int from, const g4_generate_params *p);
/* One step (above). out: room for g4_stepper_max_tokens entries (a token of every sequence feeding
 * a prompt or generating; a drafting round's tokens, in order); returns how many it wrote (a
 * sequence whose prompt is not in yet writes none), or -1. */
int g4_stepper_step(g4_stepper *st, g4_step_token *out);
/* Stops sequence seq where it stands, with G4_STOP_USER; its cache keeps what was fed. 1 if it
 * was feeding a prompt or generating, 0 if not, -1 when there is no such sequence. */
int g4_stepper_cancel(g4_stepper *st, int seq);
/* As g4_stepper_cancel, keeping only the first n_keep tokens sequence seq generated (a drafting
 * round reports several at once; a caller that stops at one of them drops the rest): the cache
 * is rolled back to hold every kept token but the last, as if generation had stopped there. */
int g4_stepper_cancel_at(g4_stepper *st, int seq, int n_keep);
g4_seq_state g4_stepper_state(const g4_stepper *st, int seq);
/* The number of sequences feeding a prompt or generating. */
int g4_stepper_active(const g4_stepper *st);
/* Sequence seq's generation so far (stop: once finished), and the tokens it generated (*n),
 * valid until the next g4_stepper_add on seq. As with g4_generate, the last generated token is
 * not fed back. */
int g4_stepper_result(const g4_stepper *st, int seq, g4_generate_result *r);
const int32_t *g4_stepper_tokens(const g4_stepper *st, int seq, int *n);
void g4_stepper_get_stats(const g4_stepper *st, g4_stepper_stats *stats);
/* Room g4_stepper_step's `out` needs: every sequence's tokens of one step (up to draft_tokens + 1
 * each when drafting). */
int g4_stepper_max_tokens(const g4_stepper *st);
/* Speculative decoding's totals over the stepper's life: rounds run, tokens drafted, drafted
 * tokens the target accepted. */
void g4_stepper_draft_stats(const g4_stepper *st, long *rounds, long *drafted, long *accepted);
/* The log-probabilities of the token sequence seq generated last (g4_generate_params.logprobs),
 * valid until the next step: read them after each g4_stepper_step for each of its tokens. -1
 * when the generation does not record them or has generated nothing. */
int g4_stepper_logprobs(const g4_stepper *st, int seq, g4_logprobs *out);
/* The grammar state of sequence seq's constrained generation (g4_generate_params.constraint) as
 * its tokens left it, NULL without one; valid until the next g4_stepper_add on seq. A caller keeps
 * its mask cache warm for the next request with g4_grammar_state_keep_cache. */
const struct g4_grammar_state *g4_stepper_constraint(const g4_stepper *st, int seq);

/* Called with each generated token (a stop id included); return non-zero to stop. */
typedef int (*g4_token_fn)(void *user, int32_t token);

/* One generation in sequence 0, through a stepper: feeds `prompt` at the session's current
 * position (the KV cache keeps earlier turns), then generates. Fails, before computing anything,
 * when the prompt does not fit the context; fails with the stepper's message (result->stop
 * G4_STOP_ERROR) when the model's output turns non-finite. The last generated token (e.g. the stop id) is not
 * fed back: the session's position is n_prompt + n_generated - 1 past where it was, and a
 * follow-up turn starts with that token. */
int g4_generate(g4_session *s, const int32_t *prompt, int n_prompt, const g4_generate_params *params, g4_token_fn on_token,
                void *user, g4_generate_result *result);
const char *g4_stop_reason_name(g4_stop_reason r);

/* ---- The reply reader: a generation's tokens into the text they release ------------------------
 *
 * The one place that decides what text a generated token releases; the conversation, g4 serve,
 * the CLI and the Python package all read their replies through it. Tokens go in one at a time;
 * each push gives a g4_reply_delta:
 *  - text: the bytes the streaming detokenizer made final (whole UTF-8 characters: a character
 *    split across byte tokens is held back until it is whole; special tokens as their literal
 *    text). It is the reply as the model wrote it, what its sequence holds: stop strings do not
 *    cut it.
 *  - spans: the reply split into answer, thought and tool-call spans (g4_span; g4_chat_parse_reply's
 *    rules), after the stop strings: answer text that may still begin a stop string is held back
 *    (across tokens, however the string is split), and at the first stop string the answer is cut
 *    before it and the reply ends. Stop strings read the answer only (as OpenAI's and vLLM's chat
 *    servers do with reasoning): a stop string inside a thought or a tool call does not stop the
 *    reply (unless the call, held whole, fails to parse and so becomes answer text). Among stop strings the one that starts first wins (of two starting
 *    at one place, the shorter is complete first: "ab" stops before "abc" can).
 *  - calls: the tool calls this token completed ("<|tool_call>call:NAME{ARGS}<tool_call|>"), with
 *    arguments as JSON (g4_tool_call_parse's), whatever the calls mode but G4_CALLS_TEXT.
 *  - ended: the token is an end id (it adds no text; a generation that ignores it goes on, and
 *    so does the reader), or a stop string ended the reply (what is pushed after adds nothing).
 * g4_reply_finish releases what is held back (an incomplete marker, stop-string prefix or tool
 * call is text after all) and gives the finish reason. */
typedef enum {
    G4_FINISH_NONE = 0,       /* the reply goes on */
    G4_FINISH_STOP = 1,       /* a stop string matched, an end id, or the caller stopped it */
    G4_FINISH_LENGTH = 2,     /* the budget or the context ran out (G4_STOP_BUDGET, G4_STOP_CONTEXT) */
    G4_FINISH_TOOL_CALLS = 3, /* it stopped by itself after completing tool calls */
} g4_finish;

/* How tool-call spans are read. */
typedef enum {
    G4_CALLS_STREAM = 0, /* tool-call text streams as G4_SPAN_TOOL_CALL spans as it comes (the conversation's) */
    G4_CALLS_WHOLE = 1,  /* a tool call is held until it closes: then its whole text is one G4_SPAN_TOOL_CALL span and a
                            call, or, when it does not parse (or never closes), answer text (g4 serve's, with tools) */
    G4_CALLS_TEXT = 2,   /* "<|tool_call>" is answer text, stop strings read it too (g4 run, Python's generate) */
} g4_calls_mode;

typedef struct {
    const char *const *stop; /* stop strings, copied: non-empty UTF-8 */
    int n_stop;
    const int *end_ids; /* tokens that end the turn and add no text (copied; e.g. g4_model_stop_ids) */
    int n_end_ids;
    int starts_in_thought; /* the prompt ended inside a thought ("<|channel>thought\n") */
    g4_calls_mode calls;
    int raw;               /* no spans: all text is answer text, markers included (a completion of a raw prompt) */
    const char *prefix;    /* the reply's start that the prompt already holds (a forced call's "<|tool_call>call:NAME{"),
                              or NULL: read as the reply's first text, never released; a call it opens completes with
                              what follows */
    int max_calls;         /* 0, or the reply ends at its max_calls-th completed tool call (OpenAI's
                              parallel_tool_calls false: 1): push returns 1 as at a stop string, nothing after
                              is read, the finish is G4_FINISH_TOOL_CALLS */
} g4_reply_options;

/* What one token (or the finish) released. Pointers are valid until the next call on the reader. */
typedef struct {
    int32_t token;             /* the token pushed (an end id included); -1 for the finish */
    const char *text;          /* the decoded text that became final (above); an end id adds none */
    size_t len;
    const g4_span_text *spans; /* the answer, thought and tool-call text that became final, in order */
    int n_spans;
    const g4_tool_call *calls; /* the tool calls completed here: name, arguments as JSON text */
    int n_calls;
    int ended;                 /* this token is an end id, or a stop string ended the reply here or before */
    int stop_string;           /* the index of the stop string that matched, or -1 */
    g4_finish finish;          /* the finish's: why the reply ended; G4_FINISH_NONE before */
} g4_reply_delta;

typedef struct g4_reply g4_reply;
/* Fails on an empty or non-UTF-8 stop string, NULL arrays with counts, or raw with a calls mode
 * other than G4_CALLS_TEXT or a prefix. The tokenizer must outlive the reader. */
g4_reply *g4_reply_new(const g4_tokenizer *tok, const g4_reply_options *o);
void g4_reply_free(g4_reply *r);
/* One generated token. 1 when a stop string or the last call allowed (max_calls) has ended the reply
 * (stop the generation: the stepper stops at end ids by itself, at these only when told), 0 when it
 * goes on, -1 on failure. */
int g4_reply_push_token(g4_reply *r, int32_t token, g4_reply_delta *d);
/* The end of the generation, which stopped for why: releases what is held back and sets d->finish:
 * STOP after a stop string; LENGTH for G4_STOP_BUDGET and G4_STOP_CONTEXT; else TOOL_CALLS when
 * the reply completed a call, else STOP. Once only. */
int g4_reply_finish(g4_reply *r, g4_stop_reason why, g4_reply_delta *d);

/* ---- Conversation: chat messages over one session sequence, continued turn by turn ---------------
 *
 * A conversation lives in one sequence of a session (emptied at its creation and reset) and renders
 * its messages with the chat template (above). Each g4_conversation_reply feeds only what the
 * sequence does not hold yet: the end of the last reply (its last token, never fed back, and the
 * turn's closing), the messages added since and the generation prompt; the earlier turns stay in
 * the KV cache. It generates through the generation stepper (as g4_generate does) and streams the
 * reply: the text that became final (whole UTF-8 characters, from the streaming detokenizer) and
 * the same text split into thought, answer and tool-call spans (g4_span). A tool-calling turn:
 * declare the tools in the options, reply, read the calls (g4_conversation_reply_parse), add one
 * G4_CHAT_TOOL message per call, reply again (the model goes on in its turn).
 *
 * The sequence keeps each reply as the model wrote it, thoughts included, where the template would
 * strip them from a history rendered anew (and put a reply's tool calls before its text, and drop
 * the 26B form's empty thought): in the E2B form with thinking off, for replies that encode back to
 * their own tokens, continuing gives the very tokens of rendering the whole history from scratch
 * (g4_conversation_messages); otherwise the two differ where the template rewrites the history. A conversation may instead be one of raw
 * tokens (g4_conversation_add_tokens: a prompt rendered elsewhere), fed as they are, with no template.
 * Errors leave a one-line message in g4_last_error(). */
/* Media parts (an image, an audio clip) in a chat prompt. The template writes a placeholder
 * (<|image|>, <|audio|>) where a message's media part stands, the parts before the message's text
 * in the order given; the processor expands each into its begin marker, n soft-token placeholders
 * and its end marker (<|image> + n x <|image|> + <image|>; <|audio> + n x <|audio|> + <audio|>),
 * and the soft tokens (g4_image_soft_tokens, g4_audio_soft_tokens) are fed at the placeholders as
 * embedding rows (g4_batch_row.embd). */
typedef enum { G4_MEDIA_IMAGE = 0, G4_MEDIA_AUDIO = 1 } g4_media_kind;
/* A media kind's begin marker, soft-token placeholder and end marker ids in tok (its special
 * tokens of those names). Fails, naming the token, when the tokenizer lacks one. */
int g4_media_marker_ids(const g4_tokenizer *tok, g4_media_kind kind, int32_t ids[3]);
/* A media part of message msgs[msg]: a message's parts come before its text, in order, as the
 * template renders a content list of media parts then text. */
typedef struct {
    size_t msg;
    g4_media_kind kind;
    int n; /* soft tokens */
} g4_chat_media;
/* g4_chat_encode with media parts: each renders as the processor expands the template's
 * placeholder (<|image|>, <|audio|>): its begin marker, n placeholders, its end marker
 * (g4_media_marker_ids). resume 0 encodes the whole prompt; resume k > 0 starts where a generated
 * reply stopped, msgs[k - 1] being a model message whose turn opening and text the sequence
 * already holds (what comes out starts with that message's closing). *opens_thought (may be
 * NULL): the generation prompt ends inside a thought ("<|channel>thought\n"). */
int g4_chat_encode_media(const g4_tokenizer *tok, const g4_chat_message *msgs, size_t n, size_t resume, const g4_chat_options *opt,
                         const g4_chat_media *media, size_t n_media, int32_t **ids, size_t *n_ids, int *opens_thought);

typedef struct g4_conversation g4_conversation;

typedef struct {
    int seq;                /* the session sequence it lives in */
    g4_chat_options chat;   /* form, thinking, tool declarations (borrowed: they must outlive the conversation);
                               add_bos and add_generation_prompt are the conversation's to set */
    g4_generate_params gen; /* every reply's budget, sampling (the generator starts from the seed at each reply) and
                               stop ids (copied; the logit bias is not: it must outlive the conversation) */
    const char *const *stop; /* stop strings (copied; g4_reply_options.stop): a reply's answer ends before the first, its
                                generation stops there (G4_STOP_USER); the reply's text and message keep what the
                                sequence holds */
    int n_stop;
    g4_calls_mode calls;     /* how the deltas' spans read tool calls (default G4_CALLS_STREAM) */
} g4_conversation_options;

/* Sequence 0; the model's chat form (g4_model_chat_form), thinking off, no tools; the model's
 * sampling defaults and a budget of the whole context. */
int g4_conversation_default_options(const g4_session *s, g4_conversation_options *o);

/* Fails on a sequence the session lacks or invalid chat options. The session and the tokenizer
 * must outlive the conversation, and nothing else may use its sequence meanwhile. */
g4_conversation *g4_conversation_new(g4_session *s, const g4_tokenizer *tok, const g4_conversation_options *o);
void g4_conversation_free(g4_conversation *c);
/* Starts over: no messages, the sequence emptied. chat: the template options from now on (e.g.
 * thinking switched), NULL keeps them. */
int g4_conversation_reset(g4_conversation *c, const g4_chat_options *chat);

/* Adds a message (copied) for the next reply. Fails, adding nothing, on an unknown role, content
 * that is not valid UTF-8, a tool message that answers no call of the model message before it, or
 * a conversation of raw tokens. */
int g4_conversation_add(g4_conversation *c, g4_chat_role role, const char *content);
/* A media part of the next user message (g4_conversation_add with G4_CHAT_USER): n soft tokens,
 * n x g4_model_hidden_size floats, copied. Parts go before that message's text, in the order
 * added; each reply feeds them as embedding rows at their placeholders. Fails on a conversation
 * of raw tokens, a tokenizer without the markers (g4_media_marker_ids), n < 1 or a value that is
 * not finite. Adding a message of another role while parts wait fails. */
int g4_conversation_add_media(g4_conversation *c, g4_media_kind kind, const float *embd, int n);
/* The embedding spans of g4_conversation_prompt's ids (valid as long as those are). */
int g4_conversation_prompt_spans(g4_conversation *c, const g4_embd_span **spans, int *n);
/* Adds tokens to feed as they are before the next reply; the conversation is then one of raw
 * tokens (no messages, no template) until reset. Fails on a conversation with messages. */
int g4_conversation_add_tokens(g4_conversation *c, const int32_t *ids, size_t n);
/* Drops what was added since the last reply (nothing of it was fed), e.g. after a failed reply. */
void g4_conversation_discard(g4_conversation *c);
/* The tokens the next reply feeds (above). Valid until the next call on c. */
int g4_conversation_prompt(g4_conversation *c, const int32_t **ids, size_t *n);

/* (g4_reply_delta, one token of a reply as it streams, is the reply reader's, above.) */
/* Return non-zero to stop the reply there (G4_STOP_USER); the last delta's return is not read. */
typedef int (*g4_reply_fn)(void *user, const g4_reply_delta *d);

/* Feeds g4_conversation_prompt's tokens and generates the reply, calling on_delta (may be NULL)
 * for every generated token, then once with token -1. The reply joins the conversation as a model
 * message (after the thought the prompt opened, if any). With nothing added since the last reply
 * the model goes on where it stopped (e.g. after its budget ran out): the new reply continues the
 * turn. Fails before feeding anything, the new messages kept, when there is nothing to reply to
 * (no message yet) or the prompt does not fit the context that is left. */
int g4_conversation_reply(g4_conversation *c, g4_reply_fn on_delta, void *user, g4_generate_result *res);
/* The same reply for a caller that drives a generation stepper of its own (other sequences
 * beside it): g4_conversation_begin gives the tokens and embedding spans to feed in the
 * conversation's sequence (valid until the next call on c), generated with the options' gen
 * (g4_stepper_add_embd). Each generated token goes to g4_conversation_push (the reader's delta;
 * 1 when a stop string ended the reply: stop the sequence there, g4_stepper_cancel_at keeping
 * the tokens pushed when a drafting round gave more), then g4_conversation_end
 * with the generation's result, or NULL when it failed, releases what is held back (the last
 * delta) and makes the reply the model's message. g4_conversation_end returns 1, changing
 * nothing, for a generation cancelled before its first token (its prompt is still to come: the
 * sequence is truncated back). g4_conversation_reply is this loop over g4_generate. */
int g4_conversation_begin(g4_conversation *c, const int32_t **ids, size_t *n, const g4_embd_span **spans, int *n_spans);
int g4_conversation_push(g4_conversation *c, int32_t token, g4_reply_delta *d);
int g4_conversation_end(g4_conversation *c, const g4_generate_result *res, g4_reply_delta *d);
/* The last reply: its tokens (a stop id included); its text (the deltas' text joined); its spans
 * (answer, thinking, tool calls: free with g4_chat_reply_free). */
const int32_t *g4_conversation_reply_tokens(const g4_conversation *c, int *n);
const char *g4_conversation_reply_text(const g4_conversation *c, size_t *len);
int g4_conversation_reply_parse(const g4_conversation *c, g4_chat_reply *r);
/* The messages so far, replies included: what g4_chat_render renders anew. Valid until the next
 * call on c. */
void g4_conversation_messages(const g4_conversation *c, const g4_chat_message **msgs, size_t *n);
/* Every token of the conversation in order: what its sequence holds, then the last reply's last
 * token, which the next reply feeds first. */
const int32_t *g4_conversation_tokens(const g4_conversation *c, size_t *n);

/* ---- Structured output: grammars, JSON schema, regex, choice (README "Structured output") ------ */

/* A compiled grammar: immutable, shareable between threads and states. The dialect is llama.cpp's
 * GBNF (rules `name ::= ...`, the start rule `root`, "literals" with \n \r \t \\ \" \xHH \uHHHH
 * \UHHHHHHHH escapes, [classes] with ranges and ^, `.`, ( ), |, * + ? {m} {m,} {m,n}, # comments,
 * <[ID]> one special token by id).
 * It is matched byte by byte over UTF-8: a class or `.` matches one whole valid UTF-8 character.
 * Refused, with the line and column: syntax errors, undefined rules, left recursion (a rule that
 * can reach itself without consuming a byte, `(x?)*` included), repetition counts over 10000, more
 * than 1 MiB of text or 4M grammar elements. Returns NULL on error (g4_last_error()). */
typedef struct g4_grammar g4_grammar;
g4_grammar *g4_grammar_compile(const char *gbnf, size_t len);
/* A JSON schema (draft 2020-12 subset, README) compiled to a grammar for one JSON value. Every
 * keyword the compiler cannot enforce is refused by name with its JSON pointer. */
g4_grammar *g4_grammar_from_json_schema(const char *schema, size_t len);
/* The GBNF text a JSON schema compiles to (malloc'd, NUL-terminated; free it): for inspection. */
char *g4_grammar_json_schema_to_gbnf(const char *schema, size_t len);
/* JSON mode: any JSON object (objects_only) or any JSON value, with bounded whitespace. */
g4_grammar *g4_grammar_json(int objects_only);
/* A regular expression (the README's subset), matched whole (as if anchored at both ends). */
g4_grammar *g4_grammar_from_regex(const char *regex, size_t len);
/* Exactly one of n strings. */
g4_grammar *g4_grammar_from_choice(const char *const *choices, size_t n);
void g4_grammar_free(g4_grammar *g);

/* Where a recognizer stands: the set of parse stacks after the bytes accepted so far. A state is
 * used by one thread at a time. */
typedef struct g4_grammar_state g4_grammar_state;
g4_grammar_state *g4_grammar_start(const g4_grammar *g);
g4_grammar_state *g4_grammar_state_copy(const g4_grammar_state *st);
void g4_grammar_state_free(g4_grammar_state *st);
/* 0 when the grammar accepts bytes[0, n) after what it accepted so far (the state advances); -1
 * when it rejects them (the state is unchanged; g4_last_error() says so, and names the limit when
 * an ambiguous grammar needs more than 4096 parse stacks or 1024 nested rules). */
int g4_grammar_accept_bytes(g4_grammar_state *st, const void *bytes, size_t n);
/* 1 when the grammar can end here; 1 when some byte can follow. */
int g4_grammar_is_complete(const g4_grammar_state *st);
int g4_grammar_can_continue(const g4_grammar_state *st);

/* A tokenizer's tokens as byte strings in a trie, for token masks (byte-fallback <0xNN> tokens as
 * their byte; special tokens only where a grammar names them, <[ID]>). Immutable; one per tokenizer. */
typedef struct g4_grammar_vocab g4_grammar_vocab;
g4_grammar_vocab *g4_grammar_vocab_new(const g4_tokenizer *tok);
void g4_grammar_vocab_free(g4_grammar_vocab *v);
size_t g4_grammar_vocab_size(const g4_grammar_vocab *v);
/* The bytes a token stands for (a special token: 0xFF and its id in 3 bytes, the mark <[ID]>
 * matches; n = 0 for <0xFF>, whose byte no UTF-8 text holds). */
const unsigned char *g4_grammar_vocab_token(const g4_grammar_vocab *v, int32_t id, size_t *n);
/* Sets bit id of mask (words of 32 bits, (vocab size + 31) / 32 of them, all rewritten) for every
 * token whose bytes the state accepts, and the bits of stop_ids[0, n_stop) when the grammar is
 * complete. Returns the number of allowed tokens, or -1 on error. The state is not advanced. */
long g4_grammar_mask(const g4_grammar_vocab *v, g4_grammar_state *st, const int32_t *stop_ids, size_t n_stop,
                     uint32_t *mask);
/* Advances the state by a token's bytes: 0, or -1 when the grammar rejects them. */
int g4_grammar_accept_token(const g4_grammar_vocab *v, g4_grammar_state *st, int32_t id);
/* Warm state: into takes (shares) the token-mask cache of from, a state of the same grammar that
 * started as a copy of into (g4_grammar_state_copy) and walked further: the whole-vocabulary walks
 * from's masks paid are then free to every later copy of into. 0, or -1 (another grammar). */
int g4_grammar_state_keep_cache(g4_grammar_state *into, const g4_grammar_state *from);
/* The grammar a state runs. */
const g4_grammar *g4_grammar_state_grammar(const g4_grammar_state *st);

/* Warm state for front ends (the server, the CLI, Python): a tokenizer's trie built once, and the
 * grammars asked for by text compiled once and kept (up to max_entries, the least recently used
 * dropped) with a start state whose mask cache every finished generation warms, so a request that
 * repeats a schema pays neither the compile nor the whole-vocabulary walks of its first masks.
 * Thread-safe. */
typedef enum {
    G4_CONSTRAINT_GBNF = 0,        /* text: a grammar (g4_grammar_compile) */
    G4_CONSTRAINT_JSON_SCHEMA = 1, /* text: a JSON schema (g4_grammar_from_json_schema) */
    G4_CONSTRAINT_JSON_OBJECT = 2, /* JSON mode: any JSON object (text ignored) */
    G4_CONSTRAINT_REGEX = 3,       /* text: a regular expression (g4_grammar_from_regex) */
} g4_constraint_kind;
typedef struct g4_grammar_cache g4_grammar_cache;
/* NULL on error (out of memory, max_entries < 1). Builds the trie (0.4-1.4 s for Gemma's 262k tokens). */
g4_grammar_cache *g4_grammar_cache_new(const g4_tokenizer *tok, int max_entries);
void g4_grammar_cache_free(g4_grammar_cache *c);
const g4_grammar_vocab *g4_grammar_cache_vocab(const g4_grammar_cache *c);
/* A new start state (the caller's) of the grammar text compiles to as `kind`, sharing the entry's
 * warm mask cache; NULL with the compiler's error. Each state it returns must be handed back with
 * g4_grammar_cache_done (its grammar stays alive until then). */
g4_grammar_state *g4_grammar_cache_start(g4_grammar_cache *c, g4_constraint_kind kind, const char *text, size_t len);
/* Hands back a state from g4_grammar_cache_start (freed here); `done`, when not NULL, a state of
 * the same grammar after a generation (g4_stepper_constraint), gives the entry its mask cache. */
void g4_grammar_cache_done(g4_grammar_cache *c, g4_grammar_state *started, const g4_grammar_state *done);
/* Entries held, compiles and hits so far. */
void g4_grammar_cache_stats(const g4_grammar_cache *c, int *entries, long *compiles, long *hits);
/* A tool call constrained (tool_choice "required" or a named function): the GBNF text of what
 * follows "<|tool_call>call:" in Gemma 4's tool syntax, a function's name then its arguments
 * keeping to its "parameters" JSON schema and "<tool_call|>", for any function of tools_json (an
 * OpenAI "tools" array), or, name given, of what follows "<|tool_call>call:NAME" for that function
 * only. Its strings are <[ID]> token references to the tokenizer's <|"|> (the GBNF dialect's
 * extension: a special token by id, reachable by no text); keys bare in the template's order; no
 * whitespace; only the declared properties; no '<' inside strings. malloc'd; NULL on error
 * (g4_last_error()), *bad_tool the index of the tool whose schema the compiler refused, or -1. */
char *g4_tool_call_gbnf(const g4_tokenizer *tok, const char *tools_json, size_t len, const char *name, int *bad_tool);
/* tool_choice "auto" with functions marked "strict": true: the GBNF text of a whole reply, any
 * text, then calls (each "<|tool_call>call:NAME{...}<tool_call|>", one after another) of declared
 * functions only, a strict function's arguments keeping to its schema (as above), another's any
 * arguments. NULL on error, or when no function is strict. */
char *g4_tool_reply_gbnf(const g4_tokenizer *tok, const char *tools_json, size_t len, int *bad_tool);

/* ---- media: image input (issue 35) ----------------------------------------------------------- */
/* An image's soft tokens: `bytes` of a PNG or JPEG file through the Gemma 4 image processor
 * (RGB, antialiased bicubic resize to sides that are multiples of 48 within max_soft_tokens x 9
 * patches, /255) and the model's vision tower + embed_vision, in o's activation mode (float,
 * fake, int) on the current kernel level. On success *embd is malloc'd n_tokens x
 * g4_model_hidden_size(m) floats (free() them): rows for g4_batch_row.embd, not scaled by
 * sqrt(d). max_soft_tokens: 70, 140, 280, 560 or 1120; <= 0 means the model's default
 * (processor_config.json, else 280). The tower is bound on the first call (a text-only run
 * never loads it). Returns 0, or -1 with g4_last_error() set (one line: a bad file, an image
 * over the size bounds, a model without vision_config, a tensor that does not match). */
int g4_image_soft_tokens(const g4_model *m, const g4_options *o, const void *bytes, size_t len, int max_soft_tokens, float **embd,
                         int *n_tokens);

/* ---- media: audio input (issue 35) ----------------------------------------------------------- */
/* An audio clip's soft tokens: `bytes` of a WAV file (PCM 8/16/24/32-bit or float, any rate and
 * channel count, at most 30 s) down-mixed and resampled to 16 kHz mono, Gemma 4's log-mel
 * features, then the model's audio tower (conformer) + embed_audio, in o's activation mode
 * (float, fake, int) on the current kernel level: about 25 tokens per second of audio. Same
 * conventions as g4_image_soft_tokens: *embd is malloc'd n_tokens x g4_model_hidden_size(m)
 * floats (free() them), rows for g4_batch_row.embd, not scaled by sqrt(d); the tower is bound on
 * the first call. Returns 0, or -1 with g4_last_error() set (one line: a bad WAV, audio over
 * 30 s, a model without audio_config, a tensor that does not match). */
int g4_audio_soft_tokens(const g4_model *m, const g4_options *o, const void *bytes, size_t len, float **embd, int *n_tokens);

/* ---- a checkpoint folder opened whole (issue 34) --------------------------------------------- */
/* What a front end opens from a checkpoint folder DIR: the model, its tokenizer (DIR/tokenizer.json)
 * and, when asked, an MTP drafter folder made for it. The caller owns the three handles: it may
 * take them one by one (each freed by its own _free) or free them at once with
 * g4_checkpoint_close. */
typedef struct {
    g4_model *model;
    g4_tokenizer *tok;
    g4_draft *draft; /* NULL without draft_dir */
} g4_checkpoint;
/* Opens dir with o's threads and weight placement (g4_model_load_options; o NULL: g4_model_load)
 * and draft_dir (NULL: none) as a drafter for it (g4_draft_load). Returns 0, or -1 with the
 * failing file's message in g4_last_error() and nothing left open (*c zeroed). */
int g4_checkpoint_open(g4_checkpoint *c, const char *dir, const g4_options *o, const char *draft_dir);
/* Frees what *c holds (any of it may be NULL) and zeroes it. */
void g4_checkpoint_close(g4_checkpoint *c);

#ifdef __cplusplus
}
#endif
#endif
