/* activity_cost.c: what the dashboard costs a server nobody watches: the hooks every submitted,
 * finished (400 inter-token gaps) and refused request runs (src/server/activity.c), timed in a loop.
 * Built and run by bench/dashboard/cost.sh against a build folder's libraries. */
#include "common/util.h"
#include "server/activity.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(void) {
    hr_srv_activity *a;
    hr_error err;
    if (hr_srv_activity_create(&a, &err)) return 1;
    float gaps[400];
    for (int i = 0; i < 400; i++) gaps[i] = 0.001f * (float)(i % 7);
    hr_rt_result r = {0};
    r.t_submit = 1;
    r.t_first_token = 1.01;
    r.state = HR_REQ_COMPLETED;
    hr_srv_error e = {.http = 429, .refusal = HR_REFUSE_QUEUE};
    snprintf(e.msg, sizeof e.msg, "queue full");
    int N = 200000;
    double t0 = hr_time_now();
    for (int i = 0; i < N; i++) hr_srv_activity_submitted(a, 1, 100);
    double t1 = hr_time_now();
    for (int i = 0; i < N; i++) hr_srv_activity_finished(a, &r, gaps, 400);
    double t2 = hr_time_now();
    for (int i = 0; i < N; i++) hr_srv_activity_refused(a, &e);
    double t3 = hr_time_now();
    printf("submitted: %.1f ns/request\nfinished (400 gaps): %.1f ns/request\nrefused: %.1f ns/refusal\n",
           (t1 - t0) / N * 1e9, (t2 - t1) / N * 1e9, (t3 - t2) / N * 1e9);
    hr_srv_activity_destroy(a);
    return 0;
}
