/* Images on the command line (issue 35), driven as a user would over the tiny-mobile fixture (its
 * vision tower) with a tokenizer that has the media markers:
 *  - `g4 run --image A --image B -p TEXT` feeds the template's prompt (the parts first, in order)
 *    and answers with the ids the library gives for the same soft tokens through g4_conversation;
 *  - --image-tokens sets the budget (the placeholders are the library's count for that budget);
 *  - `g4 chat` with `/image PATH` answers as `g4 run --image PATH` does, and a bad /image is one
 *    line that leaves the chat going;
 *  - bad files, a bad budget, --raw with an image and a model without a vision tower are refused
 *    with one line naming the file or flag, exit status 1. */
#define _XOPEN_SOURCE 700
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"
#include "cli_util.h"

#pragma GCC diagnostic ignored "-Wformat-truncation"

#define VDIR "tests/fixtures/vision"
#define MATH_MODEL "models/gemma4-tiny-math"
#define PROMPT "What is in the image?"
enum { N_GEN = 6, MODEL_VOCAB = 512, FIRST_MARKER = MODEL_VOCAB - 6 };

static const char *bin;
static char tmp[256], model[600], audio_model[600]; /* audio_model: tests/fixtures/audio/tower's weights (tiny-mobile's audio tower is not one g4 takes) */

/* The math model's tokenizer cut to the tiny-mobile vocabulary: ids below FIRST_MARKER (the byte
 * tokens among them, so any text encodes) and the merges among those, then the six media markers
 * at FIRST_MARKER..511 as special tokens. */
static void write_media_tokenizer(const char *path) {
    static const char *const markers[6] = {"<|image>", "<|image|>", "<image|>", "<|audio>", "<|audio|>", "<audio|>"};
    cJSON *t = read_json(MATH_MODEL "/tokenizer.json");
    cJSON *mdl = cJSON_GetObjectItem(t, "model"), *vocab = cJSON_GetObjectItem(mdl, "vocab"), *merges = cJSON_GetObjectItem(mdl, "merges");
    cJSON *kept = cJSON_CreateObject();
    for (cJSON *v = vocab->child; v; v = v->next)
        if (v->valueint < FIRST_MARKER) cJSON_AddNumberToObject(kept, v->string, v->valueint);
    cJSON *kept_merges = cJSON_CreateArray();
    for (cJSON *m = merges->child; m; m = m->next) {
        const char *a = cJSON_GetArrayItem(m, 0)->valuestring, *b = cJSON_GetArrayItem(m, 1)->valuestring;
        char ab[256];
        snprintf(ab, sizeof ab, "%s%s", a, b);
        if (cJSON_GetObjectItemCaseSensitive(kept, a) && cJSON_GetObjectItemCaseSensitive(kept, b) && cJSON_GetObjectItemCaseSensitive(kept, ab))
            cJSON_AddItemToArray(kept_merges, cJSON_Duplicate(m, 1));
    }
    cJSON *added = cJSON_GetObjectItem(t, "added_tokens");
    for (int k = 0; k < 6; k++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", FIRST_MARKER + k);
        cJSON_AddStringToObject(a, "content", markers[k]);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
        cJSON_AddNumberToObject(kept, markers[k], FIRST_MARKER + k);
    }
    cJSON_ReplaceItemInObject(mdl, "vocab", kept);
    cJSON_ReplaceItemInObject(mdl, "merges", kept_merges);
    char *text = cJSON_PrintUnformatted(t);
    write_file_or_exit(path, text, strlen(text));
    free(text);
    cJSON_Delete(t);
}

/* The ids after "g4: <what>:" on the nth such line (0-based) of text; their count, -1 if none. */
static int ids_line(const char *text, const char *what, int nth, int32_t *ids, int cap) {
    char key[64];
    snprintf(key, sizeof key, "g4: %s:", what);
    const char *p = text;
    for (int i = 0; i <= nth; i++) {
        if (!(p = strstr(p, key))) return -1;
        if (i < nth) p += strlen(key);
    }
    p += strlen(key);
    int n = 0;
    while (*p && *p != '\n' && n < cap) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

typedef struct {
    int32_t prompt[4096], gen[64];
    int n_prompt, n_gen;
} ids_pair;

/* The library's greedy answer (the CLI's defaults, --temp 0, -n N_GEN) from the model at dir to a
 * user turn of the media files (kinds[i], NULL: all images; budget 0: the model's default) and
 * PROMPT, through g4_conversation. */
static void library_answer_kinds(const char *dir, const char *const *images, const g4_media_kind *kinds, int n_images, int budget, ids_pair *want) {
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    g4_options o;
    g4_options_default(&o);
    g4_model *m = g4_model_load(dir);
    g4_tokenizer *tok = g4_tokenizer_load_ex(path, G4_TOKENIZER_NO_CACHE);
    g4_session *s = m ? g4_session_new(m, &o) : NULL;
    CHECK(m && tok && s, "%s", g4_last_error());
    if (!s) exit(1);
    g4_conversation_options co;
    CHECK(g4_conversation_default_options(s, &co) == 0, "%s", g4_last_error());
    co.gen.sampling.temperature = 0;
    co.gen.max_tokens = N_GEN;
    g4_conversation *c = g4_conversation_new(s, tok, &co);
    CHECK(c != NULL, "%s", g4_last_error());
    for (int i = 0; i < n_images; i++) {
        char *data;
        size_t len;
        float *e = NULL;
        int n = 0;
        g4_media_kind kind = kinds ? kinds[i] : G4_MEDIA_IMAGE;
        CHECK(g4_read_file(images[i], &data, &len) == 0 &&
                  (kind == G4_MEDIA_IMAGE ? g4_image_soft_tokens(m, &o, data, len, budget, &e, &n) : g4_audio_soft_tokens(m, &o, data, len, &e, &n)) == 0,
              "%s: %s", images[i], g4_last_error());
        CHECK(g4_conversation_add_media(c, kind, e, n) == 0, "%s", g4_last_error());
        free(data);
        free(e);
    }
    CHECK(g4_conversation_add(c, G4_CHAT_USER, PROMPT) == 0, "%s", g4_last_error());
    const int32_t *ids;
    size_t n;
    CHECK(g4_conversation_prompt(c, &ids, &n) == 0 && n <= 4096, "%s", g4_last_error());
    want->n_prompt = (int)n;
    memcpy(want->prompt, ids, n * sizeof *ids);
    g4_generate_result r;
    CHECK(g4_conversation_reply(c, NULL, NULL, &r) == 0, "%s", g4_last_error());
    int ng;
    const int32_t *gen = g4_conversation_reply_tokens(c, &ng);
    want->n_gen = ng < 64 ? ng : 64;
    memcpy(want->gen, gen, (size_t)want->n_gen * sizeof *gen);
    g4_conversation_free(c);
    g4_session_free(s);
    g4_tokenizer_free(tok);
    g4_model_free(m);
}

static void library_answer(const char *const *images, int n_images, int budget, ids_pair *want) {
    library_answer_kinds(model, images, NULL, n_images, budget, want);
}

/* The prompt and generated ids of the nth turn of a --verbose stderr capture. */
static void cli_ids(const char *err, int nth, ids_pair *got) {
    got->n_prompt = ids_line(err, "prompt ids", nth, got->prompt, 4096);
    got->n_gen = ids_line(err, "generated ids", nth, got->gen, 64);
}

static int count_id(const ids_pair *p, int32_t id) {
    int n = 0;
    for (int i = 0; i < p->n_prompt; i++) n += p->prompt[i] == id;
    return n;
}

static void expect_same(const ids_pair *got, const ids_pair *want, const char *what) {
    CHECK(got->n_prompt == want->n_prompt && !memcmp(got->prompt, want->prompt, sizeof *got->prompt * (size_t)(got->n_prompt > 0 ? got->n_prompt : 0)),
          "%s: prompt of %d ids, the library's %d", what, got->n_prompt, want->n_prompt);
    CHECK(got->n_gen == want->n_gen && want->n_gen > 0 && !memcmp(got->gen, want->gen, sizeof *got->gen * (size_t)want->n_gen),
          "%s: %d generated ids (first %d), the library's %d (first %d)", what, got->n_gen, got->n_gen > 0 ? got->gen[0] : -1, want->n_gen,
          want->gen[0]);
}

static void test_run_images(void) {
    static ids_pair want, got;
    const char *imgs[2] = {VDIR "/rgb.png", VDIR "/photo.jpg"};
    char args[4096], out[700], err[700];
    snprintf(out, sizeof out, "%s/run.out", tmp);
    snprintf(err, sizeof err, "%s/run.err", tmp);
    library_answer(imgs, 2, 0, &want);
    snprintf(args, sizeof args, "run -m %s --image %s --image %s -p '" PROMPT "' -n %d --temp 0 --verbose", model, imgs[0], imgs[1], N_GEN);
    CHECK(run_into(bin, args, out, err) == 0, "run --image failed");
    char *e = slurp(err);
    cli_ids(e, 0, &got);
    free(e);
    expect_same(&got, &want, "run --image A --image B");
    CHECK(count_id(&got, FIRST_MARKER) == 2 && count_id(&got, FIRST_MARKER + 2) == 2 && count_id(&got, FIRST_MARKER + 1) > 2,
          "two images' markers: %d <|image>, %d <image|>, %d <|image|>", count_id(&got, FIRST_MARKER), count_id(&got, FIRST_MARKER + 2),
          count_id(&got, FIRST_MARKER + 1));
    printf("ok run --image x2: prompt of %d ids (%d soft tokens) and %d generated ids equal the library's\n", got.n_prompt, count_id(&got, FIRST_MARKER + 1),
           got.n_gen);

    /* the budget: the library's placeholder count at 70, fewer than at the default */
    int n_default = count_id(&got, FIRST_MARKER + 1);
    library_answer(imgs + 1, 1, 70, &want);
    snprintf(args, sizeof args, "run -m %s --image %s --image-tokens 70 -p '" PROMPT "' -n %d --temp 0 --verbose", model, imgs[1], N_GEN);
    CHECK(run_into(bin, args, out, err) == 0, "run --image-tokens 70 failed");
    e = slurp(err);
    cli_ids(e, 0, &got);
    free(e);
    expect_same(&got, &want, "run --image-tokens 70");
    CHECK(count_id(&got, FIRST_MARKER + 1) <= 70 && count_id(&got, FIRST_MARKER + 1) < n_default, "budget 70: %d placeholders",
          count_id(&got, FIRST_MARKER + 1));
    printf("ok run --image-tokens 70: %d soft tokens, the library's answer\n", count_id(&got, FIRST_MARKER + 1));
}

/* /image in chat: the turn after it answers as run --image does; a bad /image is one line and the
 * chat goes on (its next turn has no image). */
static void test_chat_image(void) {
    static ids_pair want, got;
    const char *img = VDIR "/gray.png";
    library_answer(&img, 1, 0, &want);
    char cmd[4096], out[700], err[700];
    snprintf(out, sizeof out, "%s/chat.out", tmp);
    snprintf(err, sizeof err, "%s/chat.err", tmp);
    snprintf(cmd, sizeof cmd, "printf '/image %s/missing.png\\n/image %s\\n" PROMPT "\\n/reset\\n/image\\n" PROMPT "\\n' | %s chat -m %s -n %d --temp 0 --verbose > %s 2> %s",
             tmp, img, bin, model, N_GEN, out, err);
    CHECK(sh(cmd) == 0, "chat with /image failed");
    char *e = slurp(err);
    cli_ids(e, 0, &got);
    expect_same(&got, &want, "chat /image");
    CHECK(strstr(e, "missing.png: cannot open") && strstr(e, "/image takes a file"), "chat's bad /image lines: %s", e);
    library_answer(NULL, 0, 0, &want);
    cli_ids(e, 1, &got);
    expect_same(&got, &want, "chat turn after /reset");
    CHECK(count_id(&got, FIRST_MARKER) == 0, "the image outlived /reset");
    free(e);
    printf("ok chat /image PATH answers as the library does; bad /image lines leave the chat going\n");
}

/* --audio and --image mixed: the parts in the order given, the library's answer; /audio in chat. */
static void expect_one_line(const char *args, const char *what);

static void test_audio(void) {
    static ids_pair want, got;
    const char *files[3] = {"tests/fixtures/audio/s16_16k_mono.wav", VDIR "/rgb.png", "tests/fixtures/audio/u8_8k_mono.wav"};
    const g4_media_kind kinds[3] = {G4_MEDIA_AUDIO, G4_MEDIA_IMAGE, G4_MEDIA_AUDIO};
    library_answer_kinds(audio_model, files, kinds, 3, 0, &want);
    char args[4096], out[700], err[700];
    snprintf(out, sizeof out, "%s/audio.out", tmp);
    snprintf(err, sizeof err, "%s/audio.err", tmp);
    snprintf(args, sizeof args, "run -m %s --audio %s --image %s --audio %s -p '" PROMPT "' -n %d --temp 0 --verbose", audio_model, files[0], files[1], files[2],
             N_GEN);
    CHECK(run_into(bin, args, out, err) == 0, "run --audio --image --audio failed");
    char *e = slurp(err);
    cli_ids(e, 0, &got);
    free(e);
    expect_same(&got, &want, "run --audio A --image I --audio B");
    int first_audio = -1, first_image = -1;
    for (int i = got.n_prompt - 1; i >= 0; i--) {
        if (got.prompt[i] == FIRST_MARKER + 3) first_audio = i;
        if (got.prompt[i] == FIRST_MARKER) first_image = i;
    }
    CHECK(count_id(&got, FIRST_MARKER + 3) == 2 && count_id(&got, FIRST_MARKER) == 1 && first_audio >= 0 && first_audio < first_image,
          "two recordings and an image, the first recording first: %d <|audio>, %d <|image>", count_id(&got, FIRST_MARKER + 3), count_id(&got, FIRST_MARKER));
    printf("ok run --audio --image --audio: %d audio soft tokens, the parts in order, the library's answer\n", count_id(&got, FIRST_MARKER + 4));
    library_answer_kinds(audio_model, files, kinds, 1, 0, &want);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "printf '/audio %s\\n" PROMPT "\\n' | %s chat -m %s -n %d --temp 0 --verbose > %s 2> %s", files[0], bin, audio_model, N_GEN, out, err);
    CHECK(sh(cmd) == 0, "chat with /audio failed");
    e = slurp(err);
    cli_ids(e, 0, &got);
    free(e);
    expect_same(&got, &want, "chat /audio");
    snprintf(args, sizeof args, "run -m %s --audio " VDIR "/rgb.png -p hi", audio_model);
    expect_one_line(args, VDIR "/rgb.png: ");
    snprintf(args, sizeof args, "run -m %s --audio tests/fixtures/audio/s16_16k_mono.wav -p hi", model);
    expect_one_line(args, "s16_16k_mono.wav: ");
    printf("ok chat /audio answers as the library does; a PNG as --audio and tiny-mobile's audio tower refused with one line\n");
}

/* `g4 ARGS` fails with exit 1 and one stderr line holding `what`. */
static void expect_one_line(const char *args, const char *what) {
    char out[700], err[700];
    snprintf(out, sizeof out, "%s/bad.out", tmp);
    snprintf(err, sizeof err, "%s/bad.err", tmp);
    int rc = run_into(bin, args, out, err);
    char *text = slurp(err), *o = slurp(out);
    const char *nl = strchr(text, '\n');
    CHECK(rc == 1 && strstr(text, what) && nl && !nl[1] && !*o, "g4 %s: exit %d, stdout \"%s\", stderr: %s", args, rc, o, text);
    free(text), free(o);
}

static void test_refusals(void) {
    char args[4096], path[700];
    snprintf(args, sizeof args, "run -m %s --image %s/none.png -p hi", model, tmp);
    expect_one_line(args, "g4: error: ");
    expect_one_line(args, "none.png: cannot open");
    snprintf(args, sizeof args, "run -m %s --image " MATH_MODEL "/config.json -p hi", model);
    expect_one_line(args, "g4: error: " MATH_MODEL "/config.json: ");
    snprintf(path, sizeof path, "%s/cut.png", tmp);
    char *png;
    size_t len;
    if (g4_read_file(VDIR "/rgb.png", &png, &len) != 0) exit(2);
    write_file_or_exit(path, png, len / 2);
    free(png);
    snprintf(args, sizeof args, "run -m %s --image %s -p hi", model, path);
    expect_one_line(args, "cut.png: ");
    snprintf(args, sizeof args, "run -m %s --image " VDIR "/rgb.png --image-tokens 100 -p hi", model);
    expect_one_line(args, "g4 run: error: --image-tokens 100: expected one of 70 140 280 560 1120");
    snprintf(args, sizeof args, "run -m %s --image " VDIR "/rgb.png --raw -p hi", model);
    expect_one_line(args, "--raw takes no media");
    snprintf(args, sizeof args, "run -m " MATH_MODEL " --image " VDIR "/rgb.png -p hi");
    expect_one_line(args, VDIR "/rgb.png: ");
    expect_one_line(args, "vision_config");
    snprintf(args, sizeof args, "chat -m %s --image %s/none.png", model, tmp);
    expect_one_line(args, "none.png: cannot open");
    printf("ok bad images, a bad budget, --raw with an image and a text-only model: one line each, exit 1\n");
}

int main(void) {
    if (!(bin = check_bin())) return check_report("media_cli");
    snprintf(tmp, sizeof tmp, "/tmp/g4-media-cli-XXXXXX");
    if (!mkdtemp(tmp)) return 2;
    snprintf(model, sizeof model, "%s/tiny-mobile", tmp);
    char cmd[2048], path[700], fixture[4096];
    if (!realpath(tiny_dir(), fixture)) return 2;
    snprintf(cmd, sizeof cmd, "mkdir %s && ln -s %s/config.json %s/model.safetensors %s/", model, fixture, fixture, model);
    if (sh(cmd) != 0) return 2;
    snprintf(path, sizeof path, "%s/tokenizer.json", model);
    write_media_tokenizer(path);
    char tower[4096];
    if (!realpath("tests/fixtures/audio/tower", tower)) return 2;
    snprintf(audio_model, sizeof audio_model, "%s/audio", tmp);
    snprintf(cmd, sizeof cmd, "mkdir %s && ln -s %s/config.json %s/model.safetensors %s/ && cp %s %s/", audio_model, tower, tower, audio_model, path, audio_model);
    if (sh(cmd) != 0) return 2;
    test_run_images();
    test_chat_image();
    test_refusals();
    test_audio();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_report("media_cli");
}
