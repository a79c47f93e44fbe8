/* kernels_q4x16_avx2.c: the q4_0x16 tile with AVX2 (the code is in kernels_q4x16.h). */
#define HR_X16_512     0
#define HR_X16FN(name) hr_avx2_##name
#include "tensor/kernels_q4x16.h"
