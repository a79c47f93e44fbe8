/* top.h: `headroom top`'s screen, built from one /v1/kv answer: a header, the pool as a bar, rates,
 * the newest events and the requests sorted by KV bytes, each line cut to the terminal's width.
 * Plain text, with ANSI colours when asked. cmd_top.c fetches and shows it. */
#ifndef HR_CLI_TOP_H
#define HR_CLI_TOP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct hr_top_view {
    const char *url;    /* the server, as given */
    int cols, rows;     /* the screen; rows 0: no limit (print every request) */
    bool color;         /* ANSI colours */
    bool interactive;   /* a live screen: ends with the key hint */
    const char *status; /* NULL when the last fetch worked, else the line to show
                           ("disconnected, retrying: ...") above the last picture */
} hr_top_view;

/* A growing text buffer for one frame. */
typedef struct hr_top_frame {
    char *data;
    size_t len, cap;
    int col;     /* visible characters on the current line */
    int cols;    /* the cut */
    bool failed; /* out of memory: the frame is incomplete */
} hr_top_frame;

/* Appends the whole screen for kv (may be NULL: only the header and the status) to f. */
void hr_top_render(const json_t *kv, const hr_top_view *v, hr_top_frame *f);
void hr_top_frame_free(hr_top_frame *f);

/* "1.5 MiB", "512 B": binary units, one decimal. */
void hr_top_bytes(double n, char *out, size_t cap);

#endif
