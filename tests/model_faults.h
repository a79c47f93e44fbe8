/* model_faults.h: the fault build's check that loading a model image and creating its forward context
 * with the Nth allocation failing, for every N the clean run makes, ends in a clean error (or success)
 * and leaks nothing (LeakSanitizer at exit). Shared by the family tests (test_model_arch,
 * test_model_mla, test_model_gptoss); include after harness.h, in HR_FAULT builds only. */
#ifndef HR_TESTS_MODEL_FAULTS_H
#define HR_TESTS_MODEL_FAULTS_H

#include <stdio.h>

#include "common/fault.h"
#include "harness.h"
#include "kv/kv.h"
#include "model/model.h"

static void check_model_alloc_faults(const void *mem, size_t n, const char *what) {
    long calls = -1;
    int failed = 0;
    for (long nth = 0; nth == 0 || nth <= calls; nth++) {
        hr_error err = {0};
        hr_gguf *g = NULL;
        hr_model *m = NULL;
        hr_kv_pool *kv = NULL;
        hr_model_ctx *c = NULL;
        hr_fault_arm(HR_FAULT_ALLOC, nth);
        hr_status st = hr_gguf_open_memory(mem, n, &g, &err);
        if (!st) st = hr_model_load_gguf(g, &m, &err);
        if (!st) {
            const hr_hparams *hp = hr_model_hparams(m);
            hr_kv_config kc = {.n_layers = hp->n_layer,
                               .n_kv_heads = hp->n_head_kv,
                               .head_dim = hp->head_dim,
                               .v_from_k = hp->kv_lora_rank,
                               .block_size = 16,
                               .k_format = HR_KV_F16,
                               .v_format = HR_KV_F16,
                               .max_seqs = 1};
            kc.budget_bytes = hr_kv_block_bytes(&kc) * 4;
            hr_model_ctx_params mp = {.n_threads = 1, .max_batch_tokens = 4, .max_ctx = 32};
            st = hr_kv_pool_create(&kc, &kv, &err);
            if (!st) st = hr_model_ctx_create(m, kv, &mp, &c, &err);
        }
        if (nth == 0) calls = hr_fault_calls(HR_FAULT_ALLOC);
        hr_fault_disarm(HR_FAULT_ALLOC);
        CHECKF(nth == 0 ? st == HR_OK : (st == HR_OK || err.msg[0]), "%s, allocation %ld: status %d, no message", what,
               nth, st);
        failed += st != HR_OK;
        hr_model_ctx_destroy(c);
        hr_kv_pool_destroy(kv);
        hr_model_destroy(m);
    }
    CHECK(calls > 0 && failed > 0);
    printf("%s: %ld allocations, each failed once: %d clean errors\n", what, calls, failed);
}

#endif
