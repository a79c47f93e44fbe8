/* bench_internal.h: what the bench module's files share and callers do not need. */
#ifndef HR_BENCH_BENCH_INTERNAL_H
#define HR_BENCH_BENCH_INTERNAL_H

#include <stdint.h>

/* n_words words from the bench word list, drawn by an RNG seeded with seed; malloc'd, NULL when memory
 * ran out. */
char *hr_bench_words_text(uint64_t seed, int n_words);

#endif
