/* cuda.h: the CUDA backend (docs/GPU.md). Device code lives in the kernels/ .cu files, compiled to PTX by
 * clang-19 at build time when it is installed and embedded in the binary; the host side here is plain
 * C11 that reaches the GPU through the driver API loaded with dlopen (cuda_driver.h), so a build needs
 * no CUDA SDK and a run needs only the NVIDIA driver.
 *
 * State today: the driver, devices, kernel modules, device memory and launches are wired; the
 * kernels, the device KV storage and the forward pass (backend_cuda.c: the llama family, first
 * version) run in the tests on the CPU through an emulating driver (tests/cuda/emu_rt.c), never yet
 * on a GPU (docs/GPU.md). */
#ifndef HR_BACKEND_CUDA_CUDA_H
#define HR_BACKEND_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "common/status.h"
#include "kv/kv_storage.h"
#include "model/model.h"

/* ---- the device ---------------------------------------------------------------------------------- */

typedef struct hr_cuda_device hr_cuda_device; /* the driver, a context on one GPU, the kernel modules */

/* Opens GPU `ordinal` through the driver library `driver_lib` (NULL: "libcuda.so.1"): loads it,
 * cuInit, checks the ordinal against the devices present, makes a context and loads every embedded
 * kernel module. Each failure is HR_ERR_UNSUPPORTED with one line beginning "CUDA: " that names what
 * is missing (the driver, a device, the kernels of a build made without clang-19, ...). */
hr_status hr_cuda_device_open(const char *driver_lib, int ordinal, hr_cuda_device **out, hr_error *err);
void hr_cuda_device_close(hr_cuda_device *dev); /* NULL allowed */
const char *hr_cuda_device_name(const hr_cuda_device *dev);
/* free and total device memory now (cuMemGetInfo) */
hr_status hr_cuda_device_mem(hr_cuda_device *dev, uint64_t *free_bytes, uint64_t *total_bytes, hr_error *err);

/* The device arena: one allocation of `bytes` made at start, which every later hr_cuda_alloc carves
 * (256-byte aligned pieces, a stack: a freed piece's bytes come back once the pieces above it are
 * freed too), so nothing is allocated from the driver while serving and the total is known before the
 * first request. HR_ERR_BUDGET naming the free and total memory when the GPU cannot hold it. Without
 * one (tests), hr_cuda_alloc asks the driver each time. */
hr_status hr_cuda_arena_reserve(hr_cuda_device *dev, uint64_t bytes, hr_error *err);
/* its size, the bytes in use now and at most so far (zeros without an arena) */
void hr_cuda_arena_info(const hr_cuda_device *dev, uint64_t *size, uint64_t *used, uint64_t *peak);
/* what an allocation of `bytes` takes from the arena (rounded up to its alignment) */
uint64_t hr_cuda_arena_piece_bytes(uint64_t bytes);

/* Device memory, as 64-bit addresses (0: none). Each call makes dev's context current on the
 * calling thread first. */
hr_status hr_cuda_alloc(hr_cuda_device *dev, size_t bytes, uint64_t *out, hr_error *err);
void hr_cuda_free(hr_cuda_device *dev, uint64_t p); /* 0 allowed */
hr_status hr_cuda_upload(hr_cuda_device *dev, uint64_t dst, const void *src, size_t bytes, hr_error *err);
/* Page-locked host memory (cuMemHostAlloc): copies to and from it are DMA, with no staging copy
 * through the driver's own buffer. NULL with err set when the host cannot lock that much. */
void *hr_cuda_host_alloc(hr_cuda_device *dev, size_t bytes, hr_error *err);
void hr_cuda_host_free(hr_cuda_device *dev, void *p); /* NULL allowed */
hr_status hr_cuda_download(hr_cuda_device *dev, void *dst, uint64_t src, size_t bytes, hr_error *err);
hr_status hr_cuda_copy(hr_cuda_device *dev, uint64_t dst, uint64_t src, size_t bytes, hr_error *err);

/* Launches kernel `name` (an extern "C" entry of the kernels/ .cu files) on grid (gx, gy) of `threads` threads
 * with the kernel's arguments: args[i] points at the i-th argument's value (a device address as a
 * uint64_t, an int, a float, a struct by value), as cuLaunchKernel takes them (copied at the call).
 * Asynchronous: launches go to the device's one stream, created blocking, so the copies (synchronous,
 * on the legacy default stream) and hr_cuda_sync run in order with them and a download sees every
 * kernel before it; a kernel's fault shows at the next copy or sync (the environment's
 * HEADROOM_CUDA_SYNC=1 waits for each launch, naming the kernel that failed). HR_ERR_NOT_FOUND for a
 * name no module has. */
hr_status hr_cuda_launch(hr_cuda_device *dev, const char *name, unsigned gx, unsigned gy, unsigned threads, void **args,
                         hr_error *err);
/* waits for everything launched so far */
hr_status hr_cuda_sync(hr_cuda_device *dev, hr_error *err);
/* GPU time of the work launched between begin and end (events on the device's stream; end waits for
 * it), in milliseconds. One pair per device at a time. */
hr_status hr_cuda_time_begin(hr_cuda_device *dev, hr_error *err);
hr_status hr_cuda_time_end(hr_cuda_device *dev, double *ms, hr_error *err);

/* CUDA graphs: the launches between hr_cuda_graph_begin and hr_cuda_graph_end are recorded on the
 * device's stream (stream capture, thread-local mode), not run, and end makes them an executable
 * graph that hr_cuda_graph_launch replays as one submission, with the kernels' arguments as they were
 * at capture (device addresses, sizes: what changes per replay must be copied into the same device
 * buffers before the launch). No copy, synchronize or allocation between begin and end: the driver
 * refuses them and the capture fails at end. Graph objects are the driver's (host side), no device
 * arena memory. Available where the driver has the entry points (CUDA 11.4+). */
typedef struct hr_cuda_graph hr_cuda_graph;
bool hr_cuda_graphs_available(const hr_cuda_device *dev);
hr_status hr_cuda_graph_begin(hr_cuda_device *dev, hr_error *err);
/* ends the capture (always: the stream is back to running launches) and instantiates it; *out NULL
 * with err set when the driver refused something in it */
hr_status hr_cuda_graph_end(hr_cuda_device *dev, hr_cuda_graph **out, hr_error *err);
hr_status hr_cuda_graph_launch(hr_cuda_device *dev, const hr_cuda_graph *g, hr_error *err);
void hr_cuda_graph_free(hr_cuda_device *dev, hr_cuda_graph *g); /* NULL allowed */

/* ---- the arena plan (cuda_budget.c: pure arithmetic, no GPU needed) ----------------------------- */

#define HR_CUDA_DEFAULT_UTIL   0.9 /* --gpu-util's default: vLLM's gpu_memory_utilization */
#define HR_CUDA_SCRATCH_PIECES 27  /* the forward pass's device buffers (hr_cuda_scratch_pieces; 0 bytes: none) */

typedef struct hr_cuda_arena_query {
    const hr_hparams *hp;  /* the model's shape */
    uint64_t weight_bytes; /* the weights as the backend uploads them (hr_cuda_model_weight_bytes; the
                              planner: its estimate from the file) */
    int max_batch_tokens, max_ctx, block_size;
    uint64_t block_bytes;             /* one KV block (hr_kv_block_bytes) */
    uint64_t stage_bytes;             /* the q4/kivi2 tail buffers, all of them (hr_kv_fixed_bytes; 0: none) */
    uint64_t total_bytes, free_bytes; /* the driver's report at start (the planner: the profile's) */
    double util;                      /* the fraction of total_bytes the arena may take (0: the default) */
    uint64_t kv_budget;               /* > 0: the KV pool's bytes as asked (--kv-budget), not what is left */
    int n_blocks;                     /* > 0: exactly this many blocks (tests) */
    int n_groups;                     /* the KV layer groups (hr_kv_groups.n_groups; 0: 1): the forward pass
                                         keeps each group's slots, tables and windows */
} hr_cuda_arena_query;

typedef struct hr_cuda_arena_plan {
    uint64_t total_bytes, free_bytes; /* as queried */
    double util;
    uint64_t budget_bytes;                          /* util x total: what the arena may take */
    uint64_t weight_bytes, scratch_bytes, kv_bytes; /* the arena's parts (kv: blocks, the storage's write
                                                       rows and any tail buffers) */
    uint64_t arena_bytes;                           /* their sum: the one allocation */
    uint64_t block_bytes;
    int n_blocks; /* the KV pool's blocks */
} hr_cuda_arena_plan;

/* The arena for a model on a GPU: weights, the forward pass's scratch for max_batch_tokens rows and
 * max_ctx positions, and as many KV blocks as the rest of util x total holds (or kv_budget's, or
 * n_blocks). HR_ERR_BUDGET with one line naming the figures when no block fits, the asked pool does
 * not, or the arena is more than the free memory; HR_ERR_INVALID_ARG for a util outside (0, 1]. *out
 * is filled where it can be. */
hr_status hr_cuda_arena_plan_compute(const hr_cuda_arena_query *q, hr_cuda_arena_plan *out, hr_error *err);
/* The device bytes of the forward pass's buffers (out: HR_CUDA_SCRATCH_PIECES of them, in the order
 * the backend allocates them); returns their count. */
int hr_cuda_scratch_pieces(const hr_hparams *hp, int max_tokens, int max_ctx, int block_size, int n_groups,
                           uint64_t *out);
/* The host bytes of the forward pass's batch rows (slots, table rows, contexts, windows, the rows that
 * want logits, the token embedding's rows for a type the device does not look up) and of its pool of
 * n_threads host threads (model.h's hr_model_ctx_run_items: the engine's sampling): what --device cuda
 * holds on the host in place of the CPU forward pass's scratch (the runtime's memory plan). */
uint64_t hr_cuda_host_scratch_bytes(const hr_hparams *hp, int max_tokens, int max_ctx, int block_size, int n_groups,
                                    int n_threads);
/* The sequences under a token-level policy (h2o, snapkv) whose masks and scores a forward pass of up to
 * max_tokens rows holds on the device: 4, or the environment's HEADROOM_CUDA_TOKEN_SEQS, at most
 * max_tokens (a batch with more runs in pieces); and one sequence's masks (scores false: ceil(B / 64)
 * words a block, layer and KV head) or scores (B u64 each) for max_ctx positions. */
int hr_cuda_token_seqs(int max_tokens);
uint64_t hr_cuda_token_row_bytes(const hr_hparams *hp, int max_ctx, int block_size, bool scores);
/* the KV storage's rows for its host write op (a token's K and V, its slot, stage and fill) */
uint64_t hr_cuda_storage_stage_bytes(int n_kv_heads, int head_dim);
/* Attention's split of n queries of up to max_ctx positions (kernels/attention.cu): *n_splits splits
 * of *chunk positions, aiming at target_blocks thread blocks; and the scratch that takes. */
void hr_cuda_attn_split(int n_kv_heads, int n_heads, int n, int max_ctx, int target_blocks, int *n_splits, int *chunk);
uint64_t hr_cuda_attn_scratch_bytes(int n_kv_heads, int head_dim, int n_heads, int n, int max_ctx, int target_blocks);
/* 1024, or the environment's HEADROOM_CUDA_ATTN_BLOCKS (tuning, tests) */
int hr_cuda_attn_target_blocks(void);
/* Whether the GPU backend serves a model: its family (the features the kernels cover: llama, mistral,
 * qwen2, qwen3, phi3) from its shape alone, and with the weights every matrix's type (one with a GEMV
 * kernel). HR_OK, or HR_ERR_UNSUPPORTED with the one line `--device cuda` refuses it with. Window
 * layers beside full ones (several KV layer groups) are the pool's to say (hr_kv_config_groups). */
hr_status hr_cuda_check_hparams(const hr_hparams *hp, hr_error *err);
hr_status hr_cuda_check_model(const struct hr_model *m, hr_error *err);
/* the device bytes the backend uploads for a model (what create allocates for weights, norms, the
 * embedding table where the device looks it up, RoPE's table), in arena pieces */
uint64_t hr_cuda_model_weight_bytes(const struct hr_model *m);
/* The host bytes of a model's weights with --device cuda (the runtime's memory plan): create gives back
 * each uploaded matrix's host pages where the GGUF is a file mapping (hr_model_release_host), so what
 * stays is the file's metadata, the norms' f32 copies and what the device does not hold (a token
 * embedding of a type it does not look up); the whole file otherwise. And the bytes an instance gave
 * back (0 for another backend's). */
uint64_t hr_cuda_host_weight_bytes(const struct hr_model *m);
uint64_t hr_cuda_backend_host_released(const hr_model_ctx *c);

/* the oldest driver version (cuDriverGetVersion's 1000 major + 10 minor) that loads PTX text ptx (its
 * .version directive; 0: unknown), and that ISA version (*isa_major, *isa_minor; either may be NULL).
 * Open refuses a driver older than the embedded modules need, naming both versions. */
int hr_cuda_ptx_min_driver(const char *ptx, int *isa_major, int *isa_minor);

/* kernels/gemv.cu's launch shape: 8 output rows a thread block (grid.x = ceil(rows / 8)) and a tile of
 * up to HR_CUDA_GEMV_TOKENS tokens a grid row (grid.y = ceil(T / HR_CUDA_GEMV_TOKENS)): its
 * HR_K_GEMV_TT */
#define HR_CUDA_GEMV_ROWS   8
#define HR_CUDA_GEMV_TOKENS 8
/* the most tokens a forward pass takes (the arena plan and create refuse a larger max_batch_tokens): the GEMV's grid.y
 * at a GPU's limit of 65535; every other launch's grid stays inside its limits below this (docs/GPU.md,
 * "What the emulator enforces") */
#define HR_CUDA_MAX_BATCH_TOKENS (65535 * HR_CUDA_GEMV_TOKENS)

/* ---- the embedded kernels ----------------------------------------------------------------------- */

/* How many PTX modules this build embeds (0: built without clang-19), and module i's name (the .cu
 * file's stem) and text. */
int hr_cuda_n_modules(void);
const char *hr_cuda_module_ptx(int i, const char **name);

/* ---- the backend and the device KV storage -------------------------------------------------------- */

/* hr_model_ctx_params.backend_user: the GPU's ordinal (cuda:N), and the driver library (NULL:
 * libcuda.so.1; tests name a missing one). */
typedef struct hr_cuda_backend_params {
    int ordinal;
    const char *driver_lib;
    /* the GPU already opened (the runtime's, which its KV storage uses too; the backend borrows it), or
     * NULL: the backend opens ordinal through driver_lib and closes it on destroy */
    hr_cuda_device *dev;
} hr_cuda_backend_params;

extern const hr_backend_ops hr_backend_cuda;

/* Decode steps as CUDA graphs (docs/GPU.md): HEADROOM_CUDA_GRAPHS=1 at create turns them on (off by
 * default until a GPU measures them); this turns them on or off on a backend context made by
 * hr_backend_cuda (gpu_bench measures both on one runtime) and returns whether they are on now (false
 * where the driver lacks graphs or the context is another backend's). Turning them off frees the
 * graphs made so far. */
bool hr_cuda_backend_set_graphs(hr_model_ctx *ctx, bool on);

/* Greedy steps' ids picked on the device (hr_batch.argmax; HEADROOM_CUDA_ARGMAX=device at create) or
 * the logits copied down (host), on a context of hr_backend_cuda (gpu_bench measures both on one
 * runtime); returns whether the device picks now (false where the context is another backend's). */
bool hr_cuda_backend_set_argmax(hr_model_ctx *ctx, bool on);

/* Whether GPU `ordinal` can be opened (hr_cuda_device_open, then closed): what a front end checks
 * before loading a model for --device cuda[:N]. */
hr_status hr_cuda_probe(const char *driver_lib, int ordinal, hr_error *err);

/* A KV storage (kv/kv_storage.h) whose blocks live in one device allocation (the arena) of dev:
 * formats f32, f16, bf16, q8, fp8, q4h, q4 and kivi2 (K and V; q4 and kivi2 with their f16 stages on
 * the device too); dev must outlive it. Untested on a GPU so far (docs/GPU.md). */
hr_status hr_kv_storage_cuda_create(hr_cuda_device *dev, const hr_kv_storage_params *p, hr_kv_storage **out,
                                    hr_error *err);
/* The same as a pool's storage hook (hr_kv_config.storage, with storage_user the hr_cuda_device). */
hr_status hr_kv_storage_cuda_create_in(void *dev, const hr_kv_storage_params *p, hr_kv_storage **out, hr_error *err);
/* The device-side path (what the forward pass uses: nothing crosses to the host).
 * Writes n tokens' K and V, k and v device rows [n][Hkv * D] f32, into layer at the physical slots
 * slots[i] = block * B + t (a device int32 array of n), encoding each in the storage's formats on
 * the device (the same bytes the host write makes). A storage with stages (q4, kivi2) reads 3 n:
 * the slots, each token's stage (its block's tail buffer: hr_kv_write_slot_stage) and its fill
 * (hr_kv_storage_cuda_stage_batch's), the rows going to the stages and the blocks filled encoded. */
hr_status hr_kv_storage_cuda_write_dev(hr_kv_storage *st, int layer, uint64_t k, uint64_t v, uint64_t slots, int n,
                                       hr_error *err);
/* A step's writes with stages (q4, kivi2), before they run: rows [3][n] (host) holds the n tokens'
 * slots and stages; each token then counts as written in every layer (the forward pass writes every
 * layer of a token) and rows[2 n + i] says whether token i's write fills its block (write_dev then
 * encodes it). Upload the 3 n after. HR_OK and nothing done for a storage without stages;
 * HR_ERR_INVALID_ARG for a stage out of range or already full (nothing counted). */
hr_status hr_kv_storage_cuda_stage_batch(hr_kv_storage *st, int32_t *rows, int n, hr_error *err);
/* Device bytes of scratch hr_kv_storage_cuda_attend_dev needs for n queries of up to max_ctx
 * positions with n_heads query heads. */
uint64_t hr_kv_storage_cuda_attend_scratch(const hr_kv_storage *st, int n, int n_heads, int max_ctx);
/* Attention for n queries on the device: q [n][H][D] f32 (RoPE applied), tables [n][max_blocks]
 * int32 physical block ids (-1: dropped), n_ctx [n] int32 (positions [0, n_ctx) take part, each <=
 * max_ctx), out [n][H][D] f32; scratch: hr_kv_storage_cuda_attend_scratch(st, n, H, max_ctx) bytes.
 * Launched, not waited for. */
hr_status hr_kv_storage_cuda_attend_dev(hr_kv_storage *st, int layer, uint64_t q, uint64_t tables, int max_blocks,
                                        uint64_t n_ctx, int n, int max_ctx, int n_heads, float scale, float softcap,
                                        uint64_t out, uint64_t scratch, hr_error *err);
/* The same with query i reading table row qrow[i] (a device int32 array of n; 0: row i), so the
 * tokens of one sequence in a batch share one table row, and seeing only the positions its window
 * says (win: a device int32 array [n][2] of (sinks, lo) as hr_kv_seq_window gives them: t < sinks or
 * t >= lo; 0: every position); max_ctx is then the most positions a query sees. tails (q4, kivi2: a
 * device int32 array of n, 0 for none): the stage of each query's last block, whose positions it
 * reads from there when n_ctx % B != 0 (hr_kv_attn_query.tail_stage; -1: none). */
hr_status hr_kv_storage_cuda_attend_rows(hr_kv_storage *st, int layer, uint64_t q, uint64_t tables, int max_blocks,
                                         uint64_t qrow, uint64_t n_ctx, uint64_t win, uint64_t tails, int n,
                                         int max_ctx, int n_heads, float scale, float softcap, uint64_t out,
                                         uint64_t scratch, hr_error *err);
/* Prefill attention on the tensor cores (kernels/attn_prefill.cu). A run: at least
 * HR_CUDA_PREFILL_MIN_RUN consecutive rows of a batch, one sequence's, at consecutive positions. The
 * kernel takes runs cut into tiles of at most hr_cuda_prefill_tile_rows rows: int32 [4] entries
 * (first row, rows, table row, first position). hr_cuda_attn_runs writes a batch's, from its n rows'
 * table rows (qrow: one per sequence, so equal rows are one sequence) and positions, into out and
 * returns their count; out holds n entries at most (each tile has a row of its own). */
#define HR_CUDA_PREFILL_MIN_RUN 16
int hr_cuda_prefill_tile_rows(int n_heads, int n_kv_heads);
int hr_cuda_attn_runs(const int32_t *qrow, const int32_t *pos, int n, int tile_rows, int32_t *out);
/* attend_rows with a batch's runs: runs (host) and d_runs (the same on the device) n_runs tiles from
 * hr_cuda_attn_runs. Where the storage's prefill kernel is "mma" and the shape allows it (head_dim 8,
 * 16, 32, 64 or 128, q8 groups a multiple of 8), the runs' rows go to hr_k_attn_prefill and the rest, in stretches,
 * to the split kernels; otherwise every row to the split kernels (the runs unused). scratch: as
 * attend_rows's for n queries. */
/* The token masks of a batch's rows (the h2o and snapkv policies; kernels/kv.cuh): view [n][2] int32
 * per query row (its row of masks, -1: none; 1 where its softmax weights are accumulated), masks
 * [rows][max_blocks][L][Hkv][ceil(B / 64)] u64 (each row the manager's words, hr_kv_seq_token_mask),
 * scores [rows][max_blocks][L][Hkv][B] u64 (added to, in the manager's fixed point 2^-32: the caller
 * zeroes them first and gives them to hr_kv_seq_add_scores after), 0 when no row accumulates. Token
 * masks put every row on the split kernels (hr_k_attn_prefill takes none). */
typedef struct hr_kv_cuda_tokens {
    uint64_t view, masks, scores;
} hr_kv_cuda_tokens;
/* tok: the batch's token masks, NULL (or a 0 view) for none. */
hr_status hr_kv_storage_cuda_attend_runs(hr_kv_storage *st, int layer, uint64_t q, uint64_t tables, int max_blocks,
                                         uint64_t qrow, uint64_t n_ctx, uint64_t win, uint64_t tails, int n,
                                         int max_ctx, int n_heads, float scale, float softcap, const int32_t *runs,
                                         uint64_t d_runs, int n_runs, const hr_kv_cuda_tokens *tok, uint64_t out,
                                         uint64_t scratch, hr_error *err);
/* The prefill attention of a storage's later calls: "split" (the split kernels for every row, the
 * default until a GPU measures mma faster) or "mma" (hr_k_attn_prefill for runs); create takes
 * HEADROOM_CUDA_PREFILL_ATTN's. HR_ERR_INVALID_ARG for another name (the storage unchanged). */
hr_status hr_kv_storage_cuda_set_prefill_attn(hr_kv_storage *st, const char *name, hr_error *err);
/* whether attend_runs sends runs to hr_k_attn_prefill (mma chosen and the shape taken) with n_heads
 * query heads: the forward pass finds and uploads a batch's runs only then */
bool hr_kv_storage_cuda_prefill_on(const hr_kv_storage *st, int n_heads);
/* The attention kernel of a storage's later calls: "split" (hr_k_attn_split, the default) or "rows"
 * (hr_k_attn_split_rows where head_dim % 8 == 0); create takes HEADROOM_CUDA_ATTN_KERNEL's.
 * HR_ERR_INVALID_ARG for another name (the storage unchanged). */
hr_status hr_kv_storage_cuda_set_attn_kernel(hr_kv_storage *st, const char *name, hr_error *err);
/* the storage's arena and block size, for kernels that read it directly (tests) */
uint64_t hr_kv_storage_cuda_arena(const hr_kv_storage *st);
/* the device it lives on, and whether "rows" is its attention kernel now (a captured graph holds the
 * kernel it was captured with) */
hr_cuda_device *hr_kv_storage_cuda_device(const hr_kv_storage *st);
bool hr_kv_storage_cuda_attn_rows(const hr_kv_storage *st);
/* The first device failure of a storage op since create (the ops return nothing; their results were
 * zeros), or HR_OK. */
hr_status hr_kv_storage_cuda_check(const hr_kv_storage *st, hr_error *err);

#endif
