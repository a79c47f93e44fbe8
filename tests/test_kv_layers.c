/* test_kv_layers.c: the KV manager's files call each other in one direction, and the manager and the
 * CPU storage meet only through the storage interface.
 *
 * Reads the sources (HR_SOURCE_DIR): the dependency order listed in src/kv/kv.h ("The files of kv/
 * in dependency order"), every function and object each .c file of src/kv/ defines with external linkage,
 * and every identifier each file uses (comments and literals skipped). Fails, naming both files and
 * the symbol, when a file uses a symbol defined by a file listed below it (a call circle starts
 * that way), when a kv/ file is missing from the list or listed but absent, when a kv/ file includes
 * a backend header other than the CPU storage's create function (kv_storage_cpu.h, pool.c only),
 * and when a CPU storage file (src/backend/cpu/kv_*.c) uses anything kv/'s files define (the link
 * goes kv -> backend/cpu only: the storage gets its layouts in its parameters). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { MAX_FILES = 64, MAX_SYMS = 1024 };

typedef struct sym {
    char name[64];
    int file; /* index into the kv file list */
} sym;

static char kv_files[MAX_FILES][64];
static int n_kv_files;
static sym syms[MAX_SYMS];
static int n_syms;

static bool ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool ident_char(char c) { return ident_start(c) || (c >= '0' && c <= '9'); }

/* The source with comments, string and character literals blanked (newlines kept), in place. */
static void strip(char *s) {
    for (char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e ? e + 2 : p + strlen(p);
            for (; p < end; p++)
                if (*p != '\n') *p = ' ';
            p--;
        } else if (p[0] == '/' && p[1] == '/') {
            for (; *p && *p != '\n'; p++) *p = ' ';
            p--;
        } else if (*p == '"' || *p == '\'') {
            char q = *p++;
            for (; *p && *p != q; p++) {
                if (*p == '\\' && p[1]) *p++ = ' ';
                if (*p != '\n') *p = ' ';
            }
            if (!*p) return;
        }
    }
}

/* Records the names defined at file scope with external linkage: a line starting (column 0) with a
 * type, not `static`, `typedef`, `#`, `}` or whitespace, whose first identifier followed by '(' is a
 * function defined there (the line or a following one ends its declarator with '{'), or an object
 * initialized with '='. Good enough for the tree's clang-formatted C. */
static void collect_defs(const char *src, int file) {
    for (const char *line = src; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
        if (!ident_start(*line) || !strncmp(line, "static", 6) || !strncmp(line, "typedef", 7) ||
            !strncmp(line, "extern", 6) || !strncmp(line, "enum", 4) || !strncmp(line, "struct", 6))
            continue;
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        if (len == 0 || line[len - 1] == ';') continue; /* a declaration, not a definition */
        const char *paren = memchr(line, '(', len), *eq = memchr(line, '=', len);
        const char *end = paren && (!eq || paren < eq) ? paren : eq;
        if (!end) continue;
        const char *e = end;
        while (e > line && e[-1] == ' ') e--;
        const char *b = e;
        while (b > line && ident_char(b[-1])) b--;
        if (b == e || (size_t)(e - b) >= sizeof syms[0].name || n_syms == MAX_SYMS) continue;
        memcpy(syms[n_syms].name, b, (size_t)(e - b));
        syms[n_syms].name[e - b] = '\0';
        syms[n_syms].file = file;
        n_syms++;
    }
}

static int find_sym(const char *name, size_t n) {
    for (int i = 0; i < n_syms; i++)
        if (strlen(syms[i].name) == n && !memcmp(syms[i].name, name, n)) return i;
    return -1;
}

static int kv_index(const char *name) {
    for (int i = 0; i < n_kv_files; i++)
        if (!strcmp(kv_files[i], name)) return i;
    return -1;
}

/* The order from kv.h: the lines "*   name.c  text" after the marker, up to the first other line. */
static void read_order(void) {
    char *h = hr_test_slurp(HR_SOURCE_DIR "/src/kv/kv.h", NULL);
    CHECKF(h != NULL, "cannot read src/kv/kv.h");
    if (!h) return;
    const char *m = strstr(h, "The files of kv/ in dependency order");
    CHECKF(m != NULL, "kv.h no longer lists the files of kv/ in dependency order");
    const char *line = m ? strchr(m, '\n') : NULL;
    while (line && n_kv_files < MAX_FILES) {
        line++;
        if (strncmp(line, " *   ", 5) != 0) {
            const char *nl = strchr(line, '\n');
            if (nl && n_kv_files == 0 && !strncmp(line, " * ", 3)) { /* the sentence leading into the list */
                line = nl;
                continue;
            }
            break;
        }
        const char *b = line + 5;
        size_t n = 0;
        while (ident_char(b[n]) || b[n] == '.') n++;
        if (n < 3 || n >= sizeof kv_files[0] || strncmp(b + n - 2, ".c", 2) != 0) break;
        memcpy(kv_files[n_kv_files], b, n);
        kv_files[n_kv_files++][n] = '\0';
        line = strchr(line, '\n');
    }
    free(h);
}

static char *read_source(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", HR_SOURCE_DIR, dir, name);
    char *s = hr_test_slurp(path, NULL);
    CHECKF(s != NULL, "cannot read %s", path);
    return s;
}

int main(void) {
    read_order();
    CHECKF(n_kv_files >= 10, "kv.h lists %d files", n_kv_files);
    if (hr_test_failed) return hr_test_finish();

    /* every .c file of kv/ is listed and every listed file exists */
    DIR *d = opendir(HR_SOURCE_DIR "/src/kv");
    CHECK(d != NULL);
    int n_found = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 3 || strcmp(e->d_name + n - 2, ".c") != 0) continue;
        n_found++;
        CHECKF(kv_index(e->d_name) >= 0, "src/kv/%s is not in kv.h's dependency order", e->d_name);
    }
    if (d) closedir(d);
    CHECKF(n_found == n_kv_files, "kv.h lists %d files, src/kv has %d", n_kv_files, n_found);

    char *src[MAX_FILES] = {0};
    for (int i = 0; i < n_kv_files; i++) {
        src[i] = read_source("src/kv", kv_files[i]);
        if (!src[i]) continue;
        /* includes: kv/ and common/ headers; of the backend only the CPU storage's create and the one
         * CPU-feature dispatcher (which picks the storage's kernels), in pool.c */
        for (const char *inc = strstr(src[i], "#include \""); inc; inc = strstr(inc + 1, "#include \"")) {
            const char *name = inc + 10;
            bool ok = !strncmp(name, "kv/", 3) || !strncmp(name, "common/", 7) ||
                      (!strcmp(kv_files[i], "pool.c") && (!strncmp(name, "backend/cpu/kv_storage_cpu.h\"", 29) ||
                                                          !strncmp(name, "backend/cpu/isa.h\"", 18)));
            CHECKF(ok, "src/kv/%s includes \"%.40s", kv_files[i], name);
        }
        strip(src[i]);
        collect_defs(src[i], i);
    }
    CHECKF(n_syms > 50, "found only %d definitions in src/kv", n_syms);

    /* each file uses only what it or the files above it define */
    int uses = 0;
    for (int i = 0; i < n_kv_files; i++) {
        for (const char *p = src[i]; p && *p; p++) {
            if (!ident_start(*p) || (p > src[i] && ident_char(p[-1]))) continue;
            size_t n = 0;
            while (ident_char(p[n])) n++;
            int k = find_sym(p, n);
            if (k >= 0 && syms[k].file != i) {
                uses++;
                CHECKF(syms[k].file < i, "src/kv/%s uses %s, defined by %s, which kv.h lists below it", kv_files[i],
                       syms[k].name, kv_files[syms[k].file]);
            }
            p += n - 1;
        }
    }
    CHECKF(uses > 20, "only %d uses across kv/'s files: the scan is broken", uses);

    /* the CPU storage's files use nothing kv/'s files define */
    d = opendir(HR_SOURCE_DIR "/src/backend/cpu");
    CHECK(d != NULL);
    int n_storage = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "kv_", 3) != 0 || n < 3 || strcmp(e->d_name + n - 2, ".c") != 0) continue;
        char *s = read_source("src/backend/cpu", e->d_name);
        if (!s) continue;
        n_storage++;
        strip(s);
        for (const char *p = s; *p; p++) {
            if (!ident_start(*p) || (p > s && ident_char(p[-1]))) continue;
            size_t m = 0;
            while (ident_char(p[m])) m++;
            int k = find_sym(p, m);
            CHECKF(k < 0, "src/backend/cpu/%s uses %s from src/kv/%s: the storage must not call the manager", e->d_name,
                   k >= 0 ? syms[k].name : "", k >= 0 ? kv_files[syms[k].file] : "");
            p += m - 1;
        }
        free(s);
    }
    if (d) closedir(d);
    CHECKF(n_storage >= 4, "found %d CPU storage files (kv_*.c) in src/backend/cpu", n_storage);
    for (int i = 0; i < n_kv_files; i++) free(src[i]);
    printf("%d kv/ files in order, %d definitions, %d cross-file uses, %d storage files checked\n", n_kv_files, n_syms,
           uses, n_storage);
    return hr_test_finish();
}
