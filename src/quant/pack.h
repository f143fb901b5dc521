/* Packed low-bit weight codes, as stored in the checkpoint (checkpoint.md §6).
 * Packing runs along the input (last) dimension, least significant bits first:
 *   bits 4: element 2j in the low nibble of byte j, code = nibble - 8  (-8..7)
 *   bits 2: element 4j+k in bits [2k+1:2k] of byte j, code = field - 2 (-2..1)
 *   bits 8: one two's-complement int8 per element, no offset. */
#ifndef G4_QUANT_PACK_H
#define G4_QUANT_PACK_H

#include <stddef.h>
#include <stdint.h>

/* Bytes one packed row of n elements takes (rows are padded to whole bytes). */
static inline size_t g4_packed_row_bytes(int bits, size_t n) {
    size_t per = (size_t)(8 / bits);
    return (n + per - 1) / per;
}

/* Code of element j of a packed row. */
static inline int g4_packed_code(const uint8_t *row, int bits, size_t j) {
    switch (bits) {
    case 8: return (int8_t)row[j];
    case 4: return (int)((row[j >> 1] >> ((j & 1) * 4)) & 15) - 8;
    default: return (int)((row[j >> 2] >> ((j & 3) * 2)) & 3) - 2;
    }
}

/* Unpacks elements [0, n) of a packed row into signed codes. */
void g4_unpack_row(const uint8_t *row, int bits, size_t n, int8_t *codes);

#endif
