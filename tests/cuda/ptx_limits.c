/* ptx_limits.c: what a GPU refuses in the kernels' PTX that the emulator cannot see, checked from the
 * PTX text the build embeds (the .ptx files of build/cuda), no GPU needed. Run by ctest as test_cuda_ptx_limits:
 *
 *   ptx_limits [--threads N] [--threads KERNEL=N]... PTX...
 *
 * - Static shared memory: a block gets at most 48 KiB of it (more only as dynamic shared memory, with
 *   an opt-in attribute); a kernel asking more fails every launch (CUDA_ERROR_INVALID_VALUE) or its
 *   module fails to load. A kernel's figure is the sum of its own .shared declarations (the compiler
 *   moves a function's static __shared__ arrays into the one kernel that uses them) and of the
 *   module-scope ones it names, directly or through a .func it calls. Each kernel's figure is printed.
 * - Threads: a kernel's .maxntid (the most threads it was compiled for) or .reqntid (the exact count)
 *   against the block size the host launches it with (--threads: every kernel's, then exceptions by
 *   name); a launch past either fails.
 *
 * Before the files, the same checks run on a small module made to break them (the parser must find
 * what it is there to find). Exit status 0 when every kernel fits, 1 otherwise. */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARED_LIMIT (48 << 10)
#define MAX_FUNCS    256
#define MAX_VARS     256
#define MAX_EXCEPT   32

typedef struct {
    char name[128];
    bool entry;
    const char *body, *body_end; /* between its braces */
    long shared;                 /* its own .shared declarations' bytes */
    long ntid[2];                /* .maxntid and .reqntid thread products (0: none) */
} func;
typedef struct {
    char name[128];
    long bytes;
} var;
typedef struct {
    func f[MAX_FUNCS];
    int nf;
    var v[MAX_VARS];
    int nv;
} module;

static struct {
    int n;
    char name[MAX_EXCEPT][128];
    long threads[MAX_EXCEPT];
} launch = {.n = 0};
static long default_threads = 256;

static long threads_of(const char *kernel) {
    for (int i = 0; i < launch.n; i++)
        if (strcmp(launch.name[i], kernel) == 0) return launch.threads[i];
    return default_threads;
}

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '$'; }
static const char *skip_space(const char *p) {
    while (*p == ' ' || *p == '\t') p++;
    return p;
}
/* the identifier at p into out; the character after it */
static const char *ident(const char *p, char *out, size_t n) {
    size_t k = 0;
    while (ident_char(*p)) {
        if (k + 1 < n) out[k++] = *p;
        p++;
    }
    out[k] = 0;
    return p;
}

/* ".shared .align A .TYPE NAME[N]...;" at p (after any .visible / .extern): its bytes into *bytes and
 * its name into name; false for a declaration of no size (an .extern one, dynamic shared memory) */
static bool shared_decl(const char *p, char *name, size_t n, long *bytes) {
    const char *end = strchr(p, ';');
    if (!end) return false;
    long elem = 0;
    for (const char *t = p; t < end; t++) /* the element's type: .b8 .u16 .f32 .s64 ... */
        if (*t == '.' && strchr("busf", t[1]) && isdigit((unsigned char)t[2])) {
            elem = atol(t + 2) / 8;
            break;
        }
    const char *b = memchr(p, '[', (size_t)(end - p));
    if (!b || elem <= 0) return false;
    const char *s = b; /* the name just before the first '[' */
    while (s > p && ident_char(s[-1])) s--;
    ident(s, name, n);
    long total = elem;
    for (; b && b < end; b = memchr(b + 1, '[', (size_t)(end - b - 1))) {
        if (b[1] == ']') return false; /* an unsized (dynamic) array */
        total *= atol(b + 1);
    }
    *bytes = total;
    return true;
}

/* the module's functions (.entry, .func) with their bodies and shared declarations, and its
 * module-scope .shared variables */
static void parse(const char *text, module *m) {
    m->nf = m->nv = 0;
    func *cur = NULL; /* a header read, its body not yet closed */
    int depth = 0;
    for (const char *line = text; line && *line;) {
        const char *eol = strchr(line, '\n');
        const char *p = skip_space(line);
        if (depth == 0 && !cur) {
            const char *q = p;
            if (strncmp(q, ".visible ", 9) == 0 || strncmp(q, ".weak ", 6) == 0) q = skip_space(strchr(q, ' '));
            bool is_entry = strncmp(q, ".entry ", 7) == 0, is_func = strncmp(q, ".func ", 6) == 0;
            if ((is_entry || is_func) && m->nf < MAX_FUNCS) {
                q = skip_space(q + (is_entry ? 7 : 6));
                if (*q == '(') q = skip_space(strchr(q, ')') + 1); /* a .func's return parameter */
                func *f = &m->f[m->nf];
                memset(f, 0, sizeof *f);
                ident(q, f->name, sizeof f->name);
                f->entry = is_entry;
                cur = f;
            } else if (strstr(p, ".shared ") == p || strncmp(q, ".shared ", 8) == 0 ||
                       strncmp(q, ".extern .shared ", 16) == 0) {
                var *v = &m->v[m->nv];
                if (m->nv < MAX_VARS && shared_decl(p, v->name, sizeof v->name, &v->bytes)) m->nv++;
            }
        } else if (cur && depth == 0) { /* between a header and its body: the thread directives */
            const char *d;
            for (int k = 0; k < 2; k++)
                if ((d = strstr(p, k ? ".reqntid" : ".maxntid")) && (!eol || d < eol)) {
                    long prod = 1;
                    const char *t = d + 8;
                    for (int i = 0; i < 3; i++) {
                        t = skip_space(t);
                        if (!isdigit((unsigned char)*t)) break;
                        prod *= strtol(t, (char **)&t, 10);
                        t = skip_space(t);
                        if (*t == ',') t++;
                    }
                    cur->ntid[k] = prod;
                }
        }
        if (cur && depth >= 1 && strncmp(p, ".shared ", 8) == 0) {
            char nm[128];
            long bytes;
            if (shared_decl(p, nm, sizeof nm, &bytes)) cur->shared += bytes;
        }
        for (const char *c = line; c < (eol ? eol : line + strlen(line)); c++) {
            if (c[0] == '/' && c[1] == '/') break;
            if (*c == '{') {
                if (depth++ == 0 && cur) cur->body = c + 1;
            } else if (*c == '}' && depth > 0 && --depth == 0 && cur && cur->body) {
                cur->body_end = c;
                m->nf++;
                cur = NULL;
            }
        }
        if (cur && !cur->body && p[0] == ';') cur = NULL; /* a declaration only (a prototype) */
        line = eol ? eol + 1 : NULL;
    }
}

/* whether function f's body names identifier id */
static bool names(const func *f, const char *id) {
    const size_t n = strlen(id);
    for (const char *p = f->body; p && (p = strstr(p, id)) && p < f->body_end; p += n)
        if ((p == f->body || !ident_char(p[-1])) && !ident_char(p[n])) return true;
    return false;
}

/* the functions f reaches (itself and what it calls, transitively) into reach[] */
static void reach_from(const module *m, int f, bool *reach) {
    if (reach[f]) return;
    reach[f] = true;
    for (int g = 0; g < m->nf; g++)
        if (!m->f[g].entry && !reach[g] && names(&m->f[f], m->f[g].name)) reach_from(m, g, reach);
}

/* each kernel's static shared bytes and threads checked and printed (quiet: not printed); the
 * failures' count */
static int check(const char *what, const char *text, bool quiet) {
    static module m;
    parse(text, &m);
    int bad = 0;
    for (int e = 0; e < m.nf; e++) {
        const func *k = &m.f[e];
        if (!k->entry) continue;
        bool reach[MAX_FUNCS] = {false};
        reach_from(&m, e, reach);
        long bytes = 0;
        for (int g = 0; g < m.nf; g++)
            if (reach[g]) bytes += m.f[g].shared;
        for (int v = 0; v < m.nv; v++) {
            bool used = false;
            for (int g = 0; g < m.nf && !used; g++) used = reach[g] && names(&m.f[g], m.v[v].name);
            bytes += used ? m.v[v].bytes : 0;
        }
        const long t = threads_of(k->name);
        const bool over = bytes > SHARED_LIMIT, max_bad = k->ntid[0] && k->ntid[0] < t,
                   req_bad = k->ntid[1] && k->ntid[1] != t;
        bad += over + max_bad + req_bad;
        if (!quiet)
            printf("%s %s: %ld bytes of static shared memory (at most %d)%s, launched with %ld threads%s%s\n", what,
                   k->name, bytes, SHARED_LIMIT, over ? " TOO MUCH" : "", t, max_bad ? ", past its .maxntid" : "",
                   req_bad ? ", not its .reqntid" : "");
    }
    return bad;
}

/* a module made to fail: big's 40 KiB of its own and 10 KiB of a module-scope array that only a .func
 * it calls names (50 KiB); fits at 48 KiB exactly; narrow's .maxntid 128 and exact's .reqntid 512
 * against 256-thread launches. 3 failures, no more. */
static const char *self_module =
    ".version 8.5\n.target sm_90a\n.address_size 64\n"
    ".func helper\n(\n\t.param .b64 helper_param_0\n)\n;\n"
    ".shared .align 4 .b8 far_away[10240];\n"
    ".visible .entry big(\n\t.param .u64 big_param_0\n)\n{\n"
    "\t.shared .align 16 .b8 big_tile[40960];\n\tcall.uni \n\thelper, \n\t(\n\tparam0\n\t);\n\tret;\n}\n"
    ".visible .entry fits(\n\t.param .u64 fits_param_0\n)\n.maxntid 256, 1, 1\n{\n"
    "\t.shared .align 4 .f32 a[8192];\n\t.shared .align 8 .b64 b[2048];\n\tret;\n}\n"
    ".visible .entry narrow(\n)\n.maxntid 128, 1, 1\n{\n\tret;\n}\n"
    ".visible .entry exact(\n)\n.reqntid 512, 1, 1\n{\n\tret;\n}\n"
    ".func helper(\n\t.param .b64 helper_param_0\n)\n{\n\tmov.u64 %rd1, far_away;\n\tret;\n}\n";

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) free(s), s = NULL;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i + 1 < argc && strcmp(argv[i], "--threads") == 0; i += 2) {
        const char *eq = strchr(argv[i + 1], '=');
        if (!eq) {
            default_threads = atol(argv[i + 1]);
        } else if (launch.n < MAX_EXCEPT) {
            snprintf(launch.name[launch.n], sizeof launch.name[0], "%.*s", (int)(eq - argv[i + 1]), argv[i + 1]);
            launch.threads[launch.n++] = atol(eq + 1);
        }
    }
    const long keep = default_threads;
    default_threads = 256;
    const int self_bad = check("self-test", self_module, true);
    default_threads = keep;
    if (self_bad != 3) {
        printf("ptx_limits: the self-test module gave %d failures, not 3: the parser is broken\n", self_bad);
        return 1;
    }
    int bad = 0, n = 0;
    for (; i < argc; i++) {
        char *text = slurp(argv[i]);
        if (!text) {
            printf("ptx_limits: cannot read %s\n", argv[i]);
            return 1;
        }
        const char *base = strrchr(argv[i], '/');
        bad += check(base ? base + 1 : argv[i], text, false);
        n++;
        free(text);
    }
    printf("ptx_limits: %d PTX files, %d problems\n", n, bad);
    return bad ? 1 : 0;
}
