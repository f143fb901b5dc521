#include "pack.h"

void g4_unpack_row(const uint8_t *row, int bits, size_t n, int8_t *codes) {
    for (size_t j = 0; j < n; j++) codes[j] = (int8_t)g4_packed_code(row, bits, j);
}
