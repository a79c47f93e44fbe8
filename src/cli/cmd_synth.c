/* cmd_synth.c: `headroom synth`: write a deterministic random-weight model of a real shape. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/errors.h"
#include "common/util.h"
#include "model/synth.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: headroom synth --shape NAME (--type TYPE | --mix MIX) -o FILE.gguf [--seed S] [--layers N]\n\n"
            "Writes a model with deterministic random weights (same seed, same bytes) and a working\n"
            "vocabulary, for benchmarks and tests. Speed does not depend on the weights' values.\n\n"
            "  --shape NAME   %s\n"
            "  --type TYPE    f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K, mxfp4 (rows whose length\n"
            "                 does not fit the type's block fall back as llama-quantize's do: q4_K -> q5_0,\n"
            "                 q5_K -> q5_1, q6_K -> q8_0, then f16; norms stay f32; mxfp4: the experts of a\n"
            "                 MoE shape in MXFP4, its other matrices q8_0, as gpt-oss files hold them)\n"
            "  --mix MIX      %s: llama.cpp's quantization mixes, tensor by tensor as\n"
            "                 llama-quantize assigns them for the llama family (Q4_K_M: q6_K output and q6_K\n"
            "                 attn_v / ffn_down in the first and last eighth of the layers and every third\n"
            "                 between; Q4_0: q6_K output), instead of --type\n"
            "  -o FILE        output path\n"
            "  --seed S       (default 1)\n"
            "  --layers N     keep the first N of the shape's layers (default all): the same per-layer and\n"
            "                 vocabulary costs in a fraction of the size\n\n" HR_EXIT_HELP,
            hr_synth_shape_names(), hr_synth_mix_names());
}

static bool parse_type(const char *name, hr_dtype *out) {
    static const hr_dtype types[] = {HR_DTYPE_F32,  HR_DTYPE_F16,  HR_DTYPE_BF16, HR_DTYPE_Q8_0,
                                     HR_DTYPE_Q4_0, HR_DTYPE_Q5_0, HR_DTYPE_Q5_1, HR_DTYPE_Q4_K,
                                     HR_DTYPE_Q5_K, HR_DTYPE_Q6_K, HR_DTYPE_MXFP4};
    for (size_t i = 0; i < HR_ARRAY_LEN(types); i++) {
        const hr_dtype_info *info = hr_dtype_get_info(types[i]);
        if (info && !strcmp(info->name, name)) {
            *out = types[i];
            return true;
        }
    }
    return false;
}

int hr_cmd_synth(int argc, char **argv) {
    const char *shape_name = NULL, *type_name = NULL, *mix_name = NULL, *path = NULL;
    uint64_t seed = 1;
    int n_layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return HR_EXIT_OK;
        } else if (!strcmp(a, "--shape")) {
            if (!(shape_name = hr_arg_value("synth", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--type")) {
            if (!(type_name = hr_arg_value("synth", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--mix")) {
            if (!(mix_name = hr_arg_value("synth", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(path = hr_arg_value("synth", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = hr_arg_value("synth", argc, argv, &i)) || !hr_arg_u64("synth", a, v, &seed)) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--layers")) {
            if (!(v = hr_arg_value("synth", argc, argv, &i)) || !hr_arg_int("synth", a, v, 1, 100000, &n_layers))
                return HR_EXIT_USAGE;
        } else {
            fprintf(stderr, "headroom synth: unknown option '%s' (see headroom synth --help)\n", a);
            return HR_EXIT_USAGE;
        }
    }
    if (!shape_name || !type_name == !mix_name || !path) {
        fprintf(stderr,
                "headroom synth: --shape, -o and one of --type or --mix are required (see headroom synth --help)\n");
        return HR_EXIT_USAGE;
    }
    hr_error err = {0};
    hr_synth_shape shape;
    if (hr_synth_shape_by_name(shape_name, &shape, &err)) {
        fprintf(stderr, "headroom synth: %s\n", HR_CLI_ERROR(&err));
        return HR_EXIT_USAGE;
    }
    if (n_layers > shape.n_layer) {
        fprintf(stderr, "headroom synth: --layers %d: the shape %s has %d layers\n", n_layers, shape.name,
                shape.n_layer);
        return HR_EXIT_USAGE;
    }
    if (n_layers > 0) shape.n_layer = n_layers;
    hr_dtype type = HR_DTYPE_F32;
    hr_synth_mix mix = HR_SYNTH_PURE;
    if (mix_name && hr_synth_mix_by_name(mix_name, &mix, &err)) {
        fprintf(stderr, "headroom synth: %s\n", HR_CLI_ERROR(&err));
        return HR_EXIT_USAGE;
    }
    if (type_name && !parse_type(type_name, &type)) {
        fprintf(
            stderr,
            "headroom synth: unknown --type '%s' (f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K, mxfp4)\n",
            type_name);
        return HR_EXIT_USAGE;
    }
    hr_gguf_writer *w = NULL;
    if ((mix_name ? hr_synth_build_mix(&shape, mix, seed, &w, &err) : hr_synth_build(&shape, type, seed, &w, &err)) ||
        hr_gguf_writer_write_file(w, path, &err)) {
        fprintf(stderr, "headroom synth: %s\n", HR_CLI_ERROR(&err));
        hr_gguf_writer_destroy(w);
        return HR_EXIT_FAIL;
    }
    hr_gguf_writer_destroy(w);
    fprintf(stderr, "headroom synth: wrote %s (%s, %s, seed %llu)\n", path, shape.name, mix_name ? mix_name : type_name,
            (unsigned long long)seed);
    return HR_EXIT_OK;
}
