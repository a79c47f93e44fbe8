/* kernels_mxfp4_avx512.c: AVX-512 VNNI (256-bit) dot and tile of MXFP4 weights against q8_0 activations
 * (the code is in kernels_mxfp4_tile.h; the same bits as the AVX2 build). */
#define HR_MX_VNNI    1
#define HR_MXFN(name) hr_avx512_##name
#include "backend/cpu/kernels_mxfp4_tile.h"
