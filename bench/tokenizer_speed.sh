#!/usr/bin/env bash
# tokenizer_speed.sh: encode throughput of `headroom tokenize --stats` (encode only, the vocabulary load is
# excluded), median of N runs per vocabulary, two binaries side by side and interleaved (A, B, A, B, ...) so
# that machine noise falls on both alike. Used for docs/BENCHMARKS.md "Tokenizer throughput".
#   bench/tokenizer_speed.sh OLD_HEADROOM NEW_HEADROOM TEXT_FILE [RUNS] -- VOCAB...
# A VOCAB is a GGUF file, a tokenizer.json or a directory holding one; OLD_HEADROOM may be '-' (only NEW).
set -euo pipefail
old=$1 new=$2 text=$3 runs=${4:-5}
shift 4
[ "${1:-}" = "--" ] && shift
rate() { "$1" tokenize -m "$2" --count --stats -f "$text" 2>&1 >/dev/null | sed -n 's/.*(\([0-9.]*\) MB\/s.*/\1/p'; }
tokens() { "$1" tokenize -m "$2" --count -f "$text"; }
label() { echo "$1" | sed 's#.*/tokenizer-\([^/]*\)/.*#\1#; s#.*/##'; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-28s %9s %10s %10s %7s\n' vocabulary tokens old_MB/s new_MB/s new/old
for v in "$@"; do
  o=() n=()
  for ((i = 0; i < runs; i++)); do
    [ "$old" != - ] && o+=("$(rate "$old" "$v")")
    n+=("$(rate "$new" "$v")")
  done
  nm=$(printf '%s\n' "${n[@]}" | median)
  if [ "$old" != - ]; then
    om=$(printf '%s\n' "${o[@]}" | median)
    printf '%-28s %9s %10s %10s %7.3f\n' "$(label "$v")" "$(tokens "$new" "$v")" "$om" "$nm" "$(echo "$nm / $om" | bc -l)"
  else
    printf '%-28s %9s %10s %10s %7s\n' "$(label "$v")" "$(tokens "$new" "$v")" - "$nm" -
  fi
done
