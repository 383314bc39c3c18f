#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang in their own build tree and runs each for a bounded time from the
# committed seed corpus (fuzz/seeds/<target>/). Fails on any finding: a crash, a sanitizer report, an exception other
# than tessera::Error, a leak, a timeout or running out of the memory limit. A finding's input is kept as
# BUILD_DIR/findings/<target>/crash-* (or leak-*, timeout-*, oom-*) to reproduce with `BUILD_DIR/bin/<target> FILE`.
# Usage: tools/fuzz.sh [BUILD_DIR (default build/fuzz)] [SECONDS per target]
#   Without SECONDS (CI): a fixed seed and a fixed number of inputs per target (about 45 s each on the 2-core CI
#   machine), so every run tries the same inputs and CI is not flaky; a new finding comes from a code change.
#   With SECONDS: that long per target with a random seed, for hunting by hand.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$SRC/build/fuzz}
SECONDS_EACH=${2:-}
TARGETS=(fuzz_tokenizer_json fuzz_mds_reader fuzz_safetensors fuzz_recipe_yaml fuzz_chat_template fuzz_safe_path)
# The largest input each target is given: tokenizer.json seeds are ~10 KB, recipes ~5 KB, chat templates < 6 KB, MDS
# and safetensors < 2 KB.
declare -A MAX_LEN=([fuzz_tokenizer_json]=65536 [fuzz_mds_reader]=8192 [fuzz_safetensors]=8192
                    [fuzz_recipe_yaml]=16384 [fuzz_chat_template]=16384 [fuzz_safe_path]=512)
# Inputs per target in the fixed mode (each target's speed differs by 10x).
declare -A RUNS=([fuzz_tokenizer_json]=300000 [fuzz_mds_reader]=60000 [fuzz_safetensors]=80000
                 [fuzz_recipe_yaml]=50000 [fuzz_chat_template]=100000 [fuzz_safe_path]=100000)

if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DTESSERA_FUZZ=ON -DTESSERA_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }
fi
cmake --build "$BUILD" -- "${TARGETS[@]}"

# One target per core at a time (each is one process): the targets run two by two on the 2-core CI machine.
run_target() {  # run_target TARGET: its log in BUILD/TARGET.log, its status in BUILD/TARGET.status
  local t=$1 corpus="$BUILD/corpus/$1" findings="$BUILD/findings/$1" budget
  rm -rf "$corpus" "$findings"
  mkdir -p "$corpus" "$findings"
  if [[ -n "$SECONDS_EACH" ]]; then
    budget=(-max_total_time="$SECONDS_EACH")
  else
    budget=(-seed=1 -runs="${RUNS[$t]}")
  fi
  echo "== $t: ${budget[*]} from $(ls "$SRC/fuzz/seeds/$t" | wc -l) seeds" > "$BUILD/$t.summary"
  # One process; leaks count (detect_leaks=1 is libFuzzer's default under ASan). LibTorch's own one-time allocations
  # are not leaks LSan reports (they stay reachable).
  local status=0
  "$BUILD/bin/$t" "${budget[@]}" -rss_limit_mb=4096 -timeout=20 \
    -max_len="${MAX_LEN[$t]}" -artifact_prefix="$findings/" -print_final_stats=1 \
    "$corpus" "$SRC/fuzz/seeds/$t" > "$BUILD/$t.log" 2>&1 || status=$?
  echo "$status" > "$BUILD/$t.status"
}
jobs_at_once=$(nproc)
for t in "${TARGETS[@]}"; do
  while (( $(jobs -rp | wc -l) >= jobs_at_once )); do wait -n || true; done
  run_target "$t" &
done
wait

failed=()
for t in "${TARGETS[@]}"; do
  cat "$BUILD/$t.summary"
  if [[ "$(cat "$BUILD/$t.status")" != 0 ]]; then
    failed+=("$t")
    tail -60 "$BUILD/$t.log"
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|cov: [0-9]+" "$BUILD/$t.log" | tail -3 | sed 's/^/  /'
done
if (( ${#failed[@]} )); then
  echo "fuzz: findings in ${failed[*]} (inputs under $BUILD/findings/)" >&2
  exit 1
fi
echo "fuzz: no findings in ${TARGETS[*]}"
