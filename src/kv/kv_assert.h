/* kv_assert.h: KV_ASSERT, the invariant checks of the KV manager and the KV storages, compiled in only
 * for debug (sanitizer) builds (HR_DEBUG_CHECKS=1); a check never stands in for input validation. */
#ifndef HR_KV_KV_ASSERT_H
#define HR_KV_KV_ASSERT_H

#ifndef HR_DEBUG_CHECKS
#define HR_DEBUG_CHECKS 0
#endif

#if HR_DEBUG_CHECKS
#include <assert.h>
#define KV_ASSERT(c) assert(c)
#else
#define KV_ASSERT(c) ((void)0)
#endif

#endif
