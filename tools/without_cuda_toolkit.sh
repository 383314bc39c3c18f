#!/usr/bin/env bash
# Runs a command as on a machine without a CUDA toolkit (docs/getting-started.md#building): in a private mount
# namespace, empty folders over every place this machine's toolkit is found (the folder of each nvcc on PATH and of
# the file it runs, the toolkit's root, and the shared include and lib folders that hold CUDA's runtime headers or
# libcudart), and PATH without them. Needs root or unprivileged user namespaces (unshare -r).
#
#   tools/without_cuda_toolkit.sh COMMAND [ARG...]
set -euo pipefail
(($#)) || { echo "usage: tools/without_cuda_toolkit.sh COMMAND [ARG...]" >&2; exit 2; }
if [[ -z ${TESSERA_WITHOUT_CUDA_TOOLKIT:-} ]]; then
  flags=(-m)
  [[ $(id -u) -eq 0 ]] || flags+=(-r)
  exec unshare "${flags[@]}" env TESSERA_WITHOUT_CUDA_TOOLKIT=1 "$0" "$@"
fi
mount --make-rprivate /
hide=()
add() { [[ -d $1 ]] && hide+=("$(readlink -f "$1")"); return 0; }
for root in /usr/local/cuda /usr/local/cuda-* ${CUDA_HOME:-} ${CUDA_PATH:-}; do add "$root"; done
while read -r nvcc; do
  add "$(dirname "$nvcc")"
  # A wrapper script (`exec /opt/cuda/bin/nvcc "$@"`) names the real one.
  real=$(grep -o '/[^ "]*/bin/nvcc' "$nvcc" 2>/dev/null | head -1 || true)
  [[ -n $real ]] && add "$(dirname "$(dirname "$real")")"
  add "$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
done < <(type -ap nvcc)
for d in /usr/local/include /usr/include; do
  [[ -e $d/cuda_runtime_api.h && $d != /usr/include ]] && add "$d"
done
for d in /usr/local/lib /usr/local/lib64; do
  compgen -G "$d/libcudart.so*" > /dev/null && add "$d"
done
hidden=()
for d in $(printf '%s\n' "${hide[@]}" | sort -u); do  # parents sort first; their children are hidden with them
  [[ $d == / || $d == /usr || $d == /usr/local ]] && continue
  for h in "${hidden[@]}"; do [[ $d == "$h"/* ]] && continue 2; done
  mount -t tmpfs -o ro tessera-no-cuda "$d"
  hidden+=("$d")
done
path=()
IFS=: read -ra parts <<< "$PATH"
for p in "${parts[@]}"; do [[ -x $p/nvcc ]] || path+=("$p"); done
PATH=$(IFS=:; echo "${path[*]}")
export PATH
if command -v nvcc > /dev/null; then
  echo "without_cuda_toolkit.sh: nvcc is still found at $(command -v nvcc)" >&2
  exit 1
fi
exec "$@"
