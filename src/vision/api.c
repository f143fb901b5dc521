/* g4_image_soft_tokens (g4.h): a PNG/JPEG file's bytes -> the model's image soft tokens. */
#include <stdlib.h>

#include "g4.h"
#include "util/err.h"
#include "vision/image.h"
#include "vision/tower.h"

int g4_image_soft_tokens(const g4_model *m, const g4_options *o, const void *bytes, size_t len, int max_soft_tokens, float **embd,
                         int *n_tokens) {
    if (!embd || !n_tokens) return g4_fail("g4_image_soft_tokens: embd and n_tokens are required");
    *embd = NULL;
    *n_tokens = 0;
    if (!m || !o) return g4_fail("g4_image_soft_tokens: a model and options are required");
    const g4_vision_tower *vt = g4_vision_tower_get(m);
    if (!vt) return -1;
    if (max_soft_tokens <= 0) max_soft_tokens = g4_vision_default_soft_tokens(vt);
    g4_rgb_image im;
    if (g4_image_decode(bytes, len, &im)) return -1;
    g4_image_patches p;
    int rc = g4_image_patchify(&im, g4_vision_patch_size(vt), g4_vision_pooling(vt), max_soft_tokens, &p);
    g4_rgb_image_free(&im);
    if (rc) return -1;
    rc = g4_vision_encode(m, vt, o, &p, embd, n_tokens, NULL);
    g4_image_patches_free(&p);
    return rc;
}
