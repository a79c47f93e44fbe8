/* test_faults.c: fault injection at every point of a representative workload (fault build only:
 * cmake -DHR_FAULT=ON with ASan, `make faults`; other builds skip it).
 *
 * The workload, through the runtime API on the demo model (models/stories260K-q8_0.gguf): open the
 * runtime (model load, tokenizer, pool with a swap tier), run request A, then B, C and D together
 * in a pool too small for all of them (preemption by swap) where C repeats A's prompt (a prefix hit).
 * A clean run records each request's greedy tokens and how many allocations, swap writes and swap
 * reads it made. Then for every point and every N in 1..calls, the Nth call fails and the run must
 * end cleanly: the open fails with a reason, or each request completes with exactly its clean
 * tokens or fails with a reason; the pool holds no blocks once the requests are released, its
 * invariants hold, and LeakSanitizer (at exit) finds nothing. The HTTP part fails the Nth socket
 * write of a plain and a streamed completion: the client may see a cut answer, but the server then
 * answers the next request and its pool drains. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
#include "harness.h"
#include "runtime/runtime_parts.h"

#if !HR_FAULT
int main(void) { HR_SKIP("needs the fault build (cmake -DHR_FAULT=ON; make faults)"); }
#else

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "server/server.h"

#define N_REQ   4
#define MAX_OUT 48

typedef struct outcome {
    bool opened;
    int n_completed, n_failed;
    int n_ids[N_REQ];
    int32_t ids[N_REQ][MAX_OUT];
    int prefix_hits, swaps_out;
} outcome;

static const char *k_model = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
static const char k_prompt_a[] = "Once upon a time, there was a little girl named Lily. She loved to play outside "
                                 "in the park with her friends.";
static const char *const k_prompts[N_REQ] = {k_prompt_a, "The big brown dog ran to the river", k_prompt_a,
                                             "One day, a boy found a shiny red ball"};

static hr_runtime_params workload_params(void) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = k_model;
    p.n_ctx = 128;
    p.block_size = 16;
    p.kv_blocks = 8; /* three requests of ~5 blocks each cannot all stay */
    p.max_running = 3;
    p.max_batch_tokens = 64;
    p.admission = HR_RT_ADMIT_OPTIMISTIC; /* admit on the prompt alone: growth preempts */
    p.preempt = HR_RT_PREEMPT_SWAP;
    p.swap_space = 1u << 20;
    p.n_threads = 1;
    return p;
}

/* Runs the workload once. A failure it cannot blame on the injected fault is a CHECK failure. */
static void workload(outcome *o) {
    memset(o, 0, sizeof *o);
    hr_runtime_params p = workload_params();
    hr_runtime *rt = NULL;
    hr_error err = {0};
    if (hr_runtime_open(&p, &rt, NULL, &err) != HR_OK) {
        CHECKF(err.msg[0] != '\0', "open failed without a reason");
        return;
    }
    o->opened = true;
    hr_rt_request *req[N_REQ] = {0};
    for (int i = 0; i < N_REQ; i++) {
        hr_rt_request_params rp = {.prompt = k_prompts[i], .max_tokens = 40};
        rp.sampling = hr_rt_sampling_default();
        rp.sampling.temperature = 0;
        rp.ignore_eos = true;
        if (hr_runtime_submit(rt, &rp, &req[i], &err) != HR_OK) {
            CHECKF(err.msg[0] != '\0', "submit %d refused without a reason", i);
            req[i] = NULL;
        }
        /* A runs alone first, so that C finds its prompt in the prefix cache */
        if (i == 0 || i == N_REQ - 1) CHECKF(hr_runtime_run_until_idle(rt, &err) == HR_OK, "run: %s", err.msg);
    }
    for (int i = 0; i < N_REQ; i++) {
        if (!req[i]) { /* refused at submit, with its reason */
            o->n_failed++;
            o->n_ids[i] = -1;
            continue;
        }
        hr_rt_result r;
        hr_rt_request_result(req[i], &r);
        if (r.state == HR_RT_COMPLETED) {
            o->n_completed++;
            o->n_ids[i] = r.n_ids < MAX_OUT ? r.n_ids : MAX_OUT;
            memcpy(o->ids[i], r.ids, sizeof(int32_t) * (size_t)o->n_ids[i]);
            o->prefix_hits += r.kv.prefix_hit_tokens;
            o->swaps_out += r.kv.preempt_swaps;
        } else {
            CHECKF(r.state == HR_RT_FAILED, "request %d ended %s", i, hr_rt_state_name(r.state));
            CHECKF(r.error && r.error[0], "request %d failed without a reason", i);
            o->n_failed++;
            o->n_ids[i] = -1;
        }
        hr_rt_request_release(rt, req[i]);
    }
    /* the checks below allocate: they stop the counting (calls so far stay readable) */
    for (int pt = 0; pt < HR_FAULT_N_POINTS; pt++) hr_fault_disarm((hr_fault_point)pt);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(hr_runtime_kv(rt), &l);
    CHECKF(l.blocks_used == 0, "%d blocks still used after every request was released", l.blocks_used);
    CHECKF(l.bytes_swapped == 0, "%llu bytes still in the swap tier", (unsigned long long)l.bytes_swapped);
    CHECKF(hr_kv_pool_check(hr_runtime_kv(rt), &err) == HR_OK, "pool invariants: %s", err.msg);
    hr_runtime_close(rt);
}

static void walk_point(hr_fault_point pt, const outcome *ref, long *injected) {
    hr_fault_arm(pt, 0);
    outcome o;
    workload(&o);
    long calls = hr_fault_calls(pt);
    hr_fault_disarm(pt);
    CHECKF(calls > 0, "the workload never reached %s", hr_fault_point_name(pt));
    int failed_before = hr_test_failed;
    for (long n = 1; n <= calls; n++) {
        hr_fault_arm(pt, n);
        workload(&o);
        bool fired = hr_fault_fired(pt);
        hr_fault_disarm(pt);
        *injected += fired;
        for (int i = 0; o.opened && i < N_REQ; i++) {
            if (o.n_ids[i] < 0) continue; /* failed with its reason */
            CHECKF(o.n_ids[i] == ref->n_ids[i] &&
                       !memcmp(o.ids[i], ref->ids[i], sizeof(int32_t) * (size_t)ref->n_ids[i]),
                   "%s #%ld: request %d completed with other tokens than the clean run", hr_fault_point_name(pt), n, i);
        }
        if (hr_test_failed > failed_before) {
            fprintf(stderr, "  (first failure at %s call %ld of %ld)\n", hr_fault_point_name(pt), n, calls);
            return;
        }
    }
    printf("%s: %ld calls, each failed in turn: clean\n", hr_fault_point_name(pt), calls);
}

/* ---- HTTP: the Nth socket write ----------------------------------------------------------------- */

/* Sends req with write() (not send(), which the fault build interposes for the server) and reads
 * the answer until the server closes; returns the bytes read (into buf, NUL-terminated) or -1. */
static long http(int port, const char *req, char *buf, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    long got = -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, req, strlen(req)) == (ssize_t)strlen(req)) {
        got = 0;
        ssize_t r;
        while ((size_t)got + 1 < cap && (r = read(fd, buf + got, cap - 1 - (size_t)got)) > 0) got += r;
        buf[got] = '\0';
    }
    close(fd);
    return got;
}

static const char *k_bodies[2] = {
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}",
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"stream\":true}"};

static void post(int port, int which, char *buf, size_t cap, long *got) {
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(k_bodies[which]), k_bodies[which]);
    *got = http(port, req, buf, cap);
}

static void test_socket_writes(long *injected) {
    hr_runtime_params p = workload_params();
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK && hr_runtime_start(rt, &err) == HR_OK, "%s", err.msg);
    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    sp.drain_timeout_s = 5;
    hr_server *srv = NULL;
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "%s", err.msg);
    if (!srv) {
        hr_runtime_close(rt);
        return;
    }
    int port = hr_server_port(srv);
    static char buf[1 << 16], ref[2][1 << 16];
    for (int w = 0; w < 2; w++) {
        long got;
        hr_fault_arm(HR_FAULT_SOCKET_WRITE, 0);
        post(port, w, ref[w], sizeof ref[w], &got);
        long calls = hr_fault_calls(HR_FAULT_SOCKET_WRITE);
        hr_fault_disarm(HR_FAULT_SOCKET_WRITE);
        CHECKF(got > 0 && strstr(ref[w], "200 OK"), "clean %s request: %s", w ? "streamed" : "plain", ref[w]);
        CHECKF(calls > 0, "no socket write counted");
        for (long n = 1; n <= calls; n++) {
            hr_fault_arm(HR_FAULT_SOCKET_WRITE, n);
            post(port, w, buf, sizeof buf, &got);
            *injected += hr_fault_fired(HR_FAULT_SOCKET_WRITE);
            hr_fault_disarm(HR_FAULT_SOCKET_WRITE);
            /* the server still answers, and every request it took ends (bounded wait) */
            post(port, 0, buf, sizeof buf, &got);
            CHECKF(got > 0 && strstr(buf, "200 OK"), "%s write %ld: the next request got: %.200s",
                   w ? "streamed" : "plain", n, buf);
            for (int t = 0; t < 600 && hr_server_n_inflight(srv) > 0; t++) usleep(50 * 1000);
            CHECKF(hr_server_n_inflight(srv) == 0, "requests still in flight after a failed write");
        }
        printf("socket-write (%s): %ld calls, each failed in turn: server fine\n", w ? "streamed" : "plain", calls);
    }
    hr_server_shutdown(srv);
    hr_server_destroy(srv);
    hr_runtime_stop(rt);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(hr_runtime_kv(rt), &l);
    CHECKF(l.blocks_used == 0, "%d blocks still used after the server stopped", l.blocks_used);
    hr_runtime_close(rt);
}

int main(void) {
    const char *only = getenv("HR_FAULT_ONLY"); /* "alloc:83": replay one injection (with HR_FAULT_TRACE=1) */
    if (only) {
        outcome ref, o;
        workload(&ref);
        long n = atol(strchr(only, ':') ? strchr(only, ':') + 1 : "0");
        hr_fault_point pt = !strncmp(only, "alloc", 5)         ? HR_FAULT_ALLOC
                            : !strncmp(only, "swap-write", 10) ? HR_FAULT_SWAP_WRITE
                                                               : HR_FAULT_SWAP_READ;
        hr_fault_arm(pt, n);
        workload(&o);
        hr_fault_disarm(pt);
        for (int i = 0; i < N_REQ; i++)
            printf("request %d: %d ids (clean %d), %s\n", i, o.n_ids[i], ref.n_ids[i],
                   o.n_ids[i] == ref.n_ids[i] && !memcmp(o.ids[i], ref.ids[i], sizeof(int32_t) * (size_t)ref.n_ids[i])
                       ? "same"
                       : "DIFFERENT");
        return hr_test_finish();
    }
    FILE *f = fopen(k_model, "rb");
    if (!f) HR_SKIP("%s is missing", k_model);
    fclose(f);
    outcome ref;
    workload(&ref);
    CHECK(ref.opened && ref.n_completed == N_REQ);
    CHECKF(ref.prefix_hits > 0, "the workload had no prefix hit");
    CHECKF(ref.swaps_out > 0, "the workload had no preemption by swap");
    for (int i = 0; i < N_REQ; i++) CHECK(ref.n_ids[i] == 40);
    if (hr_test_failed) return hr_test_finish();
    long injected = 0;
    walk_point(HR_FAULT_SWAP_WRITE, &ref, &injected);
    walk_point(HR_FAULT_SWAP_READ, &ref, &injected);
    walk_point(HR_FAULT_ALLOC, &ref, &injected);
    test_socket_writes(&injected);
    printf("faults injected: %ld\n", injected);
    return hr_test_finish();
}
#endif
