/* The Gemma 4 image processor (transformers image_processing_gemma4.py, the default torchvision
 * backend) in C: the aspect-preserving target size, the resize, /255 and the patches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "vision/image.h"

int g4_image_target_size(int h, int w, int patch, int pool, int max_patches, int *th, int *tw) {
    double total = (double)h * w, target_px = (double)max_patches * patch * patch;
    double factor = sqrt(target_px / total);
    int side = pool * patch;
    long long H = (long long)floor(factor * h / side) * side, W = (long long)floor(factor * w / side) * side;
    if (H == 0 && W == 0) return g4_fail("image: %d x %d cannot be resized to a multiple of %d", w, h, side);
    long long max_side = (long long)(max_patches / (pool * pool)) * side;
    if (H == 0) {
        H = side;
        W = (long long)floor((double)w / h) * side;
        if (W > max_side) W = max_side;
    } else if (W == 0) {
        W = side;
        H = (long long)floor((double)h / w) * side;
        if (H > max_side) H = max_side;
    }
    if ((double)H * W > target_px)
        return g4_fail("image: resizing %d x %d to %lld x %lld exceeds %d patches", w, h, W, H, max_patches);
    *th = (int)H;
    *tw = (int)W;
    return 0;
}

/* ---- torch's uint8 antialiased bicubic (aten/src/ATen/native/cpu/UpSampleKernel.cpp:
 * _compute_index_ranges_weights with the AA bicubic filter, then
 * _compute_index_ranges_int16_weights; the same fixed point as PIL's ImagingResample, except for
 * how the precision is chosen) ---- */

/* Keys' cubic with a = -0.5, as torch's aa_filter for bicubic. */
static double bicubic_aa_filter(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

typedef struct {
    int taps;         /* max_interp_size */
    int precision;    /* weights_precision */
    int *xmin, *xsize; /* [out] */
    int16_t *w;       /* [out * taps] */
} resample_plan;

static void plan_free(resample_plan *p) {
    free(p->xmin);
    free(p->xsize);
    free(p->w);
}

static int plan_build(resample_plan *p, int in, int out) {
    double scale = (double)in / out; /* area_pixel_compute_scale, align_corners false */
    double support = scale >= 1.0 ? 2.0 * scale : 2.0; /* interp_size 4 */
    p->taps = (int)ceil(support) * 2 + 1;
    p->xmin = malloc(sizeof(int) * out);
    p->xsize = malloc(sizeof(int) * out);
    p->w = malloc(sizeof(int16_t) * (size_t)out * p->taps);
    double *wf = calloc((size_t)out * p->taps, sizeof(double));
    if (!p->xmin || !p->xsize || !p->w || !wf) {
        free(wf);
        plan_free(p);
        return g4_fail("image: out of memory planning a resize");
    }
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0, wt_max = 0.0;
    for (int i = 0; i < out; i++) {
        double center = scale * (i + 0.5), total = 0.0;
        long long lo = (long long)(center - support + 0.5), hi = (long long)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        long long n = hi - lo;
        if (n < 0) n = 0;
        if (n > p->taps) n = p->taps;
        double *wr = wf + (size_t)i * p->taps;
        for (int j = 0; j < n; j++) {
            wr[j] = bicubic_aa_filter((j + lo - center + 0.5) * invscale);
            total += wr[j];
        }
        if (total != 0.0)
            for (int j = 0; j < n; j++) {
                wr[j] /= total;
                if (wr[j] > wt_max) wt_max = wr[j];
            }
        p->xmin[i] = (int)lo;
        p->xsize[i] = (int)n;
    }
    int prec = 0;
    for (prec = 0; prec < 22; prec++)
        if ((int)(0.5 + wt_max * (1 << (prec + 1))) >= (1 << 15)) break;
    p->precision = prec;
    for (size_t k = 0; k < (size_t)out * p->taps; k++) {
        double v = wf[k] * (1 << prec);
        p->w[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wf);
    return 0;
}

static uint8_t clip_shift(int32_t sum, int prec) {
    int32_t v = sum >> prec;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One pass along a dimension: `lines` lines of `in` samples (3 channels each) at stride
 * `step` between samples and `lstep` between lines, into `out` samples. */
static void resample_pass(const resample_plan *p, const uint8_t *src, uint8_t *dst, int lines, int out, size_t sstep,
                          size_t slstep, size_t dstep, size_t dlstep) {
    int32_t half = p->precision > 0 ? 1 << (p->precision - 1) : 0;
    for (int l = 0; l < lines; l++)
        for (int i = 0; i < out; i++) {
            const int16_t *w = p->w + (size_t)i * p->taps;
            for (int c = 0; c < 3; c++) {
                int32_t sum = half;
                const uint8_t *s = src + (size_t)l * slstep + (size_t)p->xmin[i] * sstep + c;
                for (int j = 0; j < p->xsize[i]; j++) sum += (int32_t)s[(size_t)j * sstep] * w[j];
                dst[(size_t)l * dlstep + (size_t)i * dstep + c] = clip_shift(sum, p->precision);
            }
        }
}

int g4_image_resize_bicubic_aa(const g4_rgb_image *in, int th, int tw, g4_rgb_image *out) {
    memset(out, 0, sizeof *out);
    out->rgb = malloc((size_t)th * tw * 3);
    if (!out->rgb) return g4_fail("image: out of memory resizing to %d x %d", tw, th);
    out->w = tw;
    out->h = th;
    const uint8_t *src = in->rgb;
    uint8_t *mid = NULL;
    /* Width first, then height, each pass skipped when its size is unchanged (as torch does). */
    if (tw != in->w) {
        resample_plan p;
        if (plan_build(&p, in->w, tw)) return g4_rgb_image_free(out), -1;
        uint8_t *dst = th != in->h ? (mid = malloc((size_t)in->h * tw * 3)) : out->rgb;
        if (!dst) return plan_free(&p), g4_rgb_image_free(out), g4_fail("image: out of memory resizing");
        resample_pass(&p, src, dst, in->h, tw, 3, (size_t)in->w * 3, 3, (size_t)tw * 3);
        plan_free(&p);
        src = dst;
    }
    if (th != in->h) {
        resample_plan p;
        if (plan_build(&p, in->h, th)) return free(mid), g4_rgb_image_free(out), -1;
        resample_pass(&p, src, out->rgb, tw, th, (size_t)tw * 3, 3, (size_t)tw * 3, 3);
        plan_free(&p);
    }
    if (tw == in->w && th == in->h) memcpy(out->rgb, in->rgb, (size_t)th * tw * 3);
    free(mid);
    return 0;
}

void g4_image_patches_free(g4_image_patches *p) {
    if (!p) return;
    free(p->pixels);
    free(p->pos);
    memset(p, 0, sizeof *p);
}

int g4_image_patchify(const g4_rgb_image *im, int patch, int pool, int max_soft_tokens, g4_image_patches *out) {
    memset(out, 0, sizeof *out);
    if (max_soft_tokens != 70 && max_soft_tokens != 140 && max_soft_tokens != 280 && max_soft_tokens != 560 &&
        max_soft_tokens != 1120)
        return g4_fail("image: max_soft_tokens %d is not one of 70, 140, 280, 560, 1120", max_soft_tokens);
    int max_patches = max_soft_tokens * pool * pool, th, tw;
    if (g4_image_target_size(im->h, im->w, patch, pool, max_patches, &th, &tw)) return -1;
    g4_rgb_image rs;
    if (g4_image_resize_bicubic_aa(im, th, tw, &rs)) return -1;
    int gw = tw / patch, gh = th / patch, pd = 3 * patch * patch;
    out->max_patches = max_patches;
    out->patch_dim = pd;
    out->n_real = gw * gh;
    out->grid_w = gw;
    out->grid_h = gh;
    out->pixels = calloc((size_t)max_patches * pd, sizeof(float));
    out->pos = malloc(sizeof(int32_t) * 2 * (size_t)max_patches);
    if (!out->pixels || !out->pos) {
        g4_rgb_image_free(&rs);
        g4_image_patches_free(out);
        return g4_fail("image: out of memory for %d patches", max_patches);
    }
    for (int gy = 0; gy < gh; gy++)
        for (int gx = 0; gx < gw; gx++) {
            size_t k = (size_t)gy * gw + gx;
            float *row = out->pixels + k * pd;
            for (int py = 0; py < patch; py++)
                for (int px = 0; px < patch; px++)
                    for (int c = 0; c < 3; c++)
                        *row++ = (float)rs.rgb[((size_t)(gy * patch + py) * tw + gx * patch + px) * 3 + c] * (float)(1.0 / 255.0);
            out->pos[2 * k] = gx;
            out->pos[2 * k + 1] = gy;
        }
    for (int k = out->n_real; k < max_patches; k++) out->pos[2 * k] = out->pos[2 * k + 1] = -1;
    g4_rgb_image_free(&rs);
    return 0;
}
