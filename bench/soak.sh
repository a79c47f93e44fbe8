#!/usr/bin/env bash
# soak.sh: the long soak (tests/test_soak.c with many rounds) on a Release build: six clients of
# mixed traffic, dropped streams, abandoned requests, malformed and oversized requests, requests
# without the API key, slow clients stalled until the server's deadlines close them (0.5 s each), a
# client that never reads, all against a pool small enough to preempt by swap all the time. Prints the
# client and server tallies, the RSS after warm-up and at the end, and the wall time.
#   ROUNDS=6000 BUILD=build bench/soak.sh   (about 3 minutes on 2 shared cores; 15000 took 426 s)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-6000}
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "${JOBS:-2}" --target test_soak >/dev/null
start=$(date +%s)
HR_SOAK_ROUNDS=$ROUNDS "$BUILD/test_soak"
echo "soak: $ROUNDS rounds x 6 clients in $(($(date +%s) - start)) s"
