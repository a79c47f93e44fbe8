/* kernels_q8_avx512.c: the q8_0 dot and batch tile with AVX-512 VNNI (vpdpbusd on 256-bit
 * registers, EVEX: AVX512_VNNI + AVX512VL) for the exact integer block sums; everything else, and so
 * every result bit, as the AVX2 build of kernels_q8_0_tile.h. Reached only when the CPU has them. */
#define HR_Q_VNNI    1
#define HR_QFN(name) hr_avx512_##name
#include "backend/cpu/kernels_q8_0_tile.h"
