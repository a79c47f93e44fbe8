/* isa.h: the CPU backend's one feature dispatcher. The CPU is probed once; --isa (force_isa) picks a
 * lower ISA or asks for every AVX-512 entry; the result is one hr_cpu_isa that every CPU kernel
 * family takes: the matmul tables (kernels.h: hr_kernels_init) and the KV storage's formats and
 * attention (which have scalar and AVX2 builds: AVX2 where the ISA is AVX2 or above). So
 * `--isa scalar` makes every kernel scalar, attention included. (The sampler's passes over the logits,
 * src/sampler/scan.h, take AVX2 by the CPU alone: they only compare, so they choose the same ids.)
 *
 * Rule kept from before the dispatcher was one: the default never picks a path that was not measured
 * faster (on an AVX-512 CPU the default is HR_CPU_ISA_AVX512, under which each table takes only the
 * AVX-512 entries measured faster than AVX2, and AVX2 for the rest; see kernels.c). */
#ifndef HR_BACKEND_CPU_ISA_H
#define HR_BACKEND_CPU_ISA_H

#include <stdbool.h>

typedef struct hr_cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avxvnni;
} hr_cpu_features;

/* The features of this CPU (and of its OS's saved register state); probed once, then cached. */
hr_cpu_features hr_cpu_detect(void);

typedef enum hr_cpu_isa {
    HR_CPU_ISA_SCALAR = 0, /* portable C: the reference reduction orders */
    HR_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    HR_CPU_ISA_AVX512 = 2, /* AVX2's plus AVX512F/BW/VL (and VNNI for the entries that use it) */
} hr_cpu_isa;

/* The ISA for force_isa on a CPU with features f: NULL (or "auto") is the best available (AVX-512
 * where the CPU has it: each kernel family then takes only what was measured faster there);
 * "scalar", "avx2", "avx512" pick that one, clamped down to what the CPU has. Other names: as NULL
 * (the CLI rejects them before; hr_cpu_isa_parse tells). */
hr_cpu_isa hr_cpu_isa_choose(hr_cpu_features f, const char *force_isa);
/* hr_cpu_isa_choose for this CPU: the one call every consumer makes with the run's --isa (the CPU
 * backend's kernel tables; the CPU KV storage takes its result as a creation parameter). */
hr_cpu_isa hr_cpu_isa_select(const char *force_isa);
/* Whether `isa` ("scalar", "avx2", "avx512") can run on a CPU with features f (false for other names). */
bool hr_cpu_isa_available(hr_cpu_features f, const char *isa);
/* "scalar", "avx2", "avx512". */
const char *hr_cpu_isa_name(hr_cpu_isa isa);
/* The ISA named `name`; false for a name that is none of the three. */
bool hr_cpu_isa_parse(const char *name, hr_cpu_isa *out);
/* Whether a kernel family whose fastest build is AVX2 (the KV formats and attention) runs it under
 * isa: true for AVX2 and AVX-512. */
static inline bool hr_cpu_isa_has_avx2(hr_cpu_isa isa) { return isa >= HR_CPU_ISA_AVX2; }

#endif
