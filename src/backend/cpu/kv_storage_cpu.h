/* kv_storage_cpu.h: the CPU KV storage: the cache's bytes in one page-aligned mapping of host memory
 * (allocated once, never grown), the format kernels (scalar reference and AVX2) and paged attention,
 * behind the storage interface the KV manager uses (kv/kv_storage.h). */
#ifndef HR_BACKEND_CPU_KV_STORAGE_CPU_H
#define HR_BACKEND_CPU_KV_STORAGE_CPU_H

#include "common/status.h"
#include "kv/kv_storage.h"

/* Maps n_blocks blocks and n_stage tail buffers (prefault: resident now). The kernels are p->isa's
 * ("scalar"; "avx2" or "avx512": the AVX2/FMA/F16C ones, which the caller has checked the CPU has).
 * HR_ERR_INVALID_ARG for another isa name or a bad shape, HR_ERR_NOMEM when the memory cannot be
 * mapped (the message says how much, for how many blocks). */
hr_status hr_kv_storage_cpu_create(const hr_kv_storage_params *p, hr_kv_storage **out, hr_error *err);
/* Host bytes it allocates besides the mapping (its header and the tail buffers' fill counts), for
 * n_layers and n_stage tail buffers: what the budget counts with the manager's tables. Pure. */
uint64_t hr_kv_storage_cpu_meta_bytes(int n_layers, int n_stage);

#endif
