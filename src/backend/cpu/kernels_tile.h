/* kernels_tile.h: the one driver of the 1 weight row x 8 tokens batch tiles (q8_0, q4_0, K-quants;
 * AVX2 and AVX-512 alike), generated per kernel by HR_TILE_DRIVER from the parts that differ: the
 * step unit (a pair of 32-element blocks or a 256-element super-block), the packed activation type,
 * the row kernel and the lone-token path.
 *
 * What the driver does with a call of nr rows x nt tokens (nt >= 2; nt == 1 goes to the lone-token
 * path): rows go in chunks (hr_tile_chunk_rows: at most max_rows rows and chunk_bytes of weights);
 * per chunk, the tokens go in groups of HR_TILE_TC, then the rest in 1 x 4, 1 x 3 and 1 x 2 tiles
 * (hr_tile_rest_widths: no token alone). A group runs k-block after k-block: its activations are
 * packed once per k-block (pack) into a thread-local table that every row of the chunk then reads
 * (row), each row's accumulators kept in a thread-local array between k-blocks. The first group
 * over a chunk (stream) takes long k-blocks (kp_stream units: the weights, then coming from memory,
 * are read row after row as one sequential stream the hardware prefetcher follows; the table sits
 * in L2); the later groups find the chunk in L2 and take short k-blocks (kp units) whose table
 * stays in L1.
 *
 * The contract the parts keep: row(C, u0, u1, k, w_row, ap, acc, first, last, y, ys) runs units
 * [u0, u1) of one weight row against C packed tokens (ap[(u - u0) * C + t]), starting from zeros
 * (first) or acc, ending in y[t * ys] (last) or back in acc, with the one sequence of float
 * operations per element that the type's vec_dot runs; so every element has vec_dot's bits however
 * the call is split. */
#ifndef HR_BACKEND_CPU_KERNELS_TILE_H
#define HR_BACKEND_CPU_KERNELS_TILE_H

#include "backend/cpu/kernels_internal.h"

/* HR_TILE_DRIVER(name, act_t, acc_t, acc_per_token, units, kp, kp_stream, max_rows, chunk_bytes,
 *                pack, row, one_token) defines
 *     void name(int64_t k, const void *w, size_t ws, int nr, const void *a, size_t as, int nt,
 *               float *y, size_t ys)                         (an hr_vec_dot_tile_fn)
 * from
 *   act_t          the packed activation of one step unit of one token
 *   acc_t          the accumulator vector type; acc_per_token of them per (row, token)
 *   units(k)       step units in a row of k elements (the block step)
 *   kp, kp_stream  units per k-block for the later groups and the streaming first group
 *   max_rows, chunk_bytes   row chunk limits
 *   pack(a_row, u, k)       -> act_t: unit u of one token's activation row
 *   row(...)       the row kernel (the contract above; C is a compile-time 8, 4, 3 or 2 after inlining)
 *   one_token(k, w, ws, nr, a, y)   the nt == 1 path (decode) */
#define HR_TILE_DRIVER(...) HR_TILE_DRIVER_(__VA_ARGS__) /* expands a macro-made name before pasting */
#define HR_TILE_DRIVER_(name, act_t, acc_t, acc_per_token, units, kp, kp_stream, max_rows, chunk_bytes, pack, row,     \
                        one_token)                                                                                     \
    static inline __attribute__((always_inline)) void name##_group(                                                    \
        const int C, int64_t k, int64_t nu, const char *wr, size_t ws, int n, const char *at, size_t as, float *yt,    \
        size_t ys, bool stream, act_t *name##_ap, acc_t *name##_acc) {                                                 \
        const int64_t step = stream ? (kp_stream) : (kp);                                                              \
        for (int64_t u0 = 0; u0 < nu; u0 += step) {                                                                    \
            const int64_t u1 = u0 + step < nu ? u0 + step : nu;                                                        \
            for (int64_t u = u0; u < u1; u++)                                                                          \
                for (int t = 0; t < C; t++) name##_ap[(u - u0) * C + t] = pack(at + (size_t)t * as, u, k);             \
            for (int r = 0; r < n; r++)                                                                                \
                row(C, u0, u1, k, wr + (size_t)r * ws, name##_ap, name##_acc + r * (acc_per_token)*HR_TILE_TC,         \
                    u0 == 0, u1 == nu, yt + r, ys);                                                                    \
        }                                                                                                              \
    }                                                                                                                  \
    void name(int64_t k, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y, size_t ys) {    \
        const char *W = w, *A = a;                                                                                     \
        if (nt == 1) {                                                                                                 \
            one_token(k, W, ws, nr, A, y);                                                                             \
            return;                                                                                                    \
        }                                                                                                              \
        if (nr < 1) return;                                                                                            \
        /* the packed activations and the accumulators: on this call's stack (up to ~180 KiB), not in                  \
         * thread-local storage, which every thread of the process would carry and touch (the HTTP                     \
         * server's connection threads held 1 MiB each for these) */                                                   \
        act_t ap[(kp_stream)*HR_TILE_TC];                                                                              \
        acc_t acc[(max_rows) * (acc_per_token)*HR_TILE_TC];                                                            \
        const int64_t nu = units(k);                                                                                   \
        if (nu == 0) {                                                                                                 \
            hr_tile_zero(nr, nt, y, ys);                                                                               \
            return;                                                                                                    \
        }                                                                                                              \
        int rest;                                                                                                      \
        const int ng = hr_tile_groups(nt, &rest);                                                                      \
        const signed char *widths = hr_tile_rest_widths(rest);                                                         \
        const int rows = hr_tile_chunk_rows(nr, ws, (max_rows), (chunk_bytes));                                        \
        for (int r0 = 0; r0 < nr; r0 += rows) {                                                                        \
            const int n = nr - r0 < rows ? nr - r0 : rows;                                                             \
            const char *wr = W + (size_t)r0 * ws;                                                                      \
            for (int g = 0; g < ng; g++)                                                                               \
                name##_group(HR_TILE_TC, k, nu, wr, ws, n, A + (size_t)g * HR_TILE_TC * as, as,                        \
                             y + (size_t)g * HR_TILE_TC * ys + r0, ys, g == 0, ap, acc);                               \
            int t = ng * HR_TILE_TC;                                                                                   \
            for (int i = 0; widths[i]; t += widths[i++]) {                                                             \
                const char *at = A + (size_t)t * as;                                                                   \
                float *yt = y + (size_t)t * ys + r0;                                                                   \
                switch (widths[i]) {                                                                                   \
                case 4: name##_group(4, k, nu, wr, ws, n, at, as, yt, ys, t == 0, ap, acc); break;                     \
                case 3: name##_group(3, k, nu, wr, ws, n, at, as, yt, ys, t == 0, ap, acc); break;                     \
                default: name##_group(2, k, nu, wr, ws, n, at, as, yt, ys, t == 0, ap, acc); break;                    \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }

#endif
