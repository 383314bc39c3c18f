#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy's checks) over the product's C++ translation units: the library (src/), the tools and
# the examples (what users run and copy). A clang build tree of its own provides the compile commands; only its
# precompiled headers are built, so LibTorch's headers are parsed once. Each file still takes ~10 s (the checks walk
# the whole AST, LibTorch's included), so clean results are cached by content (tools/tidy_cached.py), and the tests
# and benchmarks are left to a run by hand with
# FILE_REGEX '/work/main/(tests|benchmarks)/'. Any finding fails.
# Usage: tools/tidy.sh [BUILD_DIR (default build/tidy)] [FILE_REGEX (default: src/, tools/, examples/)]
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$SRC/build/tidy}
FILTER=${2:-$SRC/(src|tools|examples)/}

mkdir -p "$(dirname "$BUILD")"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g0" -DTESSERA_HABIT_TESTS=OFF > "$BUILD.configure.log" 2>&1 ||
    { cat "$BUILD.configure.log"; exit 1; }
fi
# The precompiled headers (one per target that does not reuse the library's), nothing else.
mapfile -t PCH < <(ninja -C "$BUILD" -t targets all | grep -oE '^[^:]*cmake_pch\.hxx\.(pch|gch)' | sort -u)
# (clang's PCH is named .pch or .gch depending on how CMake detected the compiler; with none found, a bare `ninja`
# would build the whole tree instead.)
((${#PCH[@]})) || { echo "tidy: no precompiled-header target in $BUILD" >&2; exit 1; }
ninja -C "$BUILD" "${PCH[@]}" > "$BUILD.pch.log" 2>&1 || { tail -40 "$BUILD.pch.log"; exit 1; }
# Files generated in the build tree (none today) and the PCH sources themselves are not ours to check. A file that
# was clean under the same clang-tidy, .clang-tidy, compile command and included text is not checked again
# (tools/tidy_cached.py; TIDY_CACHE= turns the cache off).
python3 "$SRC/tools/tidy_cached.py" --build "$BUILD" --filter "$FILTER" -j "$(nproc)" \
  ${TIDY_CACHE+--cache "$TIDY_CACHE"} > "$BUILD.log" 2>&1 || status=$?
if [[ ${status:-0} -ne 0 ]]; then
  grep -E -A6 "(warning|error): " "$BUILD.log" | head -200 >&2
  tail -3 "$BUILD.log" >&2
  echo "tidy: findings (full output: $BUILD.log)" >&2
  exit 1
fi
echo "tidy: clean ($(tail -1 "$BUILD.log"))"
