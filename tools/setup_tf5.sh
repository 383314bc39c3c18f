#!/usr/bin/env bash
# transformers 5 in a venv of its own ($TESSERA_HOME/venv-tf5, default ~/.cache/tessera/venv-tf5), beside the main
# venv's transformers 4.57: a folder saved by transformers 5 writes its config.json in another form (rope_parameters,
# dtype), which tests/compat/test_transformers5_configs.py (ctest's `compat_tf5` entry) loads into Tessera against
# transformers 5's own logits. tools/setup_tests.sh runs this after the main venv is ready.
#
# torch, numpy, pytest and the rest come from the main venv: a .pth file puts its site-packages on sys.path after this
# venv's own, so that only what transformers 5 needs newer (transformers, huggingface_hub, tokenizers) is installed
# here and shadows the main venv's copy. Idempotent: a second run with the pins satisfied downloads nothing.
set -euo pipefail

TESSERA_HOME=${TESSERA_HOME:-$HOME/.cache/tessera}
main="$TESSERA_HOME/venv"
venv="$TESSERA_HOME/venv-tf5"
# transformers and what it needs newer than the main venv has (pip's resolver picked these for 5.25.0).
pins=(transformers==5.25.0 huggingface_hub==2.4.0 tokenizers==0.23.3 httpx2==2.16.2 httpcore2==2.16.2 kernels==0.19.1
      typer==0.29.2 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 shellingham==1.5.4 tomlkit==0.15.3
      truststore==0.10.5)
log() { printf '[setup-tf5] %s\n' "$*"; }

[ -x "$main/bin/python" ] || { echo "[setup-tf5] error: $main does not exist; run tools/setup.sh first" >&2; exit 1; }
stamp="$venv/.tessera-tf5.sha256"
want=$(printf '%s\n' "${pins[@]}" "$(readlink -f "$main/bin/python")" | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "venv $venv: up to date"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  # (A venv made by a venv's interpreter sits on that venv's base Python, not on the venv: the .pth below adds it.)
  "$main/bin/python" -m venv "$venv"
fi
site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site "$main" > "$(site "$venv")/tessera-main-venv.pth"
log "installing ${pins[*]} (the rest comes from $main)"
# (pip names mosaicml-streaming's transformers<5 from the main venv as a conflict: that package is not used here.)
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"
"$venv/bin/python" -c 'import torch, transformers, pytest, safetensors
assert transformers.__version__.startswith("5."), transformers.__version__
print("[setup-tf5] transformers", transformers.__version__, "torch", torch.__version__)'
echo "$want" > "$stamp"
