#!/usr/bin/env bash
# deps.sh: make sure the Debian packages headroom builds with are present. As root it installs the
# missing ones with apt-get; otherwise it names them and fails. With HR_DEPS_OPTIONAL=1 (the test
# tools: tmux, curl, redis-server, haproxy, yamllint, chromium, prometheus, and clang-19, which
# compiles the CUDA kernels to PTX: Makefile's TEST_TOOLS) a user who is not root gets the list and
# goes on: the tests that need a missing tool skip, each naming it (without clang-19 the build embeds
# no kernels and test_cuda_kernels_compile skips).
set -euo pipefail
need=(build-essential cmake pkg-config libpcre2-dev libjansson-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libzmq3-dev libmsgpack-dev libhiredis-dev)
if [ "${HR_DEPS_EXTRA:-}" != "" ]; then read -r -a extra <<<"$HR_DEPS_EXTRA"; need+=("${extra[@]}"); fi
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "headroom: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
    [ "${HR_DEPS_OPTIONAL:-}" = 1 ] || exit 1
    echo "headroom: could not install ${missing[*]}; the tests that need them will skip" >&2
  fi
elif [ "${HR_DEPS_OPTIONAL:-}" = 1 ]; then
  echo "headroom: tests that need ${missing[*]} will skip (as root, make test installs them)" >&2
  exit 0
else
  echo "headroom: missing Debian packages: ${missing[*]}" >&2
  echo "          install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
