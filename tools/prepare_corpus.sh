#!/usr/bin/env bash
# Prepares the main job's data from the fortunes corpus that tools/setup.sh installs (Debian's `fortunes` package):
#   1. trains a byte-level BPE tokenizer with Tessera's own trainer (8192 tokens) -> OUT/tokenizer.json
#   2. converts the documents to MDS with LLM Foundry's concat_tokens semantics (128 tokens per sample,
#      '<|endoftext|>' after every document), 5% of the documents held out as `val` -> OUT/train, OUT/val
# Usage: tools/prepare_corpus.sh [OUT (default data/fortunes)]. Env: TESSERA_BIN (default build/bin),
# TESSERA_CORPUS (default /usr/share/games/fortunes). Re-running with the same inputs reuses the finished output.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-data/fortunes}
BIN=${TESSERA_BIN:-build/bin}
CORPUS=${TESSERA_CORPUS:-/usr/share/games/fortunes}
STAMP="$OUT/.prepared"
KEY="corpus=$CORPUS vocab=8192 concat=128 val=0.05 seed=17"

if [[ ! -d "$CORPUS" ]]; then
  echo "prepare_corpus: $CORPUS does not exist; run tools/setup.sh (it installs the fortunes package)" >&2
  exit 1
fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" ]]; then
  echo "prepare_corpus: $OUT is up to date"
  exit 0
fi
rm -f "$STAMP"
mkdir -p "$OUT"
"$BIN/tessera" tokenizer --input "$CORPUS" --format fortunes --vocab-size 8192 --output "$OUT/tokenizer.json"
"$BIN/tessera" text-to-mds --input "$CORPUS" --format fortunes --tokenizer "$OUT/tokenizer.json" --output "$OUT" \
  --concat-tokens 128 --eos-text '<|endoftext|>' --val-fraction 0.05 --seed 17 --overwrite
echo "$KEY" > "$STAMP"
echo "prepare_corpus: wrote $OUT"
