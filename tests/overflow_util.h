/* A checkpoint that loads but whose output is NaN, for the tests of issue 33's defect 1: a copy of
 * a model folder with every row of its token embedding scale set to 3e38 (a finite float, so
 * validation passes; the embeddings overflow, so every hidden state and logit is NaN). The other
 * files are symlinked. Needs _POSIX_C_SOURCE 200809L (symlink, dirent). */
#ifndef G4_TEST_OVERFLOW_UTIL_H
#define G4_TEST_OVERFLOW_UTIL_H

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>

#include "testutil.h"

#define OVERFLOW_TENSOR "model.language_model.embed_tokens.embedding_scale"

/* Writes the copy of folder `from` into the existing folder `to`; 0, or -1 when `from` has no
 * such F32 tensor in its model.safetensors. */
static inline int write_overflowing_copy(const char *from, const char *to) {
    char path[PATH_MAX + 256], link[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/model.safetensors", from);
    char *st;
    size_t len;
    if (g4_read_file(path, &st, &len) != 0 || len < 8) return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | (unsigned char)st[i];
    cJSON *h = n < len ? cJSON_ParseWithLength(st + 8, (size_t)n) : NULL;
    const cJSON *t = cJSON_GetObjectItem(h, OVERFLOW_TENSOR), *off = cJSON_GetObjectItem(t, "data_offsets");
    const cJSON *dtype = cJSON_GetObjectItem(t, "dtype");
    int rc = -1;
    if (cJSON_GetArraySize(off) == 2 && cJSON_IsString(dtype) && strcmp(dtype->valuestring, "F32") == 0) {
        size_t a = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, b = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        const float big = 3e38f;
        for (size_t at = a; at + 4 <= b && 8 + n + at + 4 <= len; at += 4) memcpy(st + 8 + n + at, &big, 4);
        snprintf(path, sizeof path, "%s/model.safetensors", to);
        write_file_or_exit(path, st, len);
        rc = 0;
    }
    cJSON_Delete(h);
    free(st);
    char abs[PATH_MAX], cwd[PATH_MAX / 2]; /* the links' targets: absolute, as `from` may be relative */
    if (from[0] == '/') snprintf(abs, sizeof abs, "%s", from);
    else if (getcwd(cwd, sizeof cwd)) snprintf(abs, sizeof abs, "%s/%.*s", cwd, PATH_MAX / 2 - 2, from);
    else rc = -1;
    DIR *d = rc == 0 ? opendir(abs) : NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "model.safetensors") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", abs, e->d_name);
        snprintf(link, sizeof link, "%s/%s", to, e->d_name);
        if (symlink(path, link) != 0) rc = -1;
    }
    if (d) closedir(d);
    else rc = -1;
    return rc;
}

/* Removes what write_overflowing_copy put in `to` (its files and links), and `to`. */
static inline void remove_overflowing_copy(const char *to) {
    char path[1024];
    DIR *d = opendir(to);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", to, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(to);
}

#endif
