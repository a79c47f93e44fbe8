/* kernels_x16_avx512.c: the x16 tiles (q4_0x16, q8_0x16, q4_Kx16, q5_Kx16, q6_Kx16) with AVX-512 VNNI on 512-bit
 * registers (the code is in kernels_x16.h); reached only when the CPU has AVX512F/BW/VL and
 * AVX512_VNNI. */
#define HR_X16_512     1
#define HR_X16FN(name) hr_avx512_##name
#include "backend/cpu/kernels_x16.h"
