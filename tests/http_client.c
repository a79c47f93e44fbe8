/* http_client.c: the tests' tiny HTTP/1.1 client (http_client.h). */
#include "http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

void hr_http_resp_free(hr_http_resp *r) {
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int hr_http_dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

void hr_http_send(int fd, const char *method, const char *path, const char *headers, const char *body,
                  size_t body_len) {
    char head[2048];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, headers ? headers : "", body_len);
    if (write(fd, head, (size_t)n) != n) return;
    size_t off = 0;
    while (off < body_len) {
        ssize_t w = write(fd, body + off, body_len - off);
        if (w <= 0) return;
        off += (size_t)w;
    }
}

/* Decodes a chunked body in place; returns its length. */
static size_t dechunk(char *b, size_t n) {
    size_t in = 0, out = 0;
    while (in < n) {
        char *end;
        unsigned long len = strtoul(b + in, &end, 16);
        char *crlf = strstr(end, "\r\n");
        if (!crlf || len == 0) break;
        in = (size_t)(crlf + 2 - b);
        if (in + len > n) len = n - in;
        memmove(b + out, b + in, len);
        out += len;
        in += len + 2;
    }
    b[out] = '\0';
    return out;
}

void hr_http_read(int fd, hr_http_resp *r) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (int guard = 0; guard < 100000; guard++) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t got = read(fd, buf + len, cap - len - 1);
        if (got <= 0) break;
        len += (size_t)got;
    }
    buf[len] = '\0';
    memset(r, 0, sizeof *r);
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep) {
        r->head = buf;
        return;
    }
    *sep = '\0';
    r->head = strdup(buf);
    sscanf(buf, "HTTP/1.%*d %d", &r->status);
    size_t blen = len - (size_t)(sep + 4 - buf);
    r->body = malloc(blen + 1);
    memcpy(r->body, sep + 4, blen);
    r->body[blen] = '\0';
    r->body_len = strcasestr(r->head, "transfer-encoding: chunked") ? dechunk(r->body, blen) : blen;
    free(buf);
}

hr_http_resp hr_http_call(int port, const char *method, const char *path, const char *headers, const char *body) {
    hr_http_resp r = {0};
    int fd = hr_http_dial(port);
    if (fd < 0) return r;
    hr_http_send(fd, method, path, headers, body ? body : "", body ? strlen(body) : 0);
    hr_http_read(fd, &r);
    close(fd);
    return r;
}

json_t *hr_http_json(const hr_http_resp *r) { return r->body ? json_loads(r->body, 0, NULL) : NULL; }
