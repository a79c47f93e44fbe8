/* embed.cu: the token embedding lookup, one thread block per token (grid.x = T). */
#include "common.cuh"

enum { HR_K_F32 = 0, HR_K_F16 = 1, HR_K_Q8_0 = 2 }; /* the table's type (the host's HR_CUDA_T_*) */

/* out[t][0..dim) = row ids[t] of table, dequantized. The host checks every id is below the
 * vocabulary size before the launch (a kernel cannot report a bad id). q8_0 rows are dim / 32 blocks
 * of 34 bytes (f16 scale, 32 int8); dim is then a multiple of 32. */
extern "C" __global__ void hr_k_embed(float *out, const u8 *table, const int *ids, int dim, int type) {
    int t = ctaid_x();
    u64 row = (u64)ids[t];
    float *o = out + (u64)t * (u64)dim;
    if (type == HR_K_F32) {
        const float *r = hr_aligned<4>((const float *)table) + row * (u64)dim;
        for (int i = tid_x(); i < dim; i += ntid_x()) o[i] = r[i];
    } else if (type == HR_K_F16) {
        const u16 *r = hr_aligned<2>((const u16 *)table) + row * (u64)dim;
        for (int i = tid_x(); i < dim; i += ntid_x()) o[i] = hr_h2f(r[i]);
    } else {
        const u8 *r = table + row * (u64)(dim / 32) * 34u;
        for (int i = tid_x(); i < dim; i += ntid_x()) {
            const u8 *b = r + (u64)(i / 32) * 34u;
            o[i] = hr_h2f(hr_ld_u16(b)) * (float)(i8)b[2 + i % 32];
        }
    }
}
