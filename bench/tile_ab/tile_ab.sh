#!/usr/bin/env bash
# tile_ab.sh: the AVX2 x16 tiles of two source trees side by side in one process (main.c): OLD's
# kernels_x16.h as A, NEW's as B, alternating sample by sample on the same data. For a change to a
# tile, where two separate bench_tile runs on a noisy host differ by more than the change.
#
# usage: OLD=/path/to/old/checkout bench/tile_ab/tile_ab.sh TYPE NR K NT [SAMPLES] [COPIES]
#        e.g. git worktree add /tmp/base HEAD~1; OLD=/tmp/base bench/tile_ab/tile_ab.sh q4_Kx16 64 2048 16 101
# env:   NEW (this checkout), BUILD (NEW/build: its libhr_backend_cpu.a, libhr_tensor.a and
#        libhr_common.a, from `make`), CC (cc), A_FLAGS / B_FLAGS (extra flags for one side, e.g.
#        B_FLAGS=-DHR_X16_PF=8192 with OLD=NEW to try a setting)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
NEW=${NEW:-$(cd "$here/../.." && pwd)}
OLD=${OLD:?set OLD to the baseline source tree}
BUILD=${BUILD:-$NEW/build}
CC=${CC:-cc}
for lib in backend_cpu tensor common; do
    [[ -f $BUILD/libhr_$lib.a ]] || { echo "tile_ab.sh: no $BUILD/libhr_$lib.a (run make, or set BUILD)" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/tile-ab.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
flags=(-O2 -std=c11 -D_GNU_SOURCE -mavx2 -mfma -mf16c)
for side in a b; do
    printf '#define HR_X16_512 0\n#define HR_X16FN(name) v%s_##name\n#include "backend/cpu/kernels_x16.h"\n' "$side" \
        >"$tmp/v$side.c"
done
# shellcheck disable=SC2086
"$CC" "${flags[@]}" ${A_FLAGS:-} -I"$OLD/src" -c "$tmp/va.c" -o "$tmp/va.o"
# shellcheck disable=SC2086
"$CC" "${flags[@]}" ${B_FLAGS:-} -I"$NEW/src" -c "$tmp/vb.c" -o "$tmp/vb.o"
"$CC" -O2 -std=c11 -D_GNU_SOURCE -I"$NEW/src" -c "$here/main.c" -o "$tmp/main.o"
"$CC" "$tmp/main.o" "$tmp/va.o" "$tmp/vb.o" -L"$BUILD" -lhr_backend_cpu -lhr_tensor -lhr_common -lm -lpthread \
    -o "$tmp/tile_ab"
"$tmp/tile_ab" "$@"
