/* kernels_q5_avx512.c: AVX-512 VNNI (256-bit) dots and tiles of q5_0 and q5_1 weights against q8_0
 * activations (the code is in kernels_q5_tile.h; the same bits as the AVX2 build). */
#define HR_Q5_VNNI    1
#define HR_Q5FN(name) hr_avx512_##name
#include "backend/cpu/kernels_q5_tile.h"
