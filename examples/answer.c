/* answer: load a Gemma 4 checkpoint, render one question with its chat template, and stream the
 * greedy answer to standard output. Built against the installed library:
 *
 *   cc -o answer examples/answer.c $(pkg-config --cflags --libs g4)
 *   ./answer models/gemma4-tiny-math "$(cat models/gemma4-tiny-math/example_prompt.txt)"
 */
#include <g4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    g4_detokenizer *detok;
    const g4_tokenizer *tok;
} stream;

/* Prints each token's text as soon as it is whole UTF-8; control tokens (the stop id) are not text. */
static int print_token(void *user, int32_t token) {
    stream *st = user;
    if (g4_tokenizer_is_special(st->tok, token)) return 0;
    const char *bytes;
    size_t len;
    if (g4_detokenizer_push(st->detok, token, &bytes, &len) != 0) return 1;
    fwrite(bytes, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL_DIR QUESTION\n", argv[0]);
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", argv[1]);
    g4_model *model = g4_model_load(argv[1]);
    g4_tokenizer *tok = model ? g4_tokenizer_load(path) : NULL;
    if (!tok) {
        fprintf(stderr, "answer: %s\n", g4_last_error());
        g4_model_free(model);
        return 1;
    }

    g4_chat_message question = {G4_CHAT_USER, argv[2]};
    g4_chat_options chat = g4_chat_default_options();
    int32_t *ids = NULL;
    size_t n_ids = 0;
    g4_options opt;
    g4_options_default(&opt); /* true int8 linears, int8 KV cache: the checkpoint as LiteRT runs it */
    opt.ctx = 1024;
    g4_session *s = NULL;
    stream st = {g4_detokenizer_new(tok), tok};
    int rc = 1;
    if (g4_chat_encode(tok, &question, 1, &chat, &ids, &n_ids) == 0 && (s = g4_session_new(model, &opt)) && st.detok) {
        g4_generate_params params = {.max_tokens = 256};
        g4_sampling_default(&params.sampling); /* greedy */
        g4_generate_result res;
        if (g4_generate(s, ids, (int)n_ids, &params, print_token, &st, &res) == 0) {
            const char *bytes;
            size_t len;
            if (g4_detokenizer_flush(st.detok, &bytes, &len) == 0) fwrite(bytes, 1, len, stdout);
            printf("\n");
            fprintf(stderr, "answer: %d prompt tokens, %d generated, stop: %s\n", res.n_prompt, res.n_generated,
                    g4_stop_reason_name(res.stop));
            rc = 0;
        }
    }
    if (rc) fprintf(stderr, "answer: %s\n", g4_last_error());
    g4_detokenizer_free(st.detok);
    g4_session_free(s);
    free(ids);
    g4_tokenizer_free(tok);
    g4_model_free(model);
    return rc;
}
