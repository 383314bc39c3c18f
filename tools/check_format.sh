#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted by .clang-format (clang-format --dry-run -Werror); prints the
# files that are not. Fix with: git ls-files '*.cpp' '*.h' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (tools/setup_tests.sh installs it)" >&2; exit 1; }
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cpp' '*.h' '*.hpp' '*.cc')
if ((${#bad[@]})); then
  printf 'not clang-formatted (%d):\n' "${#bad[@]}"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check_format: $(git ls-files '*.cpp' '*.h' '*.hpp' '*.cc' | wc -l) files formatted"
