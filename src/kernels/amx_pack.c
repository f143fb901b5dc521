/* The AMX level's prepared weights (levels.h): each weight repacked once, when the model binds it,
 * into the A tiles tdpbusd reads (kernels/amx.c), so that the tiles load them as they are instead
 * of unpacking every 16-row group's fields into scratch on every call. Plain C on every target:
 * it runs once per weight, and the tests check the layout on any CPU (test_kernels,
 * amx_prepared_layout).
 *
 * Layout: groups of 16 weight rows, one after the other; a group is q = blocks x fields tiles of
 * 1 KB (blocks: the row's packed bytes in 64-byte blocks, the last one zero-padded; fields: 4, 2
 * or 1 codes per byte for 2, 4 or 8 bits), tile b * fields + f holding in its row m (64 bytes)
 * field f of every byte of block b of weight row 16 g + m, as the unsigned operand (offset
 * binary: the 2- or 4-bit field as stored, an 8-bit code + 128): exactly what amx.c's
 * unpack_group writes into its scratch, so both paths feed the tiles the same bytes. Rows past
 * the weight's last are zero, and one more group of zeros follows the last, so a thread taking two
 * groups at a time never reads past the copy. Memory: 1 byte per weight element (16-row and
 * 64-byte padding aside), against the stored 1/4, 1/2 or 1. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "levels.h"
#include "pool.h"
#include "quant/pack.h"

#define BLK 64
#define TROWS 16

static int fields_of(int bits) { return bits == 2 ? 4 : bits == 4 ? 2 : 1; }

size_t g4_amx_tile_vectors(int bits, int in) {
    size_t pb = g4_packed_row_bytes(bits, (size_t)in);
    return (pb + BLK - 1) / BLK * (size_t)fields_of(bits);
}

/* Field f of byte v as the unsigned operand. */
static uint8_t field_of(uint8_t v, int f, int bits) {
    if (bits == 8) return v ^ 0x80;
    return (uint8_t)((v >> (f * bits)) & (bits == 2 ? 3 : 15));
}

G4_VECTORIZE void g4_amx_pack_group(const g4_qweight *w, int o, uint8_t *dst) {
    const int F = fields_of(w->bits);
    const size_t pb = g4_packed_row_bytes(w->bits, (size_t)w->in), q = g4_amx_tile_vectors(w->bits, w->in);
    for (int m = 0; m < TROWS; m++) {
        if (o + m >= w->out) {
            for (size_t v = 0; v < q; v++) memset(dst + v * G4_AMX_TILE_BYTES + (size_t)m * BLK, 0, BLK);
            continue;
        }
        const uint8_t *row = w->w + (size_t)(o + m) * w->row_bytes;
        for (size_t b = 0; b * BLK < pb; b++) {
            uint8_t blk[BLK] = {0};
            size_t len = pb - b * BLK < BLK ? pb - b * BLK : BLK;
            memcpy(blk, row + b * BLK, len);
            for (int f = 0; f < F; f++) {
                uint8_t *d = dst + (b * (size_t)F + (size_t)f) * G4_AMX_TILE_BYTES + (size_t)m * BLK;
                for (int j = 0; j < BLK; j++) d[j] = field_of(blk[j], f, w->bits);
            }
        }
    }
}

typedef struct {
    const g4_qweight *w;
    uint8_t *data;
    size_t group; /* bytes of one group's tiles */
} pack_job;

static void pack_groups(void *ctx, int g0, int g1) {
    const pack_job *j = ctx;
    for (int g = g0; g < g1; g++) g4_amx_pack_group(j->w, g * TROWS, j->data + (size_t)g * j->group);
}

g4_wprep *g4_amx_prepare(const g4_qweight *w) {
    if (w->block != 0 || (w->bits != 2 && w->bits != 4 && w->bits != 8) || w->in <= 0 || w->out <= 0) return NULL;
    const size_t group = g4_amx_tile_vectors(w->bits, w->in) * G4_AMX_TILE_BYTES;
    const int groups = (w->out + TROWS - 1) / TROWS;
    g4_wprep *p = g4_wprep_new(&g4_kernels_amx, w, ((size_t)groups + 1) * group);
    if (!p) return NULL;
    pack_job j = {.w = w, .data = p->data, .group = group};
    g4_pool_for(groups, 1, (double)groups * (double)group, pack_groups, &j); /* a model's worth takes seconds on one core */
    memset(p->data + (size_t)groups * group, 0, group); /* the zero group past the last */
    return p;
}

const uint8_t *g4_amx_prepared_tiles(const g4_qweight *w) {
    long row0 = g4_wprep_row0(w, &g4_kernels_amx);
    if (row0 < 0 || row0 % TROWS) return NULL; /* no copy, or a view that starts inside a group */
    return w->prep->data + (size_t)(row0 / TROWS) * g4_amx_tile_vectors(w->bits, w->in) * G4_AMX_TILE_BYTES;
}

int g4_amx_prepared_code(const g4_wprep *p, int o, int i) {
    const int F = fields_of(p->bits);
    const size_t byte = (size_t)i / (size_t)F, b = byte / BLK, q = g4_amx_tile_vectors(p->bits, p->in);
    const int f = i % F, off = p->bits == 8 ? 128 : p->bits == 4 ? 8 : 2;
    const size_t at = ((size_t)(o / TROWS) * q + b * (size_t)F + (size_t)f) * G4_AMX_TILE_BYTES + (size_t)(o % TROWS) * BLK + byte % BLK;
    return (int)p->data[at] - off;
}
