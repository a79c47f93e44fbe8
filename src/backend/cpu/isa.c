/* isa.c: the CPU's features (cpuid and the OS's saved state, probed once) and the one choice of ISA
 * every CPU kernel family follows (isa.h). */
#include "backend/cpu/isa.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static hr_cpu_features probe(void) {
    hr_cpu_features f = {0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool osxsave = (c >> 27) & 1;
    if (!osxsave) return f;
    const uint64_t xcr0 = read_xcr0();
    const bool os_avx = (xcr0 & 0x6) == 0x6;                /* XMM and YMM state */
    const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    const bool avx = (c >> 28) & 1;
    f.fma = os_avx && ((c >> 12) & 1);
    f.f16c = os_avx && ((c >> 29) & 1);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.avx2 = os_avx && avx && ((b >> 5) & 1);
        f.avx512f = os_avx512 && ((b >> 16) & 1);
        f.avx512bw = os_avx512 && ((b >> 30) & 1);
        f.avx512vl = os_avx512 && ((b >> 31) & 1);
        f.avx512vnni = os_avx512 && ((c >> 11) & 1);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avxvnni = os_avx && ((a >> 4) & 1);
    return f;
}
#else
static hr_cpu_features probe(void) {
    hr_cpu_features f = {0};
    return f;
}
#endif

static hr_cpu_features g_features;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void probe_once(void) { g_features = probe(); }

hr_cpu_features hr_cpu_detect(void) {
    pthread_once(&g_once, probe_once);
    return g_features;
}

static bool has_avx2(hr_cpu_features f) { return f.avx2 && f.fma && f.f16c; }
static bool has_avx512(hr_cpu_features f) { return has_avx2(f) && f.avx512f && f.avx512bw && f.avx512vl; }

bool hr_cpu_isa_available(hr_cpu_features f, const char *isa) {
    hr_cpu_isa i;
    if (!hr_cpu_isa_parse(isa, &i)) return false;
    return i == HR_CPU_ISA_SCALAR || (i == HR_CPU_ISA_AVX2 && has_avx2(f)) || (i == HR_CPU_ISA_AVX512 && has_avx512(f));
}

hr_cpu_isa hr_cpu_isa_choose(hr_cpu_features f, const char *force_isa) {
    hr_cpu_isa want = HR_CPU_ISA_AVX512; /* best available unless forced lower */
    if (force_isa && !hr_cpu_isa_parse(force_isa, &want)) want = HR_CPU_ISA_AVX512;
    if (want >= HR_CPU_ISA_AVX512 && has_avx512(f)) return HR_CPU_ISA_AVX512;
    if (want >= HR_CPU_ISA_AVX2 && has_avx2(f)) return HR_CPU_ISA_AVX2;
    return HR_CPU_ISA_SCALAR;
}

hr_cpu_isa hr_cpu_isa_select(const char *force_isa) { return hr_cpu_isa_choose(hr_cpu_detect(), force_isa); }

static const char *const names[] = {"scalar", "avx2", "avx512"};

const char *hr_cpu_isa_name(hr_cpu_isa isa) {
    return (unsigned)isa < sizeof names / sizeof names[0] ? names[isa] : "scalar";
}

bool hr_cpu_isa_parse(const char *name, hr_cpu_isa *out) {
    if (!name) return false;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(name, names[i])) {
            *out = (hr_cpu_isa)i;
            return true;
        }
    return false;
}
