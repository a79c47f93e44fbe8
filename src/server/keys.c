/* keys.c: the API-key list (`--api-key` may name several keys, each a tenant) and the constant-time
 * check of a presented key against it. */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

hr_status hr_server_keys_parse(const char *list, char ***keys, int *n_keys, hr_error *err) {
    *keys = NULL;
    *n_keys = 0;
    if (!list || !*list) return HR_OK;
    int n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    char **v = calloc((size_t)n, sizeof *v);
    if (!v) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the API keys");
    int k = 0;
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && (*p == ' ' || *p == '\t')) p++, len--; /* "k1, k2" */
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len == 0) {
            hr_server_keys_free(v, k);
            return hr_error_set(err, HR_ERR_INVALID_ARG, "API key %d of the list is empty", k + 1);
        }
        if (!(v[k] = strndup(p, len))) {
            hr_server_keys_free(v, k);
            return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the API keys");
        }
        k++;
        if (!end) break;
        p = end + 1;
    }
    *keys = v;
    *n_keys = k;
    return HR_OK;
}

void hr_server_keys_free(char **keys, int n_keys) {
    for (int i = 0; i < n_keys; i++) free(keys[i]);
    free(keys);
}

/* Compares in time independent of where the strings differ (the length still shows). */
static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)(a[i] ^ b[i < lb ? i : 0]);
    return diff == 0 && lb > 0;
}

int hr_server_keys_match(char *const *keys, int n_keys, const char *presented) {
    int found = -1;
    for (int i = 0; i < n_keys; i++) /* every key is compared: the time does not say which matched */
        if (same_secret(keys[i], presented) && found < 0) found = i;
    return found;
}
