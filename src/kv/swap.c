/* swap.c: the swap tier (filled in below). */
#include "kv/kv_internal.h"

void kv_swap_drop(hr_kv_pool *p, kv_seq *s) {
    (void)p;
    s->swapped = false;
}
