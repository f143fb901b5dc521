/* PNG and JPEG files to RGB8 through Debian's libpng and libjpeg-turbo, with the bounds of
 * image.h checked on the header before anything the size of the image is allocated. Each
 * library reports errors through a callback that longjmps back here with its message. */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* after stdio.h and stddef.h, which jpeglib.h assumes */
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "util/err.h"
#include "vision/image.h"

void g4_rgb_image_free(g4_rgb_image *im) {
    if (!im) return;
    free(im->rgb);
    im->rgb = NULL;
    im->w = im->h = 0;
}

/* The header's dimensions against the bounds, before allocation. */
static int check_dims(const char *fmt, long long w, long long h) {
    if (w <= 0 || h <= 0) return g4_fail("image: %s declares an empty image (%lld x %lld)", fmt, w, h);
    if (w > G4_IMAGE_MAX_SIDE || h > G4_IMAGE_MAX_SIDE)
        return g4_fail("image: %s is %lld x %lld; a side over %d pixels is refused", fmt, w, h, G4_IMAGE_MAX_SIDE);
    if ((unsigned long long)w * (unsigned long long)h > G4_IMAGE_MAX_PIXELS)
        return g4_fail("image: %s is %lld x %lld; over %zu pixels is refused", fmt, w, h, G4_IMAGE_MAX_PIXELS);
    long long lo = w < h ? w : h, hi = w < h ? h : w;
    if (hi > lo * G4_IMAGE_MAX_ASPECT)
        return g4_fail("image: %s is %lld x %lld; an aspect ratio over %d:1 is refused", fmt, w, h, G4_IMAGE_MAX_ASPECT);
    return 0;
}

/* ---- PNG ---- */

typedef struct {
    const uint8_t *p;
    size_t len, at;
    jmp_buf jb;
    char msg[160];
} png_src;

static void png_read_mem(png_structp png, png_bytep out, size_t n) {
    png_src *s = png_get_io_ptr(png);
    if (n > s->len - s->at) png_error(png, "truncated PNG data");
    memcpy(out, s->p + s->at, n);
    s->at += n;
}

static void png_on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    longjmp(s->jb, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* benign (an unknown chunk, a bad gamma value): PIL decodes these too */
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static int decode_png(const uint8_t *bytes, size_t len, g4_rgb_image *out) {
    /* IHDR is the first chunk (PNG spec): its dimensions are checked from the bytes, before
     * libpng reads on (png_read_info reads up to the first IDAT). */
    if (len >= 24 && memcmp(bytes + 12, "IHDR", 4) == 0 && be32(bytes + 16) > 0 && be32(bytes + 20) > 0 &&
        check_dims("PNG", be32(bytes + 16), be32(bytes + 20)))
        return -1;
    png_src src = {.p = bytes, .len = len};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    if (!png) return g4_fail("image: out of memory starting the PNG decoder");
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile rgb = NULL;
    png_bytep *volatile rows = NULL;
    if (!info || setjmp(src.jb)) {
        free(rgb);
        free(rows);
        png_destroy_read_struct(&png, info ? &info : NULL, NULL);
        return g4_fail("image: bad PNG: %s", src.msg[0] ? src.msg : "out of memory");
    }
    png_set_read_fn(png, &src, png_read_mem);
    png_set_user_limits(png, G4_IMAGE_MAX_SIDE, G4_IMAGE_MAX_SIDE);
    png_set_chunk_malloc_max(png, (png_alloc_size_t)8 << 20);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (check_dims("PNG", w, h)) {
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    int ct = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    /* As PIL's convert("RGB"): palettes expanded (transparency dropped), grey replicated, alpha
     * stripped (not composited), 16-bit samples to their high byte. */
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    if (ct & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) png_error(png, "unexpected row layout after conversion to RGB8");
    rgb = malloc((size_t)w * h * 3);
    rows = malloc(sizeof(png_bytep) * h);
    if (!rgb || !rows) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < h; y++) rows[y] = rgb + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    out->w = (int)w;
    out->h = (int)h;
    out->rgb = rgb;
    return 0;
}

/* ---- JPEG ---- */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_on_error(j_common_ptr c) {
    jpeg_err *e = (jpeg_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* libjpeg only warns on a file that ends early (and fills the rest grey); PIL refuses it
 * ("image file is truncated"), and so does g4. Other warnings are benign. */
static void jpeg_on_message(j_common_ptr c, int level) {
    if (level == -1 && c->err->msg_code == JWRN_JPEG_EOF) jpeg_on_error(c);
}

static int decode_jpeg(const uint8_t *bytes, size_t len, g4_rgb_image *out) {
    struct jpeg_decompress_struct d;
    jpeg_err e;
    memset(&e, 0, sizeof e);
    d.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jpeg_on_error;
    e.pub.emit_message = jpeg_on_message;
    uint8_t *volatile rgb = NULL;
    if (setjmp(e.jb)) {
        free(rgb);
        jpeg_destroy_decompress(&d);
        return g4_fail("image: bad JPEG: %s", e.msg);
    }
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, bytes, (unsigned long)len);
    jpeg_read_header(&d, TRUE);
    if (check_dims("JPEG", d.image_width, d.image_height)) {
        jpeg_destroy_decompress(&d);
        return -1;
    }
    if (d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&d);
        return g4_fail("image: CMYK JPEG is not supported (convert it to RGB)");
    }
    d.out_color_space = JCS_RGB; /* from YCbCr or greyscale; the default (islow) DCT and fancy upsampling, as PIL */
    jpeg_start_decompress(&d);
    size_t w = d.output_width, h = d.output_height;
    rgb = malloc(w * h * 3);
    if (!rgb) {
        snprintf(e.msg, sizeof e.msg, "out of memory");
        longjmp(e.jb, 1);
    }
    while (d.output_scanline < d.output_height) {
        JSAMPROW row = rgb + (size_t)d.output_scanline * w * 3;
        jpeg_read_scanlines(&d, &row, 1);
    }
    jpeg_finish_decompress(&d);
    jpeg_destroy_decompress(&d);
    out->w = (int)w;
    out->h = (int)h;
    out->rgb = rgb;
    return 0;
}

int g4_image_decode(const void *bytes, size_t len, g4_rgb_image *out) {
    const uint8_t *b = bytes;
    memset(out, 0, sizeof *out);
    if (!b || len == 0) return g4_fail("image: no data");
    if (len >= 8 && png_sig_cmp(b, 0, 8) == 0) return decode_png(b, len, out);
    if (len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return decode_jpeg(b, len, out);
    return g4_fail("image: not a PNG or JPEG file (%zu bytes; unknown signature)", len);
}
