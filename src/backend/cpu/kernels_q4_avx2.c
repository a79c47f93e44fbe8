/* kernels_q4_avx2.c: AVX2 dot and tiles of q4_0 weights against q8_0 activations (the code is in
 * kernels_q4_0_tile.h, shared with the AVX-512 VNNI build). */
#define HR_Q_VNNI    0
#define HR_QFN(name) hr_avx2_##name
#include "backend/cpu/kernels_q4_0_tile.h"
