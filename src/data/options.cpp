// Parsing of tokenizer and text-loader sections.
#include "tessera/data/options.h"

#include <fmt/format.h>

namespace tessera::data {
namespace {

using config::Section;

StreamSpec parse_stream(Section& s, bool is_dataset) {
  StreamSpec st;
  st.local = is_dataset ? s.get_string("local", "") : s.require_string("local");
  // `remote:` left blank means local-only, as LLM Foundry's recipes write it; a real remote needs network access.
  if (auto remote = s.get_optional_string("remote")) s.not_supported("remote", *remote);
  st.split = s.get_optional_string("split");
  st.proportion = s.get_optional_double("proportion");
  st.repeat = s.get_optional_double("repeat");
  st.choose = s.get_optional_int("choose");
  s.check(!st.proportion || *st.proportion > 0, "proportion", "must be positive");
  s.check(!st.repeat || *st.repeat > 0, "repeat", "must be positive");
  s.check(!st.choose || *st.choose > 0, "choose", "must be positive");
  s.check(!(st.proportion && (st.repeat || st.choose)), "proportion", "give at most one of proportion, repeat, choose");
  s.check(!(st.repeat && st.choose), "repeat", "give at most one of proportion, repeat, choose");
  if (!is_dataset) s.finish({"download_retry", "download_timeout", "validate_hash", "keep_zip"});
  return st;
}

LoaderOptions parse_text_loader(Section& s) {
  LoaderOptions o;
  o.name = "text";
  auto ds = s.section("dataset");
  o.tokens.max_seq_len = ds.require_int("max_seq_len");
  ds.check(o.tokens.max_seq_len > 0, "max_seq_len", "must be positive");
  if (const config::Value* streams = ds.raw("streams")) {
    auto map = Section(streams, ds.key_path("streams"), ds.context());
    for (const std::string& name : map.keys()) {
      auto stream = map.section(name);
      o.dataset.streams.push_back(parse_stream(stream, false));
    }
    map.finish();
    ds.check(!o.dataset.streams.empty(), "streams", "must name at least one stream");
  }
  StreamSpec top = parse_stream(ds, true);
  if (o.dataset.streams.empty()) {
    ds.check(!top.local.empty(), "local", "missing required key (or give `streams`)");
    o.dataset.streams.push_back(top);
  }
  o.dataset.shuffle = ds.get_bool("shuffle", false);
  o.dataset.shuffle_seed = ds.get_int("shuffle_seed", o.dataset.shuffle_seed);
  o.dataset.shuffle_algo =
      ds.get_choice("shuffle_algo", o.dataset.shuffle_algo, {"naive", "py1s", "py1br", "py1e", "py1b", "py2s"});
  if (o.dataset.shuffle_algo == "py1b" || o.dataset.shuffle_algo == "py2s")
    ds.not_supported("shuffle_algo", o.dataset.shuffle_algo);
  o.dataset.shuffle_block_size = ds.get_optional_int("shuffle_block_size");
  o.dataset.num_canonical_nodes = ds.get_optional_int("num_canonical_nodes");
  ds.check(!o.dataset.num_canonical_nodes || *o.dataset.num_canonical_nodes > 0, "num_canonical_nodes",
           "must be positive");
  o.dataset.partition_algo = ds.get_choice("partition_algo", o.dataset.partition_algo, {"orig", "relaxed"});
  o.tokens.token_encoding_type =
      ds.get_choice("token_encoding_type", o.tokens.token_encoding_type,
                    {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"});
  o.dataset.epoch_size = ds.get_optional_int("epoch_size");
  const std::string sampling = ds.get_string("sampling_method", "balanced");
  if (sampling != "balanced") ds.not_supported("sampling_method", sampling);
  const std::string batching = ds.get_string("batching_method", "random");
  if (batching != "random") ds.not_supported("batching_method", batching);
  ds.get_optional_int("predownload");  // local shards only: nothing to download ahead
  ds.get_optional_string("cache_limit");
  ds.finish({"hf_name", "hf_kwargs", "preprocessing_fn", "decoder_only_format", "packing_ratio", "allow_pad_trimming",
             "sampling_granularity", "download_retry", "download_timeout", "validate_hash", "keep_zip",
             "allow_unsafe_types", "replication", "stream_name", "stream_config", "eos_token_id", "bos_token_id"});
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

}  // namespace

TokenizerOptions parse_tokenizer_options(Section& s) {
  TokenizerOptions o;
  o.name = s.require_string("name");
  auto kwargs = s.section("kwargs");
  o.model_max_length = kwargs.get_optional_int("model_max_length");
  kwargs.finish({"trust_remote_code", "padding_side", "use_fast", "add_bos_token", "add_eos_token"});
  s.finish();
  return o;
}

config::Registry<LoaderOptions>& loader_registry() {
  static config::Registry<LoaderOptions>* registry = [] {
    auto* r = new config::Registry<LoaderOptions>("data loader");
    r->add("text", parse_text_loader);
    r->add_foundry_names({"finetuning"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::data
