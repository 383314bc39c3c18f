// Hugging Face names resolved the way transformers resolves them: a local path, a hub id ("meta-llama/Llama-3.2-1B")
// found in the local Hugging Face cache, or, unless HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, a hub id
// downloaded from the Hub (HF_ENDPOINT, default https://huggingface.co; HF_TOKEN or the saved login) into that cache.
//
// The cache is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (its older name), else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub, laid out by huggingface_hub as
// models--{org}--{name}/refs/main (the commit of the main revision) and models--{org}--{name}/snapshots/{commit}/.
#pragma once

#include <filesystem>
#include <string>

namespace tessera::util {

// The Hugging Face hub cache folder the environment names (it need not exist).
std::filesystem::path hf_hub_cache();

// `name_or_path` as a folder: itself when it is a local folder, else the snapshot of the hub id's main revision in
// the cache, else that snapshot downloaded (every file of the revision but weights in formats Tessera does not load:
// *.bin, *.pt, *.h5, *.msgpack, *.onnx, *.gguf, ...; each blob checked against the size and, for LFS files, the
// SHA-256 the Hub announced; file names and ETags from the Hub confined to the cache). A cached snapshot is used as
// it is, without asking the Hub for a newer commit. Throws tessera::Error (component "hf_hub") naming what was
// searched, or the repository and the Hub's refusal.
std::filesystem::path resolve_hf_folder(const std::string& name_or_path);

// What data::Tokenizer::from_file takes: `name_or_path` itself when it is a file (a tokenizer.json), else the folder
// (a local folder or a hub id's snapshot in the cache), which must hold a tokenizer.json or a tokenizer_config.json
// (LLM Foundry's tiktoken wrapper has no tokenizer.json); the folder's tokenizer_config.json then applies too. Throws
// tessera::Error naming what was searched.
std::filesystem::path resolve_hf_tokenizer(const std::string& name_or_path);

// The tokenizer a command uses (`eval`, `generate`): `tokenizer` (its --tokenizer) when given, else the model folder's.
// Throws ConfigError (component `tool`, exit 2) with resolve_hf_tokenizer's message, which says to give --tokenizer
// when the model folder has none.
std::filesystem::path resolve_tool_tokenizer(const std::string& tokenizer, const std::string& model,
                                             const std::string& tool);

}  // namespace tessera::util
