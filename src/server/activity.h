/* activity.h: what the dashboard and `headroom top` read besides the pool: the server's refusals as
 * timestamped events, a window of finished requests (time to first token, inter-token gaps) and
 * counter samples for rates over the last minute. One object per server, under its own mutex.
 *
 * Cost: the hot path adds a handful of stores per submitted, refused or finished request; every
 * rate, percentile and JSON object is computed only when /v1/kv is asked for. */
#ifndef HR_SERVER_ACTIVITY_H
#define HR_SERVER_ACTIVITY_H

#include <jansson.h>

#include "server/server_internal.h"

typedef struct hr_srv_activity hr_srv_activity;

hr_status hr_srv_activity_create(hr_srv_activity **out, hr_error *err);
void hr_srv_activity_destroy(hr_srv_activity *a); /* NULL allowed */

/* An accepted generation request of n choices sharing n_prompt prompt tokens. */
void hr_srv_activity_submitted(hr_srv_activity *a, int n, int n_prompt);
/* A refusal (e->refusal != HR_REFUSE_NONE; others are ignored): an event with its reason. */
void hr_srv_activity_refused(hr_srv_activity *a, const hr_srv_error *e);
/* One finished choice with its inter-token gaps (seconds). */
void hr_srv_activity_finished(hr_srv_activity *a, const hr_rt_result *r, const float *gaps, int n_gaps);

/* Adds to a /v1/kv object: "snapshot" (a number that grows with every call), "time" (unix seconds),
 * "uptime_seconds", "counters" (cumulative), "rates" (over the last minute), "events" (the newest
 * preemptions and evictions from the engine and refusals from the server, oldest first) and
 * "server" (the model, the budget and the flags it runs with). */
void hr_srv_activity_add_json(hr_srv_activity *a, hr_runtime *rt, const hr_server_params *sp, json_t *kv);

/* Adds to one /v1/kv request row: "request_id", "phase" (waiting, prefill, decode, preempted, swapped,
 * finished: still answering), "priority", "age_seconds", "computed_tokens", "shared_blocks",
 * "shared_bytes" and "held_bytes" (pool bytes it holds now: kv.bytes_now, or 0 once final). */
void hr_srv_activity_row_json(const hr_rt_result *r, double now, json_t *row);

#endif
