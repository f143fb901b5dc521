/* The vision tower's internal entry points (issue 35, image half): decoding, preprocessing
 * (pixels -> patches), the tower (patches -> soft tokens). The public call is
 * g4_image_soft_tokens in g4.h. */
#ifndef G4_VISION_IMAGE_H
#define G4_VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* Bounds checked on the declared header dimensions, before any pixel buffer is allocated: a
 * decompression bomb (a tiny file declaring 50000 x 50000) is refused before it costs memory. */
#define G4_IMAGE_MAX_SIDE 16384
#define G4_IMAGE_MAX_PIXELS ((size_t)40 << 20) /* 40 Mpx: 120 MB of RGB8 */
#define G4_IMAGE_MAX_ASPECT 100                /* longer side / shorter side */

typedef struct {
    int w, h;
    uint8_t *rgb; /* h x w x 3, row-major, malloc'd */
} g4_rgb_image;

/* Decodes a PNG or JPEG file's bytes into RGB8 (alpha dropped, grey replicated, palettes
 * expanded, 16-bit samples reduced to 8 as PIL does: the high byte). 0, or -1 with a one-line
 * error (unknown format, truncated data, dimensions over the bounds above). */
int g4_image_decode(const void *bytes, size_t len, g4_rgb_image *out);
void g4_rgb_image_free(g4_rgb_image *im);

/* The Gemma 4 image processor's target size (get_aspect_ratio_preserving_size): sides that are
 * multiples of patch * pool with at most max_patches patches. -1 with an error when none fits. */
int g4_image_target_size(int h, int w, int patch, int pool, int max_patches, int *th, int *tw);

/* torch's antialiased bicubic resize of a uint8 image (the processor's default torchvision
 * backend: tvF.resize(..., BICUBIC, antialias=True) on the uint8 tensor), separable, fixed point,
 * width first. out is th x tw x 3, malloc'd. 0 or -1 (allocation). */
int g4_image_resize_bicubic_aa(const g4_rgb_image *in, int th, int tw, g4_rgb_image *out);

/* Patches of the processor: [max_patches, 3 * patch^2] floats (pixel / 255, each patch flattened
 * (py, px, c), row-major over the grid), positions [max_patches, 2] = (x, y), padding rows zero
 * with position (-1, -1). The image is resized to the target size first (unchanged if it has it).
 * *n_real: the patches that are not padding. 0 or -1 with an error. */
typedef struct {
    int max_patches, patch_dim, n_real, grid_w, grid_h;
    float *pixels;     /* [max_patches * patch_dim] */
    int32_t *pos;      /* [max_patches * 2] */
} g4_image_patches;
int g4_image_patchify(const g4_rgb_image *im, int patch, int pool, int max_soft_tokens, g4_image_patches *out);
void g4_image_patches_free(g4_image_patches *p);

#endif
