#!/usr/bin/env bash
# Packs the GPU kit: one compressed archive that runs Tessera on a bare GPU machine holding only a CUDA build of
# PyTorch (the same LibTorch we build against), CMake and the base system. docs/gpu.md says how to use it.
#
#   tools/gpu_bundle.sh [--build-dir build] [--out gpu-kit.tar.xz] [--no-build]
#
# Builds the build directory (the default preset's: RelWithDebInfo, i.e. -O2 -DNDEBUG) unless --no-build, then packs:
#   bin/    stripped tessera (every command; its old program names train, eval, convert, ... as links to it), the
#           unit-test binary and bench_gpu_train_step
#   lib/    every shared library those need that is neither LibTorch's nor CUDA's nor the base system's
#           (yaml-cpp, spdlog, fmt, zstd, xxhash, pcre2, ICU, ...), found with ldd
#   src/    what the programs read from the source tree: recipes/, tests/data/, tests/fault_injection/, benchmarks/*.py,
#           tools/gpu_check.sh
#   wheels/ torchtitan and its pure-Python dependencies (benchmarks/gpu_peer_wheels.txt), from tools/setup_tests.sh
# Fails when the archive is over 40 MB.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$here/build"
out="$here/gpu-kit.tar.xz"
do_build=1
while (($#)); do
  case "$1" in
    --build-dir) build=$(cd "$2" && pwd); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    *) echo "gpu_bundle.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
limit=$((40 * 1000 * 1000))
programs=(tessera tessera_tests bench_gpu_train_step)
old_names=(train eval generate convert convert_text_to_mds plan train_tokenizer)

if ((do_build)); then
  # The default preset builds neither the unit tests nor the benchmarks: turn them on in this tree.
  cmake -S "$here" -B "$build" -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_BENCHMARKS=ON > /dev/null
  cmake --build "$build" --target tessera_cli tessera_tests bench_gpu_train_step
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
kit="$stage/tessera-gpu-kit"
mkdir -p "$kit/bin" "$kit/lib" "$kit/src"

for p in "${programs[@]}"; do
  [ -x "$build/bin/$p" ] || { echo "gpu_bundle.sh: $build/bin/$p is missing (build it first)" >&2; exit 1; }
  strip -o "$kit/bin/$p" "$build/bin/$p"
done
for n in "${old_names[@]}"; do ln -s tessera "$kit/bin/$n"; done

# Shared libraries: everything ldd resolves except LibTorch / CUDA (the GPU machine's torch wheel brings them, with
# the NVIDIA libraries beside it) and the base system (glibc, libstdc++, libgcc, libm, ...), which that machine has
# in a newer version.
is_provided() {
  case "$(basename "$1")" in
    libcurl*) return 1 ;;  # not CUDA's, despite the libcu prefix below
    libtorch*|libc10*|libcaffe2*|libgomp*|libcu*|libnccl*|libnvJitLink*|libnvshmem*|libnvrtc*|libnvToolsExt*) return 0 ;;
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libutil.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) return 0 ;;
    linux-vdso*) return 0 ;;
  esac
  return 1
}
for p in "${programs[@]}"; do
  ldd "$build/bin/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  is_provided "$lib" && continue
  name=$(basename "$lib")
  [ -e "$kit/lib/$name" ] || cp -L "$lib" "$kit/lib/$name"
done
strip --strip-unneeded "$kit"/lib/*.so* 2>/dev/null || true

# What the programs read from the source tree.
(cd "$here" && tar cf - recipes tests/data tests/fault_injection benchmarks/gpu_train_vs_pytorch.py benchmarks/bench_json.py \
  benchmarks/gpu_profile.py benchmarks/torchtitan_llama.py tools/gpu_check.sh) | tar xf - -C "$kit/src"
# torchtitan's trainer and its pure-Python dependencies (tools/setup_tests.sh downloads them), for the benchmark's peers.
wheels=${TESSERA_HOME:-$HOME/.cache/tessera}/wheels
mkdir -p "$kit/wheels"
while read -r spec; do
  name=${spec%%==*}
  version=${spec#*==}
  wheel=$(ls "$wheels/${name}-${version}-"*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || { echo "gpu_bundle.sh: no wheel of $spec in $wheels (run tools/setup_tests.sh)" >&2; exit 1; }
  cp "$wheel" "$kit/wheels/"
done < <(grep -v '^#' "$here/benchmarks/gpu_peer_wheels.txt" | grep .)
commit=$(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$here" status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit+changes"
echo "$commit" > "$kit/COMMIT"

# x86's branch filter before LZMA2 (most of the archive is machine code): at preset 6 the archive is smaller than
# plain -9's and takes 40% less CPU time, and with blocks of 24 MiB both cores compress it (2026-12-07: 37.99 MB in
# 92 s of CPU against -9's 38.70 MB in 152 s, Intel Xeon).
tar cf - -C "$stage" tessera-gpu-kit | xz -T0 --x86 --lzma2=preset=6 > "$out.tmp"
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "gpu_bundle.sh: $out: $((size / 1000)) kB ($(ls "$kit/lib" | wc -l) libraries; commit $(cat "$kit/COMMIT"))"
if ((size > limit)); then
  echo "gpu_bundle.sh: the archive is over 40 MB" >&2
  exit 1
fi
