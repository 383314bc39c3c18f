#!/usr/bin/env bash
# Prepares the fine-tuning example's data (recipes/sft-tiny-cpu.yaml) from the fortunes corpus: one prompt/response
# row per fortune of at most 400 characters, the prompt naming the fortune file's topic ("Tell me a fortune about
# computers.\n"), the response the fortune; every 20th row held out.
#   OUT/train.jsonl, OUT/test.jsonl    the splits, as LLM Foundry's finetuning loader reads a folder
#   OUT/tokenizer/                     the main job's tokenizer (tools/prepare_corpus.sh) as a folder whose
#                                      tokenizer_config.json names <|endoftext|> as the eos token
# Usage: tools/prepare_sft_data.sh [OUT (default data/fortunes_sft)]. Env: TESSERA_CORPUS (default
# /usr/share/games/fortunes), TESSERA_TOKENIZER (default data/fortunes/tokenizer.json). Needs jq (tools/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-data/fortunes_sft}
CORPUS=${TESSERA_CORPUS:-/usr/share/games/fortunes}
TOKENIZER=${TESSERA_TOKENIZER:-data/fortunes/tokenizer.json}
if [[ ! -f "$TOKENIZER" ]]; then
  echo "prepare_sft_data: $TOKENIZER does not exist; run tools/prepare_corpus.sh first" >&2
  exit 1
fi
mkdir -p "$OUT/tokenizer"
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for f in $(find "$CORPUS" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort); do
  jq -R -s -c --arg topic "$(basename "$f")" \
    'split("\n%\n") | map(gsub("^\\s+|\\s+$"; "")) | map(select(length > 0 and length <= 400)) | .[]
     | {prompt: ("Tell me a fortune about " + $topic + ".\n"), response: .}' "$f" >> "$rows"
done
awk -v out="$OUT" 'NR % 20 == 0 { print > (out "/test.jsonl"); next } { print > (out "/train.jsonl") }' "$rows"
cp "$TOKENIZER" "$OUT/tokenizer/tokenizer.json"
printf '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "clean_up_tokenization_spaces": false}\n' \
  > "$OUT/tokenizer/tokenizer_config.json"
echo "prepare_sft_data: wrote $(wc -l < "$OUT/train.jsonl") train and $(wc -l < "$OUT/test.jsonl") test rows to $OUT"
