/* kernels_q5_avx2.c: AVX2 dots and tiles of q5_0 and q5_1 weights against q8_0 activations (the code is
 * in kernels_q5_tile.h, shared with the AVX-512 VNNI build). */
#define HR_Q5_VNNI    0
#define HR_Q5FN(name) hr_avx2_##name
#include "backend/cpu/kernels_q5_tile.h"
