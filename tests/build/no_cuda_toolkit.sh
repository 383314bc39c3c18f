#!/usr/bin/env bash
# A machine without a CUDA toolkit configures Tessera and compiles its CUDA code (the NCCL backend, NVML's CUDA calls)
# against the nvidia wheels beside torch alone (cmake/TesseraTorchCuda.cmake): the toolkit is hidden by
# tools/without_cuda_toolkit.sh, and the tree is configured as the default preset is (unity off, so that the two
# objects can be named) in BUILD_DIR/no-cuda-toolkit, which later runs reuse.
#
#   tests/build/no_cuda_toolkit.sh BUILD_DIR
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tree=$(cd "${1:?usage: no_cuda_toolkit.sh BUILD_DIR}" && pwd)/no-cuda-toolkit
mkdir -p "$tree"
if ! "$src/tools/without_cuda_toolkit.sh" cmake --preset default -S "$src" -B "$tree" -DCMAKE_UNITY_BUILD=OFF \
    > "$tree/configure.log" 2>&1; then
  cat "$tree/configure.log"
  echo "no_cuda_toolkit: the configure failed without a CUDA toolkit" >&2
  exit 1
fi
grep -E 'CUDA [0-9]+ runtime from the nvidia wheel beside torch|NCCL collectives' "$tree/configure.log"
grep -q 'NCCL collectives: .*/nvidia/nccl/include/nccl.h' "$tree/configure.log" ||
  { echo "no_cuda_toolkit: NCCL's header was not taken from the nvidia wheel" >&2; exit 1; }
"$src/tools/without_cuda_toolkit.sh" ninja -C "$tree" src/CMakeFiles/tessera.dir/distributed/nccl_backend.cpp.o \
  src/CMakeFiles/tessera.dir/util/nvml.cpp.o
echo "no_cuda_toolkit: configured and compiled the CUDA code with no toolkit"
