/* probe.c: asks a server, before a run, how long a context it holds (GET /v1/models), so that a
 * pattern can be fitted to a small model instead of every request being refused for its length. */
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

typedef struct {
    char *d;
    size_t n;
} body;

static size_t on_write(char *d, size_t size, size_t nmemb, void *user) {
    body *b = user;
    size_t n = size * nmemb;
    if (b->n + n > (1u << 20)) return 0; /* a model list is small: more is not one */
    char *g = realloc(b->d, b->n + n + 1);
    if (!g) return 0;
    memcpy(g + b->n, d, n);
    b->n += n;
    g[b->n] = '\0';
    b->d = g;
    return n;
}

static int int_at(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)
               ? (int)json_integer_value(v)
               : 0;
}

void hr_bench_probe_context(const char *url, const char *api_key, double timeout_s, int *n_ctx) {
    *n_ctx = 0;
    char base[1024], full[1100], auth[1100];
    snprintf(base, sizeof base, "%s", url);
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/') base[--bl] = '\0';
    if (bl >= 3 && !strcmp(base + bl - 3, "/v1")) base[bl -= 3] = '\0';
    snprintf(full, sizeof full, "%s/v1/models", base);
    CURL *h = curl_easy_init();
    if (!h) return;
    body b = {0};
    struct curl_slist *hdr = NULL;
    if (api_key && *api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        hdr = curl_slist_append(hdr, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    long code = 0;
    if (curl_easy_perform(h) == CURLE_OK && curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK &&
        code == 200 && b.d) {
        json_t *root = json_loads(b.d, 0, NULL);
        json_t *m = json_array_get(json_object_get(root, "data"), 0);
        if (json_is_object(m)) {
            int n = int_at(m, "meta", "n_ctx");
            if (!n) n = int_at(m, "max_model_len", NULL);
            if (!n) n = int_at(m, "meta", "n_ctx_train");
            *n_ctx = n;
        }
        json_decref(root);
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    free(b.d);
}
