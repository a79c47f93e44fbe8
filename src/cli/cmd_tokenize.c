/* cmd_tokenize.c: `headroom tokenize`: a text's token ids and pieces under a GGUF file's vocabulary (or a
 * Hugging Face tokenizer.json), for checking prompts and special-token handling by eye, for measuring
 * encode throughput, and (--to-gguf) for converting a tokenizer.json into a vocab-only GGUF file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/util.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: headroom tokenize -m MODEL [--ids|--pieces|--count] [--no-bos] [--parse-special]\n"
               "                         [--stats] (-f TEXT_FILE | [--] TEXT)\n"
               "       headroom tokenize -m TOKENIZER_JSON --to-gguf OUT.gguf\n\n"
               "Prints the tokens of TEXT (or of TEXT_FILE; '-' reads stdin) under the model's vocabulary.\n"
               "Default output: one line per token, `id<TAB>'piece'`, the piece as stored in the vocabulary\n"
               "(SentencePiece shows spaces as U+2581, byte-level BPE as U+0120 'G-dot'; control bytes are\n"
               "escaped as \\n, \\t, \\xNN).\n\n"
               "  -m, --model MODEL  GGUF file with tokenizer.ggml.* metadata (a vocab-only file is fine), or a\n"
               "                     Hugging Face tokenizer.json, or a directory holding one (with its\n"
               "                     tokenizer_config.json); an unsupported component is named in one line\n"
               "  --to-gguf OUT      write the tokenizer.json's vocabulary to OUT as a vocab-only GGUF file with\n"
               "                     the keys llama.cpp's converter writes, then exit (no TEXT)\n"
               "  --ids              ids only, space-separated on one line\n"
               "  --pieces           pieces only, one quoted piece per line\n"
               "  --count            only the number of tokens\n"
               "  --no-bos           do not prepend BOS (default: the vocabulary's add_bos_token setting)\n"
               "  --parse-special    map special-token text such as <|eot_id|> to its id (default: plain text)\n"
               "  --stats            print bytes, tokens, encode time and MB/s to stderr\n"
               "  -f, --file FILE    read the text from FILE instead of the command line\n"
               "Invalid UTF-8 in the text: each byte that starts no valid sequence is read as U+FFFD.\n"
               "A -f FILE that is a directory or not a regular file is an error (use '-' for stdin).\n\n" HR_EXIT_HELP);
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb, cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Prints a piece between single quotes, escaping what a terminal would not show. */
static void print_piece(const char *p) {
    putchar('\'');
    for (const unsigned char *s = (const unsigned char *)p; *s; s++) {
        if (*s == '\n') {
            fputs("\\n", stdout);
        } else if (*s == '\t') {
            fputs("\\t", stdout);
        } else if (*s == '\r') {
            fputs("\\r", stdout);
        } else if (*s == '\\' || *s == '\'') {
            printf("\\%c", *s);
        } else if (*s < 0x20 || *s == 0x7F) {
            printf("\\x%02X", *s);
        } else {
            putchar(*s);
        }
    }
    putchar('\'');
}

enum { OUT_TABLE, OUT_IDS, OUT_PIECES, OUT_COUNT };

int hr_cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *text_arg = NULL, *file = NULL, *to_gguf = NULL;
    int mode = OUT_TABLE;
    bool no_bos = false, parse_special = false, stats = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return HR_EXIT_OK;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model_path = hr_arg_value("tokenize", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--to-gguf")) {
            if (!(to_gguf = hr_arg_value("tokenize", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = hr_arg_value("tokenize", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--ids")) {
            mode = OUT_IDS;
        } else if (!strcmp(a, "--pieces")) {
            mode = OUT_PIECES;
        } else if (!strcmp(a, "--count")) {
            mode = OUT_COUNT;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--parse-special")) {
            parse_special = true;
        } else if (!strcmp(a, "--stats")) {
            stats = true;
        } else if (!strcmp(a, "--") || a[0] != '-' || a[1] == '\0') {
            int first = !strcmp(a, "--") ? i + 1 : i;
            if (first >= argc || argc - first > 1 || text_arg) {
                fprintf(stderr, "headroom tokenize: expected exactly one TEXT argument (quote it), found %d\n",
                        argc - first + (text_arg ? 1 : 0));
                return HR_EXIT_USAGE;
            }
            text_arg = argv[first];
            break;
        } else {
            fprintf(stderr, "headroom tokenize: unknown option '%s' (see --help)\n", a);
            return HR_EXIT_USAGE;
        }
    }
    if (!model_path) {
        fprintf(stderr, "headroom tokenize: -m MODEL is required (see --help)\n");
        return HR_EXIT_USAGE;
    }
    if (to_gguf) {
        if (text_arg || file) {
            fprintf(stderr, "headroom tokenize: --to-gguf takes no TEXT or -f FILE\n");
            return HR_EXIT_USAGE;
        }
        hr_error err = {0};
        hr_gguf_writer *w = hr_gguf_writer_create(3);
        hr_status st = w ? hr_tokenizer_json_to_gguf(model_path, w, &err) : HR_ERR_NOMEM;
        if (st == HR_OK) st = hr_gguf_writer_write_file(w, to_gguf, &err);
        hr_gguf_writer_destroy(w);
        if (st != HR_OK) {
            fprintf(stderr, "headroom tokenize: %s\n", st == HR_ERR_NOMEM && !err.msg[0] ? "out of memory" : err.msg);
            return HR_EXIT_FAIL;
        }
        return HR_EXIT_OK;
    }
    if (!text_arg == !file) {
        fprintf(stderr, "headroom tokenize: give the text either as one TEXT argument or with -f FILE, not %s\n",
                file ? "both" : "neither");
        return HR_EXIT_USAGE;
    }

    char *text = NULL;
    size_t len = 0;
    if (file) {
        if (strcmp(file, "-") && !hr_arg_regular_file("tokenize", "-f", file)) return HR_EXIT_FAIL;
        FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "headroom tokenize: cannot open '%s': %s\n", file, strerror(errno));
            return HR_EXIT_FAIL;
        }
        text = read_all(f, &len);
        if (f != stdin) fclose(f);
        if (!text) {
            fprintf(stderr, "headroom tokenize: cannot read '%s'\n", file);
            return HR_EXIT_FAIL;
        }
    }

    hr_error err = {0};
    hr_tokenizer *t = NULL;
    int rc = 1;
    if (hr_tokenizer_load_path(model_path, &t, &err) != HR_OK) {
        fprintf(stderr, "headroom tokenize: %s\n", err.msg);
        goto done;
    }

    hr_tokenize_opts opts = {
        .add_bos = !no_bos && hr_tokenizer_add_bos_default(t), .add_eos = false, .parse_special = parse_special};
    const char *src = file ? text : text_arg;
    size_t src_len = file ? len : strlen(text_arg);
    int32_t *ids = NULL;
    size_t n = 0;
    double t0 = hr_time_now();
    if (hr_tokenizer_encode_alloc(t, src, src_len, &opts, &ids, &n, &err) != HR_OK) {
        fprintf(stderr, "headroom tokenize: %s\n", err.msg);
        goto done;
    }
    double dt = hr_time_now() - t0;
    for (size_t i = 0; i < n; i++) {
        if (mode == OUT_IDS) {
            printf(i ? " %d" : "%d", ids[i]);
        } else if (mode == OUT_PIECES) {
            print_piece(hr_tokenizer_piece(t, ids[i]));
            putchar('\n');
        } else if (mode == OUT_TABLE) {
            printf("%d\t", ids[i]);
            print_piece(hr_tokenizer_piece(t, ids[i]));
            putchar('\n');
        }
    }
    if (mode == OUT_IDS) putchar('\n');
    if (mode == OUT_COUNT) printf("%zu\n", n);
    if (stats)
        fprintf(stderr, "%zu bytes -> %zu tokens in %.1f ms (%.2f MB/s, %s vocabulary, pre-tokenizer %s)\n", src_len, n,
                dt * 1e3, dt > 0 ? (double)src_len / dt / 1e6 : 0.0, hr_tokenizer_kind_name(t),
                hr_tokenizer_pre_name(t));
    free(ids);
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    hr_tokenizer_destroy(t);
    free(text);
    return rc;
}
