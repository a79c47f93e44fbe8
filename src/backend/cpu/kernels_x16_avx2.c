/* kernels_x16_avx2.c: the x16 tiles (q4_0x16, q8_0x16, q4_Kx16, q5_Kx16, q6_Kx16) with AVX2 (the code is
 * in kernels_x16.h). */
#define HR_X16_512     0
#define HR_X16FN(name) hr_avx2_##name
#include "backend/cpu/kernels_x16.h"
