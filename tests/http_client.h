/* http_client.h: a tiny HTTP/1.1 client on plain sockets for the server tests (loopback only): one
 * request per connection ("Connection: close"), the whole answer read with a 30 s socket timeout, a
 * chunked body decoded. */
#ifndef HR_TESTS_HTTP_CLIENT_H
#define HR_TESTS_HTTP_CLIENT_H

#include <jansson.h>
#include <stddef.h>

typedef struct hr_http_resp {
    int status; /* 0: no answer */
    char *head; /* status line and headers */
    char *body; /* de-chunked */
    size_t body_len;
} hr_http_resp;

void hr_http_resp_free(hr_http_resp *r);
/* A connected socket to 127.0.0.1:port with 30 s send/receive timeouts, or -1. */
int hr_http_dial(int port);
/* Writes one request (JSON content type, Content-Length, Connection: close; headers: extra "K: V\r\n"
 * lines or NULL). */
void hr_http_send(int fd, const char *method, const char *path, const char *headers, const char *body, size_t body_len);
/* Reads the answer until the server closes. */
void hr_http_read(int fd, hr_http_resp *r);
/* dial + send + read + close. */
hr_http_resp hr_http_call(int port, const char *method, const char *path, const char *headers, const char *body);
/* The body as JSON, or NULL. */
json_t *hr_http_json(const hr_http_resp *r);

#endif
