/* dashboard.h: the live dashboard page served at GET / and /dashboard: one self-contained HTML file
 * (src/server/dashboard/index.html: its CSS and JavaScript inline, nothing fetched from elsewhere)
 * that CMake turns into this array at build time (src/server/dashboard/embed.cmake). The page polls
 * /v1/kv; the server does nothing for it until a browser asks. */
#ifndef HR_SERVER_DASHBOARD_H
#define HR_SERVER_DASHBOARD_H

#include <stddef.h>

extern const char hr_srv_dashboard_html[];     /* NUL-terminated */
extern const size_t hr_srv_dashboard_html_len; /* without the NUL */

#endif
