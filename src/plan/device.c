/* device.c: what the planner plans against: this machine (memory from /proc/meminfo, bandwidth
 * measured), GPU profiles from their datasheets, this machine's GPU as its driver reports it, or figures
 * given by hand. docs/PLAN.md cites the
 * source of every number in the table below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cuda/cuda.h"
#include "common/util.h"
#include "plan/plan.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)

/* Memory: the total the driver reports (nvidia-smi memory.total, MiB). Bandwidth: the datasheet's
 * peak, GB/s; dense bf16 tensor TFLOP/s (no sparsity). Reserved: what a CUDA process takes before its first tensor
 * (context, cuBLAS/cuBLASLt workspaces): an estimate, docs/PLAN.md "GPU profiles". Driver: the name the
 * driver gives the card (nvidia-smi's name, cuDeviceGetName), which names the profile as well; another
 * variant of the card (H100 PCIe, A100 PCIe: other memory or bandwidth) has a name of its own and no
 * profile. */
static const struct gpu_profile {
    const char *name, *label, *driver;
    uint64_t mem_mib;
    double bw_gbps, tflops;
    uint64_t reserved_mib;
} gpus[] = {
    {"h200", "NVIDIA H200 141GB (SXM)", "NVIDIA H200", 143771, 4800, 989, 1024},
    {"h100-80gb", "NVIDIA H100 80GB (SXM, HBM3)", "NVIDIA H100 80GB HBM3", 81559, 3350, 989, 1024},
    {"a100-80gb", "NVIDIA A100 80GB (SXM)", "NVIDIA A100-SXM4-80GB", 81920, 2039, 312, 1024},
    {"a100-40gb", "NVIDIA A100 40GB (SXM)", "NVIDIA A100-SXM4-40GB", 40960, 1555, 312, 1024},
    {"l40s", "NVIDIA L40S 48GB", "NVIDIA L40S", 46068, 864, 362, 768},
    {"l4", "NVIDIA L4 24GB", "NVIDIA L4", 23034, 300, 121, 768},
    {"rtx4090", "NVIDIA GeForce RTX 4090 24GB", "NVIDIA GeForce RTX 4090", 24564, 1008, 165, 768},
};

const char *hr_plan_device_names(void) { return "host, h200, h100-80gb, a100-80gb, a100-40gb, l40s, l4, rtx4090"; }

hr_status hr_plan_device_by_name(const char *name, hr_plan_device *out, hr_error *err) {
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++) {
        if (strcasecmp(name, gpus[i].name) && strcasecmp(name, gpus[i].driver)) continue;
        *out = (hr_plan_device){.gpu = true,
                                .mem_bytes = gpus[i].mem_mib * MIB,
                                .util = 0.9,
                                .bw_gbps = gpus[i].bw_gbps,
                                .tflops = gpus[i].tflops,
                                .reserved_bytes = gpus[i].reserved_mib * MIB,
                                .source = "datasheet (docs/PLAN.md)"};
        snprintf(out->name, sizeof out->name, "%s", gpus[i].label);
        return HR_OK;
    }
    return hr_error_set(err, HR_ERR_NOT_FOUND,
                        "unknown device '%s' (known: %s, or the name the driver gives one of them, as "
                        "nvidia-smi prints it); for another, give its memory and bandwidth by hand: "
                        "--device-mem SIZE --device-bw GBPS",
                        name, hr_plan_device_names());
}

hr_status hr_plan_device_cuda(int ordinal, const char *driver_lib, hr_plan_device *out, hr_error *err) {
    hr_cuda_device *dev = NULL;
    uint64_t fr = 0, tot = 0;
    hr_status st = hr_cuda_device_open(driver_lib, ordinal, &dev, err);
    if (!st) st = hr_cuda_device_mem(dev, &fr, &tot, err);
    if (!st) {
        hr_plan_device prof;
        const bool known = hr_plan_device_by_name(hr_cuda_device_name(dev), &prof, NULL) == HR_OK;
        *out = (hr_plan_device){.gpu = true,
                                .mem_bytes = tot,
                                .util = 0.9,
                                .bw_gbps = known ? prof.bw_gbps : 0,
                                .tflops = known ? prof.tflops : 0,
                                .reserved_bytes = tot - HR_MIN(fr, tot),
                                .from_driver = true,
                                .source = known ? "the driver (memory), datasheet (bandwidth: docs/PLAN.md)"
                                                : "the driver (memory; no datasheet profile: --device-bw)"};
        snprintf(out->name, sizeof out->name, "%s (cuda:%d)", hr_cuda_device_name(dev), ordinal);
    }
    hr_cuda_device_close(dev);
    return st;
}

/* "MemAvailable:  123456 kB" from /proc/meminfo; 0 when absent. */
static uint64_t meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            kb = strtoull(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

double hr_plan_measure_bw(size_t bytes) {
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *p = mmap(NULL, n * sizeof *p, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 0;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n * sizeof *p, MADV_HUGEPAGE); /* as the resident weights are held */
#endif
    for (size_t i = 0; i < n; i++) p[i] = i;
    double best = 0;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 2; rep++) {
        double t0 = hr_time_now();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= n; i += 4) {
            if (i % 8 == 0) __builtin_prefetch(p + i + 512); /* 4 KiB ahead, as the decode kernels read */
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
        sink += s0 + s1 + s2 + s3;
        double dt = hr_time_now() - t0;
        if (dt > 0 && (double)(n * sizeof *p) / dt / 1e9 > best) best = (double)(n * sizeof *p) / dt / 1e9;
    }
    (void)sink;
    munmap(p, n * sizeof *p);
    return best;
}

hr_status hr_plan_device_host(bool measure_bw, hr_plan_device *out, hr_error *err) {
    uint64_t avail = meminfo_kb("MemAvailable"), total = meminfo_kb("MemTotal");
    if (!avail) avail = total;
    if (!avail)
        return hr_error_set(err, HR_ERR_IO,
                            "cannot read this machine's memory from /proc/meminfo: give --device-mem SIZE");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    *out = (hr_plan_device){.gpu = false,
                            .mem_bytes = avail * 1024,
                            .util = 1.0,
                            .bw_gbps = measure_bw ? hr_plan_measure_bw(256 * MIB) : 0,
                            .bw_measured = measure_bw,
                            .reserved_bytes = HR_MEM_BASE_BYTES,
                            .source = "/proc/meminfo MemAvailable; bandwidth measured (256 MiB stream)"};
    char tot[32];
    snprintf(out->name, sizeof out->name, "this machine (%ld cores, %s RAM)", cores,
             hr_format_size(total * 1024, tot, sizeof tot));
    return HR_OK;
}
