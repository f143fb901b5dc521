/* g4_checkpoint_open: the model, tokenizer and optional drafter of a checkpoint folder, the
 * opening every front end (g4 run/chat, serve, eval, Python) did by hand. */
#include <string.h>

#include "g4.h"
#include "util/file.h"

int g4_checkpoint_open(g4_checkpoint *c, const char *dir, const g4_options *o, const char *draft_dir) {
    char path[4096];
    memset(c, 0, sizeof *c);
    if (!(c->model = o ? g4_model_load_options(dir, o) : g4_model_load(dir))) return -1;
    if (g4_path_join(path, sizeof path, dir, "tokenizer.json") != 0 || !(c->tok = g4_tokenizer_load(path)) ||
        (draft_dir && !(c->draft = g4_draft_load(draft_dir, c->model)))) {
        g4_checkpoint_close(c);
        return -1;
    }
    return 0;
}

void g4_checkpoint_close(g4_checkpoint *c) {
    g4_draft_free(c->draft);
    g4_tokenizer_free(c->tok);
    g4_model_free(c->model);
    memset(c, 0, sizeof *c);
}
