#!/usr/bin/env bash
# pack.sh: builds here what bench/gpu/check.sh runs on a lent GPU machine, for a machine that cannot
# build it: the device image has the NVIDIA driver, CMake, nvcc and PyTorch, but not clang-19 (which
# compiles the kernels to PTX) nor the -dev packages of jansson, PCRE2, libmicrohttpd, libcurl and
# utf8proc, and nothing can be installed there. So the binaries check.sh needs are built here
# (Release, the PTX embedded), and packed with the shared libraries they load that are not glibc's,
# and with the files of ../shared the tests read, into one compressed file in the checkout, ignored by
# git, that the device tool carries:
#
#   bench/gpu/pack.sh                 # writes .gpu-pack/pack.tar.gz (and says its size)
#   device run, carry [".gpu-pack"]:  bash bench/gpu/check.sh
#
# check.sh finds the pack and uses it instead of building (also where clang-19 is missing): it
# unpacks it, links the path the binaries were built at (their tests name the source tree by its
# absolute path) to the checkout there, and puts the pack's libraries first on LD_LIBRARY_PATH for
# headroom's programs only (PyTorch keeps the machine's). HEADROOM_GPU_PACK=0 makes check.sh build
# instead; HEADROOM_GPU_PACK=FILE names another pack.
#
# The binaries need glibc 2.34 or newer there (the MANIFEST records the newest symbol version any
# packed file asks for). Usage: bench/gpu/pack.sh [BUILD_DIR] (default build-gpu).
set -eu
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
src=$PWD
pack=.gpu-pack
command -v clang-19 > /dev/null || { echo "pack.sh: clang-19 is not installed (apt-get install clang-19)" >&2; exit 1; }
bins=(headroom test_gpu_cuda_kernels test_gpu_cuda_forward test_cuda_backend gpu_bench bench_sampler)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$(nproc)" --target "${bins[@]}" hr_fake_cuda hr_emu_cuda > /dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/lib" "$stage/shared"
# the programs, the fake driver test_cuda_backend loads by its built path, the emulating driver (a
# dry run of the pack without a GPU: HEADROOM_CUDA_DRIVER=build-gpu/libhr_emu_cuda.so)
for b in "${bins[@]}"; do cp "$build/$b" "$stage/build/"; done
cp "$build/libhr_fake_cuda.so" "$build/libhr_emu_cuda.so" "$stage/build/"
# their libraries, less glibc's own (the machine's glibc is newer than this one's or the binaries do
# not run at all) and the C++ runtime (lib/cxx: used only where the machine has none, since an older
# libstdc++ first on the path would break the machine's PyTorch)
mkdir -p "$stage/lib/cxx"
for f in "$stage"/build/*; do
    ldd "$f" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
    case $(basename "$lib") in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | ld-linux*) ;;
    libstdc++.so.* | libgcc_s.so.*) cp -L "$lib" "$stage/lib/cxx/" ;;
    *) cp -L "$lib" "$stage/lib/" ;;
    esac
done
# ../shared's files the GPU tests read (the F32 model and its greedy vectors, the q8_0 one's, the corpus)
shared=${HR_SHARED_DIR:-$src/../shared}
for f in models/stories260K.gguf models/stories260K-q8_0.gguf vectors/stories260K-greedy.jsonl \
    vectors/stories260K-q8_0-greedy.jsonl corpus/stories260K-samples.txt; do
    if [ -f "$shared/$f" ]; then
        mkdir -p "$stage/shared/$(dirname "$f")"
        cp "$shared/$f" "$stage/shared/$f"
    else
        echo "pack.sh: $shared/$f is absent: the tests that read it will skip there" >&2
    fi
done
glibc=$(for f in "$stage"/build/* "$stage"/lib/*.so*; do objdump -T "$f" 2> /dev/null; done |
    grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sort -uV | tail -1)
commit=$(git describe --always --dirty 2> /dev/null || echo unknown)
cat > "$stage/MANIFEST" << EOF
src=$src
build=$build
commit=$commit
glibc=${glibc#GLIBC_}
made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version | head -1)
EOF
mkdir -p "$pack"
tar -C "$stage" -czf "$pack/pack.tar.gz" . # gzip: every image has it (xz not always)
echo "pack.sh: $pack/pack.tar.gz, $(du -h "$pack/pack.tar.gz" | cut -f1) ($commit; binaries built at $src/$build; glibc ${glibc#GLIBC_} or newer there)"
echo "pack.sh: carry \"$pack\" in the device call, and run bash bench/gpu/check.sh there"
