/* Fuzz target: image decoding and preprocessing (src/vision/image.c, preprocess.c).
 *
 * Input: the bytes of a (would-be) PNG or JPEG file. g4_image_decode must either refuse it with a
 * one-line error or return an image within the size bounds; a decoded image is then patchified
 * at the tiny tower's patch size 4 with the smallest budget (70 soft tokens), whose patches must
 * be in [0, 1] with in-range positions. */
#include "util/err.h"
#include "vision/image.h"

#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g4_set_log(NULL, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_rgb_image im;
    if (g4_image_decode(data, size, &im) != 0) {
        const char *e = g4_last_error();
        FZ_CHECK(e && *e && !strchr(e, '\n'), "a refusal without a one-line error: \"%s\"", e ? e : "(null)");
        FZ_CHECK(im.rgb == NULL, "a refusal left an image");
        return 0;
    }
    FZ_CHECK(im.w > 0 && im.h > 0 && im.w <= G4_IMAGE_MAX_SIDE && im.h <= G4_IMAGE_MAX_SIDE &&
                 (size_t)im.w * (size_t)im.h <= G4_IMAGE_MAX_PIXELS,
             "decoded %d x %d, outside the bounds", im.w, im.h);
    g4_image_patches p;
    /* (a large decoded image is only decoded: its resize would be the slow path of every run) */
    if ((size_t)im.w * im.h <= ((size_t)1 << 20) && g4_image_patchify(&im, 4, 3, 70, &p) == 0) {
        FZ_CHECK(p.n_real > 0 && p.n_real <= p.max_patches && p.n_real % 9 == 0, "%d real patches of %d", p.n_real, p.max_patches);
        for (size_t i = 0; i < (size_t)p.n_real * p.patch_dim; i++) FZ_CHECK(p.pixels[i] >= 0 && p.pixels[i] <= 1, "pixel %g", p.pixels[i]);
        for (int k = 0; k < p.n_real; k++)
            FZ_CHECK(p.pos[2 * k] >= 0 && p.pos[2 * k] < p.grid_w && p.pos[2 * k + 1] >= 0 && p.pos[2 * k + 1] < p.grid_h, "position %d", k);
        g4_image_patches_free(&p);
    }
    g4_rgb_image_free(&im);
    return 0;
}
