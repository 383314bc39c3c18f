#!/usr/bin/env bash
# Makes a fresh Debian machine ready to build and run Tessera, and installs nothing else (the test suite's peers and
# tools: tools/setup_tests.sh, README's command (b)). Idempotent: a second run with everything present downloads
# nothing and finishes in seconds.
#
#   1. Debian packages: the compiler toolchain and the C++ libraries Tessera links, plus `fortunes` (the main job's
#      corpus) and jq (tools/prepare_sft_data.sh); only those missing.
#   2. A machine-wide Python venv at $TESSERA_HOME/venv (default ~/.cache/tessera/venv) holding the pinned PyPI `torch`
#      wheel, which provides LibTorch (headers, shared libraries, CMake config) and, through the nvidia-* wheels it
#      depends on, CUDA's runtime and NCCL (no CUDA toolkit needed: cmake/TesseraTorchCuda.cmake), and the `pyarrow`
#      wheel, which provides Arrow's and Parquet's C++ libraries (tools/requirements.txt). It lives outside the checkout
#      so fresh clones reuse it. Nothing here imports Python: the product is C++.
#   3. The C sources of zstd 1.5.7, from the pinned PyPI `zstd` source distribution (which bundles them), at
#      $TESSERA_HOME/src/zstd-<version>: CMake builds them into Tessera, because MDS shards must be compressed by the
#      zstd version Streaming uses to be byte-identical to its (Debian 12 has 1.5.4; docs/data.md#reading-dataset-files).
#
# Downloads show their progress (pip's bars on a terminal; each file's name and size in a log).
# Environment: TESSERA_HOME (install prefix), TESSERA_PYTHON (interpreter that creates the venv; default python3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TESSERA_HOME=${TESSERA_HOME:-$HOME/.cache/tessera}
venv="$TESSERA_HOME/venv"
log() { printf '[setup] %s\n' "$*"; }
# shellcheck source=tools/setup_common.sh
source "$here/setup_common.sh"

# ---- 1. Debian packages ------------------------------------------------------------------------------------------
apt_packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libcurl4-openssl-dev libssl-dev libexpat1-dev libzstd-dev libxxhash-dev zlib1g-dev libpcre2-dev libicu-dev libgloo-dev coinor-libcbc-dev
  libcpp-httplib-dev  # `tessera serve`
  python3 python3-venv
  fortunes jq
)
apt_install_missing "${apt_packages[@]}"

# ---- 2. Python venv with LibTorch (and CUDA's runtime) and Arrow ------------------------------------------------
req="$here/requirements.txt"
stamp="$venv/.tessera-requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "venv $venv: up to date"
else
  python=${TESSERA_PYTHON:-python3}
  if [ ! -x "$venv/bin/python" ]; then
    log "creating venv $venv with $($python --version)"
    mkdir -p "$TESSERA_HOME"
    "$python" -m venv "$venv"
  fi
  log "installing $(grep -c '^[a-z]' "$req") pinned Python packages from $req (LibTorch is the torch wheel, 4.8 GB with CUDA's libraries)"
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on -r "$req"
  echo "$want" > "$stamp"
fi

torch_cmake=$("$venv/bin/python" - <<'PY'
import glob, os, sys
# Avoid `import torch` (slow); the wheel's CMake package sits at a fixed place inside site-packages.
hits = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "torch", "share", "cmake", "Torch"))
print(hits[0] if hits else "")
PY
)
[ -n "$torch_cmake" ] || { echo "[setup] error: torch CMake package not found in $venv" >&2; exit 1; }
log "LibTorch CMake package: $torch_cmake"

# ---- 3. zstd sources ------------------------------------------------------------------------------------------------
zstd_version=1.5.7.2
zstd_sha256=6d8684c69009be49e1b18ec251a5eb0d7e24f93624990a8a124a1da66a92fc8a
zstd_dir="$TESSERA_HOME/src/zstd-$zstd_version"
if [ -f "$zstd_dir/zstd/lib/zstd.h" ]; then
  log "zstd sources $zstd_dir: present"
else
  tmp=$(mktemp -d)
  log "fetching the zstd $zstd_version source distribution from PyPI"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "zstd==$zstd_version" -d "$tmp"
  echo "$zstd_sha256  $tmp/zstd-$zstd_version.tar.gz" | sha256sum -c --quiet - \
    || { echo "[setup] error: zstd-$zstd_version.tar.gz does not have the pinned sha256" >&2; exit 1; }
  mkdir -p "$TESSERA_HOME/src"
  tar -xzf "$tmp/zstd-$zstd_version.tar.gz" -C "$tmp"
  rm -rf "$zstd_dir" && mv "$tmp/zstd-$zstd_version" "$zstd_dir"
  rm -rf "$tmp"
  log "zstd sources: $zstd_dir"
fi
log "ready to build: cmake --workflow --preset default (the tests' peers and tools: tools/setup_tests.sh)"
