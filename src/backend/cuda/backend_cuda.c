/* backend_cuda.c: the CUDA backend's ops (backend/backend.h). Today create opens the GPU (driver,
 * device, context, kernel modules) and then refuses: the forward pass that chains the kernels over a
 * device KV storage is the next step (docs/GPU.md), and a backend that cannot compute must not
 * pretend to. Every refusal is one line beginning "CUDA: ". */
#include <stdlib.h>

#include "backend/cuda/cuda.h"

typedef struct cuda_ctx {
    hr_backend_base base; /* first: the seam dispatches on it */
    hr_cuda_device *dev;
} cuda_ctx;

static hr_status cuda_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                             hr_error *err) {
    const hr_cuda_backend_params *cp = p->backend_user;
    hr_cuda_device *dev = NULL;
    hr_status st = hr_cuda_device_open(cp ? cp->driver_lib : NULL, cp ? cp->ordinal : 0, &dev, err);
    if (st) return st;
    st = hr_error_set(err, HR_ERR_UNSUPPORTED,
                      "CUDA: %s opened, but the forward pass on the GPU is not written yet (docs/GPU.md)",
                      hr_cuda_device_name(dev));
    hr_cuda_device_close(dev);
    return st;
}

static void cuda_destroy(hr_model_ctx *c) {
    if (!c) return;
    cuda_ctx *x = (cuda_ctx *)(void *)c;
    hr_cuda_device_close(x->dev);
    free(x);
}

static hr_status cuda_forward(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err) {
    return hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA: the forward pass on the GPU is not written yet");
}

static const char *cuda_isa(const hr_model_ctx *c) { return "sm_90a"; }

const hr_backend_ops hr_backend_cuda = {
    .name = "cuda",
    .create = cuda_create,
    .destroy = cuda_destroy,
    .forward = cuda_forward,
    .isa = cuda_isa,
    /* weights and scratch live on the GPU: host memory for them is none (the device arena is sized by
     * hr_cuda_device_mem's figures, once the forward pass exists) */
    .weight_bytes = NULL,
    .scratch_bytes = NULL,
};
