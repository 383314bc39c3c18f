#!/usr/bin/env bash
# Composer + LLM Foundry in a venv of their own ($TESSERA_HOME/venv-composer, default ~/.cache/tessera/venv-composer).
# They pin another torch than the one LibTorch comes from, so they cannot share the main venv. tools/setup_tests.sh
# (README's test command) runs this: the tests in tests/composer/ (ctest's `composer` entry) compare Tessera against their own code, and
# benchmarks/train_vs_pytorch.py measures Composer's Trainer beside Tessera when this venv exists. The main job does
# not need it. Idempotent: a second run with the pin satisfied downloads nothing.
#
# Needs tools/setup.sh's Debian packages (python3-venv). About 7 GB (torch with its CUDA libraries).
set -euo pipefail

TESSERA_HOME=${TESSERA_HOME:-$HOME/.cache/tessera}
venv="$TESSERA_HOME/venv-composer"
pin="llm-foundry==0.22.0"  # brings mosaicml (Composer) 0.32.1, mosaicml-streaming 0.12.0, torch 2.7.0
test_pin="pytest==8.4.2"    # for the opt-in tests/composer/
tiktoken_pin="tiktoken==0.14.0"  # LLM Foundry's TiktokenTokenizerWrapper imports it (tests/composer/test_tiktoken_wrapper.py)
log() { printf '[setup-composer] %s\n' "$*"; }

if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "${TESSERA_PYTHON:-python3}" -m venv "$venv"
fi
# (pip's output is captured first: `pip show | grep -q` under pipefail fails when grep stops reading early.)
version_of() { "$venv/bin/python" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
if [ "$(version_of llm-foundry)" = "${pin#*==}" ]; then
  log "$pin: present"
else
  log "installing $pin (and Composer, with their torch)"
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on "$pin"
fi
if [ "$(version_of pytest)" != "${test_pin#*==}" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$test_pin"
fi
if [ "$(version_of tiktoken)" != "${tiktoken_pin#*==}" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$tiktoken_pin"
fi
"$venv/bin/python" -c 'import composer, llmfoundry, torch; print("[setup-composer] composer", composer.__version__,
"llm-foundry", llmfoundry.__version__, "torch", torch.__version__)'
