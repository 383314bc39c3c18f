// Parsing of tokenizer and text-loader sections.
#include "tessera/data/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessera/storage/storage.h"
#include "tessera/util/error.h"

namespace tessera::data {
namespace {

using config::Section;

StreamSpec parse_stream(Section& s, bool is_dataset) {
  StreamSpec st;
  // `remote:` left blank means local-only, as LLM Foundry's recipes write it. With a remote, `local` is where shards
  // are cached (default: a folder under the temporary directory named after the remote).
  st.remote = s.get_optional_string("remote");
  if (st.remote && st.remote->empty()) st.remote.reset();
  if (st.remote) {
    try {
      storage::parse_uri(*st.remote);
    } catch (const Error& e) {
      s.check(false, "remote", e.message());
    }
  }
  st.local = is_dataset || st.remote ? s.get_string("local", "") : s.require_string("local");
  st.split = s.get_optional_string("split");
  st.keep_zip = s.get_bool("keep_zip", false);
  st.download_retry = static_cast<int>(s.get_int("download_retry", 2));
  s.check(st.download_retry >= 1, "download_retry", "must be at least 1 (it counts attempts)");
  st.download_timeout = s.get_double("download_timeout", 60);
  s.check(st.download_timeout > 0, "download_timeout", "must be positive");
  // Streaming checks one named hash when asked; Tessera always checks every hash index.json records.
  s.get_optional_string("validate_hash");
  st.proportion = s.get_optional_double("proportion");
  st.repeat = s.get_optional_double("repeat");
  st.choose = s.get_optional_int("choose");
  s.check(!st.proportion || *st.proportion > 0, "proportion", "must be positive");
  s.check(!st.repeat || *st.repeat > 0, "repeat", "must be positive");
  s.check(!st.choose || *st.choose > 0, "choose", "must be positive");
  s.check(!(st.proportion && (st.repeat || st.choose)), "proportion", "give at most one of proportion, repeat, choose");
  s.check(!(st.repeat && st.choose), "repeat", "give at most one of proportion, repeat, choose");
  if (!is_dataset) s.finish();
  return st;
}

// StreamingDataset's keys of a loader's `dataset:` section: `local`/`split` (stream 0) or `streams`, shuffling,
// partitioning and sampling.
void parse_streaming_dataset(Section& ds, StreamingOptions& o) {
  if (const config::Value* streams = ds.raw("streams")) {
    auto map = Section(streams, ds.key_path("streams"), ds.context());
    for (const std::string& name : map.keys()) {
      auto stream = map.section(name);
      o.streams.push_back(parse_stream(stream, false));
      o.streams.back().key = "dataset.streams." + name;
    }
    map.finish();
    ds.check(!o.streams.empty(), "streams", "must name at least one stream");
  }
  StreamSpec top = parse_stream(ds, true);
  if (o.streams.empty()) {
    ds.check(!top.local.empty() || top.remote, "local", "missing required key (or give `remote` or `streams`)");
    o.streams.push_back(top);
  }
  o.shuffle = ds.get_bool("shuffle", false);
  o.shuffle_seed = ds.get_int("shuffle_seed", o.shuffle_seed);
  o.shuffle_algo = ds.get_choice("shuffle_algo", o.shuffle_algo, {"naive", "py1s", "py1br", "py1e", "py1b", "py2s"});
  if (o.shuffle_algo == "py1b" || o.shuffle_algo == "py2s") ds.not_supported("shuffle_algo", o.shuffle_algo);
  o.shuffle_block_size = ds.get_optional_int("shuffle_block_size");
  o.num_canonical_nodes = ds.get_optional_int("num_canonical_nodes");
  ds.check(!o.num_canonical_nodes || *o.num_canonical_nodes > 0, "num_canonical_nodes", "must be positive");
  o.partition_algo = ds.get_choice("partition_algo", o.partition_algo, {"orig", "relaxed"});
  o.epoch_size = ds.get_optional_int("epoch_size");
  const std::string sampling = ds.get_string("sampling_method", "balanced");
  if (sampling != "balanced") ds.not_supported("sampling_method", sampling);
  const std::string batching = ds.get_string("batching_method", "random");
  if (batching != "random") ds.not_supported("batching_method", batching);
  o.predownload = ds.get_optional_int("predownload");
  ds.check(!o.predownload || *o.predownload >= 0, "predownload", "must be non-negative");
  if (const config::Value* limit = ds.raw("cache_limit"); limit != nullptr && !limit->is_null()) {
    try {
      o.cache_limit = mds::parse_cache_limit(limit->text());
    } catch (const Error& e) {
      ds.check(false, "cache_limit", e.message());
    }
    if (*o.cache_limit == 0) o.cache_limit.reset();  // Streaming: 0 disables the limit
  }
}

LoaderOptions parse_text_loader(Section& s) {
  LoaderOptions o;
  o.name = "text";
  auto ds = s.section("dataset");
  o.tokens.max_seq_len = ds.require_int("max_seq_len");
  ds.check(o.tokens.max_seq_len > 0, "max_seq_len", "must be positive");
  parse_streaming_dataset(ds, o.dataset);
  o.tokens.token_encoding_type =
      ds.get_choice("token_encoding_type", o.tokens.token_encoding_type,
                    {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"});
  ds.finish({"hf_name", "hf_kwargs", "preprocessing_fn", "decoder_only_format", "packing_ratio", "allow_pad_trimming",
             "sampling_granularity", "allow_unsafe_types", "replication", "stream_name", "stream_config",
             "eos_token_id", "bos_token_id"});
  o.tokens.drop_last = s.get_bool("drop_last", true);
  o.num_workers = s.get_int("num_workers", 0);
  s.check(o.num_workers >= 0, "num_workers", "must be non-negative");
  o.tokens.prefetch_factor = s.get_int("prefetch_factor", 2);
  s.check(o.tokens.prefetch_factor >= 1, "prefetch_factor", "must be at least 1");
  s.get_bool("pin_memory", false);         // batches are copied with non_blocking copies when a GPU is used
  s.get_bool("persistent_workers", true);  // worker threads always persist across epochs
  s.get_int("timeout", 0);
  s.finish();
  return o;
}

// hf_kwargs.data_files: a path, a list of paths (both the train split), or a map of split -> path(s).
std::map<std::string, std::vector<std::string>> parse_data_files(Section& kw) {
  std::map<std::string, std::vector<std::string>> out;
  const config::Value* v = kw.raw("data_files");
  if (v == nullptr) return out;
  const auto paths = [&](const config::Value& x, const std::string& key) {
    std::vector<std::string> p;
    if (x.is_scalar()) {
      p.push_back(x.text());
    } else if (x.is_sequence()) {
      for (const config::Value& item : x.items()) {
        kw.check(item.is_scalar(), key, "expected a list of paths");
        p.push_back(item.text());
      }
    } else {
      kw.check(false, key, "expected a path, a list of paths, or a map of split names to paths");
    }
    return p;
  };
  if (v->is_map()) {
    for (const auto& [split, x] : v->entries()) out[split] = paths(x, "data_files." + split);
  } else {
    out["train"] = paths(*v, "data_files");
  }
  return out;
}

LoaderOptions parse_finetuning_loader(Section& s) {
  LoaderOptions o;
  o.name = "finetuning";
  FinetuningOptions f;
  auto ds = s.section("dataset");
  const bool mds = ds.has("local") || ds.has("streams") || ds.has("remote");
  if (mds) {
    // LLM Foundry's StreamingFinetuningDataset: MDS samples in Streaming's order (its shuffle_seed default 9176).
    for (const char* key : {"hf_name", "hf_kwargs", "preprocessing_fn", "safe_load"}) {
      ds.check(!ds.has(key), key, "is for hf_name data; this dataset streams MDS shards (local / streams)");
    }
    StreamingOptions so;
    parse_streaming_dataset(ds, so);
    f.streams = std::move(so);
    f.shuffle = f.streams->shuffle;
    f.token_encoding_type = ds.get_choice("token_encoding_type", f.token_encoding_type,
                                          {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"});
  } else {
    f.hf_name = ds.require_string("hf_name");
    f.split = ds.require_string("split");
  }
  if (!mds) {
    auto kw = ds.section("hf_kwargs");
    f.data_files = parse_data_files(kw);
    f.data_dir = kw.get_string("data_dir", "");
    kw.finish({"token", "revision", "trust_remote_code", "cache_dir", "num_proc"});
    const bool builder = f.hf_name == "json" || f.hf_name == "csv" || f.hf_name == "parquet" || f.hf_name == "arrow";
    ds.check(!builder || !f.data_files.empty(), "hf_kwargs",
             fmt::format("hf_name: {} needs hf_kwargs.data_files", f.hf_name));
  }
  if (const config::Value* pre = ds.raw("preprocessing_fn"); pre != nullptr && !pre->is_null()) {
    if (pre->is_scalar() && is_registered_preprocessor(ds.get_string("preprocessing_fn", ""))) {
      f.preprocessor = ds.get_string("preprocessing_fn", "");
    } else if (!pre->is_map()) {
      ds.not_supported("preprocessing_fn",
                       "an importable Python function (give the {prompt: COLUMN, response: COLUMN} mapping, or a "
                       "name LLM Foundry registers: tatsu-lab/alpaca, HuggingFaceH4/databricks_dolly_15k, "
                       "bigscience/P3, Muennighoff/P3, Muennighoff/flan, teknium/OpenHermes-2.5, math-ai/StackMathQA, "
                       "AI-MO/NuminaMath-CoT)");
    } else {
      auto m = ds.section("preprocessing_fn");
      ds.check(
          pre->entries().size() == 2 && pre->entries()[0].first == "prompt" && pre->entries()[1].first == "response",
          "preprocessing_fn", "the mapping must have exactly the keys prompt and response, in that order");
      f.columns = std::make_pair(m.require_string("prompt"), m.require_string("response"));
      m.finish();
    }
  }
  f.max_seq_len = ds.require_int("max_seq_len");
  ds.check(f.max_seq_len > 0, "max_seq_len", "must be positive");
  ds.check(ds.has("decoder_only_format"), "decoder_only_format", "must be set to true or false");
  if (!ds.get_bool("decoder_only_format", true)) ds.not_supported("decoder_only_format", "encoder-decoder models");
  f.target_prompts = ds.get_string("target_prompts", f.target_prompts);
  f.target_responses = ds.get_string("target_responses", f.target_responses);
  std::transform(f.target_prompts.begin(), f.target_prompts.end(), f.target_prompts.begin(), ::tolower);
  std::transform(f.target_responses.begin(), f.target_responses.end(), f.target_responses.begin(), ::tolower);
  try {
    validate_target_settings(f.target_prompts, f.target_responses, ds.path());
  } catch (const Error& e) {
    ds.check(false, "target_prompts", e.what());
  }
  f.allow_pad_trimming = ds.get_bool("allow_pad_trimming", false);
  if (const config::Value* pr = ds.raw("packing_ratio"); pr != nullptr && !pr->is_null()) {
    if (pr->is_scalar() && pr->text() == "auto") {
      f.auto_packing_ratio = true;
    } else {
      const std::optional<double> r = pr->as_double();
      ds.check(r.has_value(), "packing_ratio", "expected a number or auto");
      ds.check(*r >= 1, "packing_ratio", "must be at least 1");
      f.packing_ratio = *r;
    }
  }
  f.max_leftover_bins_to_keep = ds.get_optional_int("max_leftover_bins_to_keep");
  ds.check(!f.max_leftover_bins_to_keep || *f.max_leftover_bins_to_keep >= 0, "max_leftover_bins_to_keep",
           "must be non-negative");
  ds.check(!f.max_leftover_bins_to_keep || f.packing_ratio || f.auto_packing_ratio, "max_leftover_bins_to_keep",
           "is set but packing_ratio is not");
  if (!mds) {
    f.shuffle = ds.get_bool("shuffle", false);
    f.shuffle_seed = ds.get_int("shuffle_seed", 0);
  }
  ds.get_bool("safe_load", false);  // local files only: nothing is downloaded
  for (const char* key : {"seq_parallel_replication", "auto_packing_replication"}) {
    if (auto r = ds.get_optional_int(key)) ds.check(*r == 1, key, "sequence parallelism is not supported");
  }
  ds.get_optional_int("eos_token_id");  // LLM Foundry checks these against the tokenizer; so does the trainer
  ds.get_optional_int("bos_token_id");
  ds.finish({"mapping_fn", "pad_to_longest", "replication"});
  o.tokens.max_seq_len = f.max_seq_len;
  o.finetuning = std::move(f);
  o.tokens.drop_last = s.get_bool("drop_last", false);
  o.num_workers = s.get_int("num_workers", 0);
  s.check(o.num_workers >= 0, "num_workers", "must be non-negative");
  o.tokens.prefetch_factor = s.get_int("prefetch_factor", 2);
  s.get_bool("pin_memory", false);
  s.get_bool("persistent_workers", true);
  s.get_int("timeout", 0);
  s.finish();
  return o;
}

}  // namespace

LoaderOptions parse_text_section(Section& s) {
  return parse_text_loader(s);
}

LoaderOptions parse_finetuning_section(Section& s) {
  return parse_finetuning_loader(s);
}

TokenizerOptions parse_tokenizer_options(Section& s) {
  TokenizerOptions o;
  o.name = s.require_string("name");
  auto kwargs = s.section("kwargs");
  o.model_max_length = kwargs.get_optional_int("model_max_length");
  // Read, and changes nothing: Tessera runs no code from a tokenizer folder. The one remote-code tokenizer published
  // folders name, LLM Foundry's TiktokenTokenizerWrapper (DBRX's), is implemented natively; any other folder without a
  // tokenizer.json is refused when it loads, naming its tokenizer_class.
  kwargs.get_bool("trust_remote_code", false);
  kwargs.finish({"padding_side", "use_fast", "add_bos_token", "add_eos_token"});
  s.finish();
  return o;
}

}  // namespace tessera::data
