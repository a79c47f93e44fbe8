#!/usr/bin/env bash
# layering.sh: the module layers of src/ (docs/ARCHITECTURE.md, "Layers"), held against every
# #include "dir/..." under src/. Fails naming the file and the header of each include that crosses
# them. Run by ctest as test_layering: layering.sh SRC_DIR
#
# Layer table: a module may include its own headers and those of the modules listed for it.
#   common       -
#   tensor       common
#   gguf         common
#   kv           backend tensor common
#   backend      model kv tensor common      (a backend executes a model's description over a KV storage)
#   sampler      common
#   tokenizer    gguf common
#   model        kv tensor gguf common
#   constrain    tokenizer common
#   engine       model kv sampler constrain tokenizer backend tensor common
#   events       kv common                  (the prefix cache's observers; the runtime wires them)
#   remote       kv common
#   runtime      engine model kv sampler constrain tokenizer events remote gguf backend tensor common
#                (the composition root; runtime/runtime.h itself: runtime and common only, and
#                runtime/runtime_parts.h, which lends the composed objects to tests, is for runtime/)
# Front ends, above the runtime: runtime/runtime.h, tokenizer/tokenizer.h (for text only), common,
# and the front-end modules beside them:
#   cli          server plan eval bench
#   server       -
#   eval         -
#   bench        common                      (a client of any HTTP server: not even the runtime)
#   plan         backend gguf tensor         (its simulator is a backend; reads a model's shape from its
#                                            GGUF tensor directory),
#                runtime/budget.h            (plans with the runtime's own budget arithmetic)
set -u
src=${1:-$(dirname "$0")/../src}
cd "$src" || { echo "layering.sh: no source folder '$src'"; exit 2; }

declare -A allow=(
    [common]=""
    [tensor]="common"
    [gguf]="common"
    [backend]="model kv tensor common"
    [kv]="backend tensor common"
    [sampler]="common"
    [tokenizer]="gguf common"
    [model]="kv tensor gguf common"
    [constrain]="tokenizer common"
    [engine]="model kv sampler constrain tokenizer backend tensor common"
    [events]="kv common"
    [remote]="kv common"
    [runtime]="engine model kv sampler constrain tokenizer events remote gguf backend tensor common"
    [cli]="server plan eval bench"
    [server]=""
    [eval]=""
    [bench]="common"
    [plan]="backend gguf tensor"
)
front_end=" cli server eval plan "

# Edges that cross the table today, each with its reason. "file header" exactly as included.
exceptions="
# \`headroom version\` prints the CPU backend's kernel table.
cli/main.c backend/cpu/kernels.h
# \`headroom synth\` writes a model file with model/'s synthetic writer: a file tool, no runtime.
cli/cmd_synth.c model/synth.h
# \`headroom tokenize --to-gguf\` writes the tokenizer's conversion through a GGUF writer.
cli/cmd_tokenize.c gguf/gguf.h
# A Hugging Face checkpoint directory's tokenizer.json is converted to the GGUF metadata the tokenizer
# reads (hr_tokenizer_json_to_gguf), as the loader builds the model's other metadata from config.json.
model/hf.c tokenizer/tokenizer.h
"

status=0
while IFS= read -r line; do
    file=${line%%:*}
    hdr=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' <<<"${line#*:}")
    [[ $hdr == */* ]] || continue # a header beside the file: its own module
    mod=${file%%/*}
    dep=${hdr%%/*}
    [[ $dep == "$mod" ]] && ok=1 || ok=0
    if [[ $ok == 0 ]]; then
        for a in ${allow[$mod]-}; do [[ $a == "$dep" ]] && ok=1; done
        if [[ $front_end == *" $mod "* ]]; then
            [[ $hdr == runtime/runtime.h || $hdr == tokenizer/tokenizer.h || $dep == common ]] && ok=1
            # the planner plans with the runtime's own budget arithmetic
            [[ $mod == plan && $hdr == runtime/budget.h ]] && ok=1
        fi
    fi
    # the runtime's public header speaks only of the runtime; its parts are for runtime/ and tests
    [[ $file == runtime/runtime.h && $dep != runtime && $dep != common ]] && ok=0
    [[ $hdr == runtime/runtime_parts.h && $mod != runtime ]] && ok=0
    [[ -z ${allow[$mod]+x} ]] && { echo "layering: $file: module '$mod' is not in the layer table"; status=1; continue; }
    if [[ $ok == 0 ]]; then
        if grep -qxF "$file $hdr" <<<"$exceptions"; then continue; fi
        if [[ $hdr == runtime/runtime_parts.h ]]; then
            echo "layering: $file includes $hdr: the composed objects are for runtime/ and the tests only"
        elif [[ $file == runtime/runtime.h ]]; then
            echo "layering: $file includes $hdr: the runtime's public header may include only runtime/ and common/"
        else
            echo "layering: $file includes $hdr: $mod may not include $dep"
        fi
        status=1
    fi
done < <(grep -rn --include='*.c' --include='*.h' -H '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' . | sed 's|^\./||; s|:[0-9]*:|:|')

# every exception must still be needed: a fixed edge leaves the list
while IFS= read -r e; do
    [[ -z $e || $e == \#* ]] && continue
    f=${e%% *} h=${e#* }
    grep -q "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"$h\"" "$f" 2>/dev/null || {
        echo "layering: the exception '$e' is no longer needed: remove it"
        status=1
    }
done <<<"$exceptions"

[[ $status == 0 ]] && echo "layering: every include of src/ follows the layer table"
exit $status
