/* kernels_mxfp4_avx2.c: AVX2 dot and tile of MXFP4 weights against q8_0 activations (the code is in
 * kernels_mxfp4_tile.h, shared with the AVX-512 VNNI build). */
#define HR_MX_VNNI    0
#define HR_MXFN(name) hr_avx2_##name
#include "backend/cpu/kernels_mxfp4_tile.h"
