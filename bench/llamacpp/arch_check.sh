#!/bin/sh
# arch_check.sh: headroom against llama.cpp on the synthetic models of the families past llama's
# (docs/MODELS.md). Builds bench/llamacpp/arch_greedy.c against a llama.cpp build (CPU; never
# committed), writes each shape with `headroom synth` (f32, seed 1), runs both on the same 8 prompts
# x 64 greedy tokens with an f16 KV cache, and prints headroom's comparison (ids, logit bound).
#   bench/llamacpp/arch_check.sh BUILD_DIR LLAMA_CPP_DIR [SHAPE[:LAYERS] ...]
# LLAMA_CPP_DIR holds include/llama.h, ggml/include and build/bin/libllama.so. The ids it prints for
# the tiny shapes are the ones tests/vectors/arch-llamacpp.jsonl (deepseek: arch-llamacpp-mla.jsonl) records. env TYPE:
# the weights' type (default f32; TYPE=mxfp4 gpt-oss-tiny gives tests/vectors/gptoss-llamacpp.jsonl's mxfp4 lines,
# through arch_jsonl.py).
set -eu
build=$1 llama=$2
shift 2
[ $# -gt 0 ] || set -- qwen3-tiny gemma2-tiny gemma3-tiny phi3-tiny qwen3moe-tiny mixtral-tiny deepseek2-tiny \
  deepseek3-tiny deepseek2-tiny-kvb deepseek2-tiny-yarn
out=${TMPDIR:-/tmp}/hr-arch-check
mkdir -p "$out"
lib=$llama/build/bin
cc -O2 -I "$llama/include" -I "$llama/ggml/include" "$(dirname "$0")/arch_greedy.c" -L "$lib" -lllama -lggml \
  -lggml-base -Wl,-rpath,"$lib" -o "$out/arch_greedy"
for spec in "$@"; do
  shape=${spec%%:*} layers=
  [ "$shape" = "$spec" ] || layers="--layers ${spec#*:}"
  f=$out/$shape.gguf
  # shellcheck disable=SC2086 # $layers is empty or two words
  "$build/headroom" synth --shape "$shape" --type "${TYPE:-f32}" $layers -o "$f" 2>/dev/null
  "$out/arch_greedy" "$f" 256 "$out/$shape.llama.bin" >"$out/$shape.llama.txt" 2>"$out/$shape.llama.err"
  echo "== $spec"
  "$build/bench_arch_check" "$f" 256 "$out/$shape.llama.bin" | tail -1
done
