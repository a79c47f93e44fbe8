#!/usr/bin/env bash
# mutants.sh: the mutation check (docs/TESTING.md). Copies the committed tree (git archive HEAD) to a
# scratch directory, builds it once (Release), then applies each mutant below alone: one exact text
# replacement in one file (it must match exactly once), rebuilds the tests named for it, runs them, and
# restores the file. A mutant is KILLED when a test fails, SURVIVED when all pass; a mutant that does
# not compile is reported as such (a broken list entry, not a kill). Prints one line per mutant and a
# summary; exit 1 when any survived.
#   bench/mutants.sh [SCRATCH_DIR]        (default /tmp/headroom-mutants; JOBS=2)
#   ONLY=rope-sign bench/mutants.sh       (one mutant by name)
# Long: one build of the tree, then per mutant a rebuild of one file plus the test links and runs.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRATCH=${1:-/tmp/headroom-mutants}
JOBS=${JOBS:-2}
if [ ! -f "$SCRATCH/CMakeLists.txt" ]; then
  mkdir -p "$SCRATCH"
  git archive HEAD | tar -x -C "$SCRATCH"
fi
[ -e "$SCRATCH/../shared" ] || [ ! -d ../shared ] || ln -s "$(cd ../shared && pwd)" "$SCRATCH/../shared" 2>/dev/null || true
# Release with fault injection compiled in (test_faults then runs; nothing fails unless it arms a point)
cmake -S "$SCRATCH" -B "$SCRATCH/b" -DCMAKE_BUILD_TYPE=Release -DHR_FAULT=ON >/dev/null
echo "mutants: building the clean tree in $SCRATCH/b"
cmake --build "$SCRATCH/b" -j "$JOBS" >"$SCRATCH/build.log" 2>&1 || { tail -20 "$SCRATCH/build.log"; exit 2; }

# name#file#exact text#replacement#tests (ctest names, space-separated); '#' separates the fields
MUTANTS=$(cat <<'LIST'
block-table-short#src/engine/scheduler.c#{ return (slots + e->block_size - 1) / e->block_size; }#{ return slots / e->block_size; }#test_engine test_engine_prefix test_kv_swap
attention-last-block#src/backend/cpu/kv_attention.c#    int n_blk = (n_ctx + B - 1) / B;#    int n_blk = n_ctx / B;#test_kv_basic test_engine
attention-policy-last-block#src/backend/cpu/kv_attention.c#n_heads = a->n_heads, n_blk = (n_ctx + B - 1) / B;#n_heads = a->n_heads, n_blk = n_ctx / B;#test_kv_policy test_engine_policy test_policy_stream
block-pos-off-by-one#src/kv/attend.c#int bi = pos / B, t = pos % B;#int bi = (pos + 1) / B, t = (pos + 1) % B;#test_kv_basic test_engine
refcount-skip-decrement#src/kv/block.c#if (--p->refcnt[b] > 0) return;#if (p->refcnt[b] - 1 > 0) return;#test_kv_pool test_kv_basic test_engine_prefix
q8-dequant-scale#src/backend/cpu/kv_format.c#float w = p[t] * kv_f16_to_f32(sc[g]);#float w = p[t] * kv_f16_to_f32(sc[g]) * 1.0078125f;#test_kv_formats
q8-dot-scale#src/backend/cpu/kv_format.c#        scores[t] = s * step;#        scores[t] = s * step * 1.0078125f;#test_kv_formats
fp8-dequant-scale#src/backend/cpu/kv_format.c#        float w = p[t] * sc;#        float w = p[t] * sc * 1.0078125f;#test_kv_formats
q4-dequant-scale#src/backend/cpu/kv_format.c#float ws = p[t] * kv_f16_to_f32(pair[0]), wm#float ws = p[t] * kv_f16_to_f32(pair[0]) * (bits == 4 ? 1.0078125f : 1.0f), wm#test_kv_formats
kivi2-dequant-scale#src/backend/cpu/kv_format.c#float ws = p[t] * kv_f16_to_f32(pair[0]), wm#float ws = p[t] * kv_f16_to_f32(pair[0]) * (bits == 2 ? 1.0078125f : 1.0f), wm#test_kv_formats
lowbit-k-scale#src/backend/cpu/kv_format.c#row[c] = (float)kv_q16(q[c] * kv_f16_to_f32(sc[c]), inv); /* exact integers */#row[c] = (float)kv_q16(q[c] * kv_f16_to_f32(sc[c]) * 1.0078125f, inv);#test_kv_formats
rope-sign#src/backend/cpu/ops.c#        x[a] = x0 * c - x1 * s;#        x[a] = x0 * c + x1 * s;#test_model test_engine test_stories
rope-freq#src/backend/cpu/forward.c#double f = pow(base, -2.0 * i / hp->n_rot)#double f = pow(base, -2.0 * (i + 1) / hp->n_rot)#test_model test_stories
attn-softcap-off#src/backend/cpu/kv_attention.c#    if (cap <= 0.0f) return scale;#    if (cap >= 0.0f) return scale;#test_model test_model_arch
window-layer-base#src/backend/cpu/forward.c#const double base = hp->n_window_layers == hp->n_layer ? base_swa : hp->rope_base;#const double base = hp->rope_base;#test_model test_model_arch
qk-norm-skip#src/backend/cpu/forward.c#if (L->q_norm) norm_heads(c, L, T);#if (L->q_norm && 0) norm_heads(c, L, T);#test_model test_model_arch
post-norm-skip#src/backend/cpu/forward.c#if (post_norm) hr_op_rmsnorm(y, y, post_norm, E, hp->norm_eps);#if (post_norm && 0) hr_op_rmsnorm(y, y, post_norm, E, hp->norm_eps);#test_model test_model_arch
gelu-coefficient#src/backend/cpu/ops.c#(1.0f + 0.044715f * g * g)#(1.0f + 0.05f * g * g)#test_model test_model_arch
longrope-swapped#src/backend/cpu/forward.c#factors = c->max_ctx > hp->n_ctx_orig ? m->rope_long : m->rope_short;#factors = c->max_ctx > hp->n_ctx_orig ? m->rope_short : m->rope_long;#test_model test_model_arch
final-softcap-off#src/backend/cpu/forward.c#if (hp->final_softcap > 0.0f) {#if (hp->final_softcap < 0.0f) {#test_model test_model_arch
embd-scale-off#src/backend/cpu/forward.c#if (hp->embd_scale > 0.0f) /* gemma: sqrt(E) */#if (hp->embd_scale < 0.0f) /* gemma: sqrt(E) */#test_model test_model_arch
token-id-bounds#src/engine/engine.c#if (p->prompt[i] < 0 || p->prompt[i] >= e->n_vocab)#if (p->prompt[i] < 0)#test_engine test_runtime test_server
max-tokens-off-by-one#src/engine/engine.c#else if (r->n_known - r->n_prompt >= r->max_tokens ||#else if (r->n_known - r->n_prompt > r->max_tokens ||#test_engine test_runtime
swap-out-failure-as-success#src/kv/swap.c#        if (w <= 0) return false;#        if (w <= 0) return true;#test_kv_swap test_engine test_faults
swap-read-wrong-slot#src/kv/swap.c#kv_pread_all(w->fd, w->buf, p->block_bytes, off)#kv_pread_all(w->fd, w->buf, p->block_bytes, off + 1)#test_kv_swap test_engine
sse-lost-chunk#src/server/stream.c#        if (role || d.n_text > 0 || lp) {#        if (role || d.n_text > 1 || lp) {#test_server test_soak
sse-no-done#src/server/stream.c#    hr_srv_buf_put(&j->pending, "data: [DONE]\n\n", 14);#    hr_srv_buf_put(&j->pending, "\n", 1);#test_server
retry-after-rounds-down#src/server/openai.c#return s >= 86400.0 ? 86400 : (int)ceil(s);#return s >= 86400.0 ? 86400 : (int)s;#test_server_parse test_server
api-key-any#src/server/server.c#    return diff == 0 && lb > 0;#    return lb > 0;#test_server
detokenize-bound#src/server/openai.c#json_integer_value(t) >= n_vocab)#json_integer_value(t) > n_vocab)#test_server_parse test_server
n-cap#src/server/openai.c#!read_int(root, "n", 1, sp->max_choices, &n, e)#!read_int(root, "n", 1, sp->max_choices + 1, &n, e)#test_server_parse test_server
max-tokens-limit-ignored#src/server/openai.c#long long cap = sp->max_tokens_limit > 0 ? sp->max_tokens_limit : 1 << 30;#long long cap = 1 << 30;#test_server_parse
utf8-surrogates#src/server/openai.c#(c >= 0xD800 && c <= 0xDFFF)#(c >= 0xD800 && c < 0xD800)#test_server_parse test_server
body-limit-off#src/server/server.c#if (!k->too_large && k->body.len + *upload_size > s->p.max_body_bytes) {#if (!k->too_large && k->body.len + *upload_size > 2 * s->p.max_body_bytes) {#test_server test_soak
error-message-newline#src/common/status.c#if ((unsigned char)*c < 0x20 || *c == 0x7F) *c = '?';#if (*c == 0x7F) *c = '?';#test_chat test_server_parse
LIST
)

# the tests must pass on the clean tree, or every "kill" would mean nothing
all_tests=$(cut -d'#' -f5 <<<"$MUTANTS" | tr ' ' '\n' | sort -u | tr '\n' '|' | sed 's/^|//; s/|$//')
echo "mutants: the clean tree must pass: $all_tests"
(cd "$SCRATCH/b" && ctest -R "^($all_tests)\$" >"$SCRATCH/clean.log" 2>&1) || { tail -20 "$SCRATCH/clean.log"; exit 2; }

survived=0; killed=0; broken=0
while IFS='#' read -r name file from to tests; do
  [ -z "$name" ] && continue
  [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && continue
  src="$SCRATCH/$file"
  cp "$src" "$src.orig"
  if ! python3 - "$src" "$from" "$to" <<'PY'
import sys
p, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
s = open(p).read()
if s.count(a) != 1:
    sys.exit(f"{p}: the text occurs {s.count(a)} times")
open(p, 'w').write(s.replace(a, b))
PY
  then
    echo "BROKEN   $name (text not found once in $file)"; broken=$((broken + 1)); mv "$src.orig" "$src"; continue
  fi
  t0=$SECONDS
  if ! cmake --build "$SCRATCH/b" -j "$JOBS" $(for t in $tests; do printf -- '--target %s ' "$t"; done) >"$SCRATCH/mut-$name.log" 2>&1; then
    echo "BROKEN   $name (does not compile)"; broken=$((broken + 1))
  elif (cd "$SCRATCH/b" && ctest -R "^($(echo $tests | tr ' ' '|'))\$" >>"$SCRATCH/mut-$name.log" 2>&1); then
    echo "SURVIVED $name ($file; ran $tests; $((SECONDS - t0)) s)"; survived=$((survived + 1))
  else
    failing=$(grep -oE "[0-9]+ - test_[a-z_0-9]+ \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)" "$SCRATCH/mut-$name.log" | sed 's/^[0-9]* - //; s/ (.*//' | tr '\n' ' ')
    echo "KILLED   $name by ${failing:-?}($((SECONDS - t0)) s)"; killed=$((killed + 1))
  fi
  mv "$src.orig" "$src"
  touch "$src"
done <<<"$MUTANTS"
echo "mutants: $killed killed, $survived survived, $broken broken"
[ "$survived" -eq 0 ] && [ "$broken" -eq 0 ]
