#!/usr/bin/env bash
# streams_ab.sh: two headroom builds side by side on 16-stream and 1-stream decode, alternating per
# round (the order flips each round, so a load that comes and goes hits both alike), 2 threads, with
# the load average before and after each pair of runs. Prints one line per round, mix and side.
#
# usage: OLD=path/to/headroom NEW=build/headroom bench/streams_ab.sh [ROUNDS] [MIXES]
#        MIXES: names of MODELS/tl-mix-NAME.gguf (`headroom synth --shape tinyllama-1.1b --mix NAME`)
# env:   MODELS (/tmp/h29-models), THREADS (2), GEN (64), PARALLEL (16), ISA (unset: the default kernels;
#        scalar, avx2 or avx512: `--isa` on both sides' runs)
set -euo pipefail
R=${1:-4}
MIXES=${2:-"Q4_K_M Q5_K_M"}
OLD=${OLD:?set OLD to the baseline headroom binary}
NEW=${NEW:-build/headroom}
MODELS=${MODELS:-/tmp/h29-models}
THREADS=${THREADS:-2}
GEN=${GEN:-64}
PARALLEL=${PARALLEL:-16}
tmp=$(mktemp -d /tmp/streams-ab.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$OLD" "$tmp/old" && cp "$NEW" "$tmp/new" # private copies: a rebuild meanwhile changes nothing
par=(); for ((i = 0; i < PARALLEL; i++)); do par+=(-p "the cat sat"); done
isa=(); if [[ -n "${ISA:-}" ]]; then isa=(--isa "$ISA"); fi
jget() { python3 -c 'import json,sys; j=json.load(sys.stdin); [j := j[k] for k in sys.argv[1].split(".")]; print(j)' "$1"; }
for ((r = 1; r <= R; r++)); do
    if ((r % 2)); then sides="old new"; else sides="new old"; fi
    for mix in $MIXES; do
        for s in $sides; do
            f=$MODELS/tl-mix-$mix.gguf
            l0=$(cut -d' ' -f1 /proc/loadavg)
            p=$("$tmp/$s" run -m "$f" "${par[@]}" -n "$GEN" --temp 0 --ignore-eos -t "$THREADS" --ctx 1024 "${isa[@]}" --json |
                jget engine.decode_tokens_per_second)
            o=$("$tmp/$s" run -m "$f" -p "Once upon a time" -n "$GEN" --temp 0 --ignore-eos -t "$THREADS" --ctx 1024 \
                "${isa[@]}" --json | jget generation_tokens_per_second)
            echo "round $r $mix $s par$PARALLEL $p one $o load $l0 $(cut -d' ' -f1 /proc/loadavg)"
        done
    done
done
