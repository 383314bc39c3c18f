#!/usr/bin/env bash
# Runs one tier of the test suite through its CMake workflow preset, then reports on it (docs/testing.md#tiers):
#   tools/test.sh        the test tier: configure (preset `test`), build, and every ctest entry but the deep ones;
#                        the last step of README's test command
#   tools/test.sh deep   the deep tier: ASan+UBSan, TSan, fuzzing, clang-tidy (CI runs it after the test tier)
# Either way ctest writes JUnit XML to build/junit-<tier>.xml, and tools/ci_report.py prints the slowest 15 entries
# and fails the run if an entry was skipped that tests/expected_skips.txt does not list. The exit code is non-zero if
# the workflow or the report failed.
set -uo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$SRC"
tier=${1:-test}
case "$tier" in
  test | deep) ;;
  *) echo "usage: tools/test.sh [test|deep]" >&2; exit 2 ;;
esac
junit=build/junit-$tier.xml
rm -f "$junit"
start=$SECONDS
cmake --workflow --preset "$tier"
rc=$?
elapsed=$((SECONDS - start))
if [[ -f $junit ]]; then
  python3 tools/ci_report.py --junit "$junit" --expected-skips tests/expected_skips.txt --tier "$tier" \
    --seconds "$elapsed" || rc=1
else
  echo "[test] tier $tier: no $junit (the workflow stopped before ctest ran); $elapsed s" >&2
  [[ $rc -ne 0 ]] || rc=1
fi
exit $rc
