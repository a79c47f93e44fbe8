/* events.c: the engine's event ring: preemptions and evictions as they happen, with their time, for
 * dashboards (the server's /v1/kv). The engine thread appends under ev_mu (a few stores per event);
 * readers copy under the same lock, so nothing is computed unless someone asks.
 *
 * Invariant: ev[(seq - 1) % HR_ENGINE_EVENTS] holds event seq for every seq in
 * (ev_next - HR_ENGINE_EVENTS, ev_next); older ones are overwritten. */
#include "engine/engine_internal.h"

const char *hr_engine_event_kind_name(hr_engine_event_kind k) {
    static const char *n[] = {"preempt_recompute", "preempt_swap", "evict"};
    return (unsigned)k < HR_ARRAY_LEN(n) ? n[k] : "?";
}

void ev_push(hr_engine *e, hr_engine_event_kind kind, uint64_t request, int tokens, uint64_t bytes) {
    pthread_mutex_lock(&e->ev_mu);
    uint64_t seq = ++e->ev_next;
    e->ev[(seq - 1) % HR_ENGINE_EVENTS] = (hr_engine_event){
        .seq = seq, .t = hr_time_now(), .kind = kind, .request = request, .tokens = tokens, .bytes = bytes};
    pthread_mutex_unlock(&e->ev_mu);
}

void ev_flush_evictions(hr_engine *e, hr_request *r, bool force) {
    if (r->evict_pending <= 0) return;
    double now = hr_time_now();
    if (!force && now - r->t_evict_event < 0.5) return;
    ev_push(e, HR_EVENT_EVICT, r->stats.id, r->evict_pending, 0);
    r->evict_pending = 0;
    r->t_evict_event = now;
}

int hr_engine_events(hr_engine *e, uint64_t after, hr_engine_event *out, int cap) {
    if (cap <= 0) return 0;
    pthread_mutex_lock(&e->ev_mu);
    uint64_t newest = e->ev_next;
    uint64_t oldest = newest > HR_ENGINE_EVENTS ? newest - HR_ENGINE_EVENTS + 1 : 1;
    if (after + 1 > oldest) oldest = after + 1;
    if (newest >= oldest && newest - oldest + 1 > (uint64_t)cap) oldest = newest - (uint64_t)cap + 1;
    int n = 0;
    for (uint64_t s = oldest; s <= newest; s++) out[n++] = e->ev[(s - 1) % HR_ENGINE_EVENTS];
    pthread_mutex_unlock(&e->ev_mu);
    return n;
}
