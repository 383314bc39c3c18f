// Test driver for tests/compat: runs Tessera on inputs prepared by Python and writes the results, so pytest can compare
// them with the real peers (Hugging Face transformers, the plain-PyTorch MPT reference, mosaicml-streaming).
//
//   tessera_compat_driver forward DIR INPUTS.safetensors OUT.safetensors [--reference | --train]
//       loads the HF folder DIR, runs forward on input_ids (and attention_mask / sequence_id if given), computes the
//       next-token loss on input_ids, backpropagates, and writes logits, loss and grad.<parameter> for every parameter;
//       --train runs in training mode: a mixture of experts' auxiliary losses join the loss (aux.<name>), and each
//       router's tokens per expert are written (tokens_per_expert.<router>)
//   tessera_compat_driver export DIR OUT_DIR [bf16] [family] [transformers4]   (config.json for transformers 4)
//       loads DIR and writes it back with save_hf_model (transformers' layout, or the family's own with "family")
//   tessera_compat_driver generate DIR INPUTS.safetensors OUT.safetensors MAX_NEW [EOS]
//       greedy generation for each row of input_ids (its first lengths[b] tokens when INPUTS has "lengths"); writes
//       tokens (B, n) padded with -1
//   tessera_compat_driver mds-write SPEC.json OUT_DIR
//       SPEC: {"columns": {name: encoding}, "compression": str|null, "hashes": [...], "size_limit": int|null,
//              "samples": [{name: value}]}; values: numbers, strings, {"bytes": hex}, {"json": any},
//              {"ndarray": dtype, "shape": [...], "data": [...]}
//   tessera_compat_driver mds-read DIR OUT.json      every sample, values in the same JSON forms
//   tessera_compat_driver streaming CASES.json OUT.json
//       CASES: [{"shuffle": algo, "sizes": [...], "ncn", "seed", "epoch", "block"} |
//               {"partition": algo, "n", "ncn", "p", "r", "w", "b", "drop", "initial_p"} |
//               {"sampling": [...], "choose", "granularity", "seed", "epoch", "use_epoch"}] -> one result per case
//   tessera_compat_driver streaming-epoch SPEC.json OUT.json
//       SPEC: {"streams": [{"local", "proportion"|"repeat"|"choose"}], "batch_size", "shuffle", "seed", "algo",
//              "block", "ncn", "partition", "epoch_size", "nodes", "ranks", "workers", "epoch", "sample_in_epoch",
//              "initial_p"} -> {"shape", "ids", "ids_field": the "id" column of each sample (-1 for padding)}
//   tessera_compat_driver train-trace RECIPE OUT_DIR [OVERRIDES...]
//       trains the recipe and writes OUT_DIR/init and OUT_DIR/final (the initial and final weights as HF folders)
//       and OUT_DIR/trace.json: {"batches": [input_ids of each device batch], "lrs": [rate of each step],
//       "losses": [loss of each step], "rank", "world_size"}. Under torchrun's variables (RANK, WORLD_SIZE, ...)
//       every rank runs it with its own OUT_DIR: each writes its own trace (its device batches; the losses are
//       the mean over the ranks), and rank 0 alone writes init/ and final/, gathered from the shards.
//   tessera_compat_driver finetuning-batches CONFIG.json OUT.json
//       CONFIG: {"tokenizer": folder, "device_batch_size", "drop_last", "world_size", "rank", "ranks_per_node",
//                "epoch", "date_string",
//                "dataset": {LLM Foundry's finetuning dataset keys}} -> {"batches": [{"input_ids", "labels",
//                "attention_mask", "sequence_id"}], "examples", "dropped", "packing_ratio", "packing": {...}}
//   tessera_compat_driver chat-template TEMPLATE.jinja CASES.json OUT.json
//       CASES: [context objects] -> [{"text": rendered} | {"error": message}] (chat_template::Template)
//   tessera_compat_driver tokenize TOKENIZER INPUT.json OUT.json
//       TOKENIZER: a tokenizer.json, a folder, tiktoken:ENCODING or tiktoken:ENCODING:RANKS_FILE (load_tokenizer)
//       INPUT: {"texts": [hex bytes], "add_special_tokens": bool, "pieces": bool, "decode": [[ids]], "json": bool,
//       "chat": bool} -> {"ids": [[...]], "decoded": [hex], "decoded_skip": [hex] (decode of each "decode" entry),
//        "pieces": [[hex]], "vocab_size": n, "seconds": encode time, "json": to_json(), "chat_template": str}
//   tessera_compat_driver train-tokenizer SPEC.json OUT_TOKENIZER.json
//       SPEC: {"documents": [str], "vocab_size": n, "min_frequency": n, "special_tokens": [str]}
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "models/mpt/mpt.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/config/reader.h"
#include "tessera/data/chat_template.h"
#include "tessera/data/finetuning.h"
#include "tessera/data/mds.h"
#include "tessera/data/options.h"
#include "tessera/data/streaming.h"
#include "tessera/data/streaming_dataset.h"
#include "tessera/data/tokenizer.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/generate.h"
#include "tessera/storage/s3.h"
#include "tessera/storage/storage.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace {

using tessera::checkpoint::SafetensorsFile;

int forward(const std::string& dir, const std::string& inputs_path, const std::string& out_path, bool reference,
            bool train) {
  auto model = tessera::checkpoint::load_hf_model(dir);
  // Dropout off (the compared configurations use none); --train: training mode, so that a mixture of experts adds
  // its auxiliary losses (written as aux.<name>) to the loss.
  if (train) {
    model->train();
  } else {
    model->eval();
  }
  SafetensorsFile inputs(inputs_path);
  const at::Tensor ids = inputs.load("input_ids", at::kLong);
  tessera::models::ForwardOptions fo;
  fo.reference_attention = reference;
  if (inputs.contains("attention_mask")) fo.attention_mask = inputs.load("attention_mask", at::kBool);
  if (inputs.contains("sequence_id")) fo.sequence_id = inputs.load("sequence_id", at::kLong);
  const at::Tensor logits = model->forward(ids, fo);
  const at::Tensor labels = inputs.contains("labels") ? inputs.load("labels", at::kLong) : ids;
  at::Tensor loss = tessera::models::causal_lm_loss(logits, labels);
  std::map<std::string, at::Tensor> out;
  const auto* moe = tessera::models::capability<tessera::models::MixtureOfExpertsModel>(*model);
  for (const auto& [name, value] : moe ? moe->auxiliary_losses() : std::map<std::string, at::Tensor>{}) {
    out["aux." + name] = value.reshape({1});
    loss = loss + value;  // its gradient comes through the model's graph (factor 1)
  }
  loss.backward();
  out["logits"] = logits.detach();
  out["loss"] = loss.detach().reshape({1});
  if (moe) {
    for (const auto& [router, counts] : moe->expert_token_counts()) out["tokens_per_expert." + router] = counts;
  }
  // A parameter outside the graph (an expert no token was routed to) has no gradient: written as zeros. A frozen one
  // (DeepSeek-V3's routing correction bias, a buffer in transformers) is left out.
  for (const auto& p : model->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    out["grad." + p.key()] = p.value().grad().defined() ? p.value().grad() : at::zeros_like(p.value());
  }
  tessera::checkpoint::save_safetensors(out_path, out);
  return 0;
}

int generate(const std::string& dir, const std::string& inputs_path, const std::string& out_path, int64_t max_new,
             std::optional<int64_t> eos) {
  auto model = tessera::checkpoint::load_hf_model(dir);
  SafetensorsFile inputs(inputs_path);
  const at::Tensor ids = inputs.load("input_ids", at::kLong);
  const at::Tensor lengths = inputs.contains("lengths") ? inputs.load("lengths", at::kLong) : at::Tensor();
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const at::Tensor row = ids[b].contiguous();
    const int64_t n = lengths.defined() ? lengths[b].item<int64_t>() : row.numel();
    prompts.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + n);
  }
  tessera::models::GenerationOptions g;
  g.max_new_tokens = max_new;
  g.eos_token_id = eos;
  const auto result = tessera::models::generate(*model, prompts, g);
  at::Tensor tokens = at::full({ids.size(0), max_new}, -1, at::kLong);
  for (size_t b = 0; b < result.size(); ++b) {
    for (size_t t = 0; t < result[b].size(); ++t)
      tokens[static_cast<int64_t>(b)][static_cast<int64_t>(t)] = result[b][t];
  }
  tessera::checkpoint::save_safetensors(out_path, {{"tokens", tokens}});
  return 0;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::string to_hex(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += digits[c >> 4], out += digits[c & 15];
  return out;
}

const std::map<std::string, at::ScalarType>& dtype_table() {
  static const std::map<std::string, at::ScalarType> table = {
      {"uint8", at::kByte},    {"int8", at::kChar},     {"uint16", at::kUInt16}, {"int16", at::kShort},
      {"float16", at::kHalf},  {"uint32", at::kUInt32}, {"int32", at::kInt},     {"float32", at::kFloat},
      {"uint64", at::kUInt64}, {"int64", at::kLong},    {"float64", at::kDouble}};
  return table;
}

at::ScalarType dtype_of(const std::string& name) {
  return dtype_table().at(name);
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& [name, dt] : dtype_table()) {
    if (dt == t) return name;
  }
  return "?";
}

tessera::data::mds::Field to_field(const nlohmann::ordered_json& v) {
  if (v.is_object() && v.contains("bytes")) return from_hex(v["bytes"].get<std::string>());
  if (v.is_object() && v.contains("json")) return v["json"];
  if (v.is_object() && v.contains("ndarray")) {
    const auto shape = v["shape"].get<std::vector<int64_t>>();
    const at::Tensor flat = at::tensor(v["data"].get<std::vector<double>>(), at::kDouble);
    return flat.to(dtype_of(v["ndarray"].get<std::string>())).reshape(shape);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number()) return v.get<double>();
  return v.get<std::string>();
}

nlohmann::ordered_json from_field(const tessera::data::mds::Field& f) {
  if (const auto* s = std::get_if<std::string>(&f)) return {{"bytes", to_hex(*s)}};
  if (const auto* i = std::get_if<int64_t>(&f)) return *i;
  if (const auto* d = std::get_if<double>(&f)) return *d;
  if (const auto* j = std::get_if<nlohmann::ordered_json>(&f)) return {{"json", *j}};
  const at::Tensor t = std::get<at::Tensor>(f).contiguous();
  const at::Tensor d = t.to(at::kDouble).reshape({-1});
  return {{"ndarray", dtype_name(t.scalar_type())},
          {"shape", t.sizes().vec()},
          {"data", std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel())}};
}

int mds_write(const std::string& spec_path, const std::string& out) {
  std::ifstream in(spec_path);
  const auto spec = nlohmann::ordered_json::parse(in);
  tessera::data::mds::WriterOptions o;
  o.out = out;
  for (const auto& [name, enc] : spec["columns"].items()) o.columns[name] = enc.get<std::string>();
  if (!spec["compression"].is_null()) o.compression = spec["compression"].get<std::string>();
  o.hashes = spec["hashes"].get<std::vector<std::string>>();
  o.size_limit =
      spec["size_limit"].is_null() ? std::nullopt : std::optional<uint64_t>(spec["size_limit"].get<uint64_t>());
  tessera::data::mds::MDSWriter w(o);
  for (const auto& sample : spec["samples"]) {
    tessera::data::mds::Sample s;
    for (const auto& [name, v] : sample.items()) s[name] = to_field(v);
    w.write(s);
  }
  w.finish();
  return 0;
}

int mds_read(const std::string& dir, const std::string& out_path) {
  tessera::data::mds::MDSDataset ds(dir);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < ds.size(); ++i) {
    nlohmann::ordered_json sample = nlohmann::ordered_json::object();
    for (const auto& [name, f] : ds.get(i)) sample[name] = from_field(f);
    out.push_back(sample);
  }
  std::ofstream(out_path) << out.dump();
  return 0;
}

int streaming_cases(const std::string& cases_path, const std::string& out_path) {
  namespace st = tessera::data::streaming;
  std::ifstream in(cases_path);
  const auto cases = nlohmann::json::parse(in);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cases) {
    if (c.contains("shuffle")) {
      out.push_back(st::get_shuffle(c["shuffle"], c["sizes"].get<std::vector<int64_t>>(), c["ncn"], c["seed"],
                                    c["epoch"], c["block"]));
    } else if (c.contains("partition")) {
      const st::Partition p = st::get_partitions(c["partition"], c["n"], c["ncn"], c["p"], c["r"], c["w"], c["b"],
                                                 c["drop"], c["initial_p"]);
      out.push_back({{"shape", p.shape}, {"ids", p.ids}});
    } else {
      out.push_back(st::get_sampling(c["sampling"].get<std::vector<int64_t>>(), c["choose"], c["granularity"],
                                     c["seed"], c["epoch"], c["use_epoch"]));
    }
  }
  std::ofstream(out_path) << out.dump();
  return 0;
}

int streaming_epoch(const std::string& spec_path, const std::string& out_path) {
  std::ifstream in(spec_path);
  const auto j = nlohmann::json::parse(in);
  tessera::data::StreamingOptions o;
  for (const auto& st : j["streams"]) {
    tessera::data::StreamSpec spec;
    spec.local = st.value("local", "");
    if (st.contains("remote")) spec.remote = st["remote"].get<std::string>();
    spec.keep_zip = st.value("keep_zip", false);
    if (st.contains("proportion")) spec.proportion = st["proportion"].get<double>();
    if (st.contains("repeat")) spec.repeat = st["repeat"].get<double>();
    if (st.contains("choose")) spec.choose = st["choose"].get<int64_t>();
    o.streams.push_back(spec);
  }
  o.batch_size = j["batch_size"];
  o.shuffle = j["shuffle"];
  o.shuffle_seed = j["seed"];
  o.shuffle_algo = j["algo"];
  o.shuffle_block_size = j["block"].get<int64_t>();
  o.num_canonical_nodes = j["ncn"].get<int64_t>();
  o.partition_algo = j["partition"];
  if (!j["epoch_size"].is_null()) o.epoch_size = j["epoch_size"].get<int64_t>();
  if (j.contains("cache_limit")) o.cache_limit = tessera::data::mds::parse_cache_limit(j["cache_limit"]);
  tessera::data::StreamingDataset ds(o, {j["nodes"], j["ranks"], j["workers"]});
  if (j["initial_p"].get<int64_t>() > 0) {
    tessera::data::ResumeState st = ds.state(j["epoch"], j["sample_in_epoch"]);
    st.initial_physical_nodes = j["initial_p"].get<int64_t>();
    ds.load_state(tessera::data::ResumeState::from_json(st.to_json()));
  }
  const auto p = ds.epoch_ids(j["epoch"], j["sample_in_epoch"]);
  std::vector<int64_t> fields;
  for (int64_t id : p.ids) fields.push_back(id < 0 ? -1 : std::get<int64_t>(ds.get(id)["id"]));
  nlohmann::json out = {{"shape", p.shape}, {"ids", p.ids}, {"ids_field", fields}};
  for (size_t s = 0; s < j["streams"].size(); ++s) out["cache_usage"].push_back(ds.stream(s).cache_usage());
  std::ofstream(out_path) << out.dump();
  return 0;
}

// `tokenizer_path`: a tokenizer.json or a folder; tiktoken:<encoding> (its ranks from tiktoken's cache) or
// tiktoken:<encoding>:<ranks file> (that encoding's pattern and special tokens over the file's ranks).
tessera::data::Tokenizer load_tokenizer(const std::string& tokenizer_path) {
  if (!tokenizer_path.starts_with("tiktoken:")) return tessera::data::Tokenizer::from_file(tokenizer_path);
  const std::string spec = tokenizer_path.substr(9);
  const size_t colon = spec.find(':');
  const auto encoding = tessera::data::tiktoken_encoding(spec.substr(0, colon));
  if (!encoding) throw std::runtime_error("unknown tiktoken encoding " + spec);
  if (colon == std::string::npos) return tessera::data::Tokenizer::from_tiktoken(*encoding);
  return tessera::data::Tokenizer::from_tiktoken(std::filesystem::path(spec.substr(colon + 1)), *encoding);
}

int tokenize(const std::string& tokenizer_path, const std::string& input_path, const std::string& out_path) {
  const auto tok = load_tokenizer(tokenizer_path);
  std::ifstream in(input_path);
  const auto input = nlohmann::json::parse(in);
  const bool add_special = input.value("add_special_tokens", true);
  const auto optional_id = [](std::optional<int32_t> id) { return id ? nlohmann::json(*id) : nlohmann::json(); };
  nlohmann::json out = {{"vocab_size", tok.vocab_size()},
                        {"bos", optional_id(tok.bos_token_id())},
                        {"eos", optional_id(tok.eos_token_id())},
                        {"pad", optional_id(tok.pad_token_id())}};
  std::vector<std::string> texts;
  for (const auto& t : input["texts"]) texts.push_back(from_hex(t.get<std::string>()));
  std::vector<std::vector<int32_t>> ids;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& t : texts) ids.push_back(tok.encode(t, add_special));
  out["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out["ids"] = ids;
  if (input.value("pieces", false)) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const auto& t : texts) {
      nlohmann::json row = nlohmann::json::array();
      for (const auto& p : tok.pre_tokenize(t)) row.push_back(to_hex(p));
      pieces.push_back(row);
    }
    out["pieces"] = pieces;
  }
  nlohmann::json decoded = nlohmann::json::array(), decoded_skip = nlohmann::json::array();
  for (const auto& d : input.value("decode", nlohmann::json::array())) {
    const auto v = d.get<std::vector<int32_t>>();
    decoded.push_back(to_hex(tok.decode(v, false)));
    decoded_skip.push_back(to_hex(tok.decode(v, true)));
  }
  out["decoded"] = decoded;
  out["decoded_skip"] = decoded_skip;
  if (input.value("json", false)) out["json"] = tok.to_json();
  if (input.value("chat", false) && tok.chat_template()) out["chat_template"] = *tok.chat_template();
  std::ofstream(out_path) << out.dump();
  return 0;
}

nlohmann::json rows_of(const at::Tensor& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < t.size(0); ++r) {
    const at::Tensor row = t[r].contiguous();
    rows.push_back(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
  }
  return rows;
}

int finetuning_batches(const std::string& config_path, const std::string& out_path) {
  std::ifstream in(config_path);
  const auto cfg = nlohmann::ordered_json::parse(in);
  // The dataset keys go through the recipe parser, as a train_loader section (JSON is YAML).
  nlohmann::ordered_json loader = {{"dataset", cfg["dataset"]}, {"drop_last", cfg.value("drop_last", false)}};
  const tessera::config::Value root = tessera::config::parse_yaml(loader.dump(), {config_path, 0, ""});
  tessera::config::ParseContext ctx(config_path);
  tessera::config::Section section(&root, "train_loader", ctx);
  tessera::data::LoaderOptions o = tessera::data::parse_finetuning_section(section);
  ctx.throw_if_unsupported();
  tessera::data::FinetuningOptions f = *o.finetuning;
  f.date_string = cfg.value("date_string", "");
  const tessera::data::ChatTokenizer tok(tessera::data::Tokenizer::from_file(cfg["tokenizer"].get<std::string>()),
                                         f.date_string);
  const int64_t world = cfg.value("world_size", 1), rank = cfg.value("rank", 0);
  const tessera::data::FinetuningDataset ds(f, tok, cfg["device_batch_size"].get<int64_t>(), world,
                                            cfg.value("ranks_per_node", world));
  tessera::data::FinetuningDataset::Epoch epoch(ds, cfg.value("epoch", 0), world, rank, o.tokens.drop_last);
  nlohmann::json batches = nlohmann::json::array();
  while (auto b = epoch.next()) {
    batches.push_back({{"input_ids", rows_of(b->input_ids)},
                       {"labels", rows_of(b->labels)},
                       {"attention_mask", rows_of(b->attention_mask)},
                       {"sequence_id", rows_of(b->sequence_id)}});
  }
  const tessera::data::PackingStats& st = epoch.packing_stats();
  nlohmann::json out = {
      {"batches", batches},
      {"examples", ds.size()},
      {"dropped", ds.dropped()},
      {"packing_ratio", ds.packing_ratio()},
      {"batches_in_epoch", ds.batches_in_epoch(world, o.tokens.drop_last)},
      {"packing", {{"total_tokens", st.total_tokens}, {"packed_tokens", st.packed_tokens}, {"rows", st.rows}}}};
  std::ofstream(out_path) << out.dump();
  return 0;
}

int chat_template(const std::string& template_path, const std::string& cases_path, const std::string& out_path) {
  std::ifstream t(template_path);
  std::stringstream text;
  text << t.rdbuf();
  const tessera::data::chat_template::Template tpl(text.str(), template_path);
  std::ifstream in(cases_path);
  const auto cases = nlohmann::ordered_json::parse(in);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cases) {
    try {
      out.push_back({{"text", tpl.render(c)}});
    } catch (const tessera::Error& e) {
      out.push_back({{"error", e.message()}});
    }
  }
  std::ofstream(out_path) << out.dump();
  return 0;
}

int train_tokenizer(const std::string& spec_path, const std::string& out_path) {
  std::ifstream in(spec_path);
  const auto spec = nlohmann::json::parse(in);
  tessera::data::BpeTrainerOptions o;
  o.vocab_size = spec["vocab_size"];
  o.min_frequency = spec["min_frequency"];
  o.special_tokens = spec["special_tokens"].get<std::vector<std::string>>();
  tessera::data::train_bpe_tokenizer(spec["documents"].get<std::vector<std::string>>(), o).save(out_path);
  return 0;
}

}  // namespace

// Writes the model as an HF folder in LLM Foundry's layout (the replays build LLM Foundry's own MPT from it). With
// several ranks the model's own tensors are views of freed gather buffers (FULL_SHARD), so the weights are gathered
// from the shards (every rank takes part) and rank 0 writes them from a CPU copy of the model.
void save_whole_model(tessera::core::State& s, const std::string& dir) {
  if (s.world_size == 1) {
    tessera::checkpoint::save_hf_model(*s.model, dir, at::kFloat, uint64_t{5} << 30,
                                       tessera::checkpoint::HfLayout::kFamily);
    return;
  }
  const std::vector<std::pair<std::string, at::Tensor>> weights = s.parallel->full_state_dict();
  if (s.rank != 0) return;
  const std::shared_ptr<tessera::models::CausalLM> copy = s.model->rebuild("cpu", std::nullopt);
  {
    at::NoGradGuard no_grad;
    const std::map<std::string, at::Tensor> by_name(weights.begin(), weights.end());
    for (auto& item : copy->named_parameters()) item.value().copy_(by_name.at(item.key()));
  }
  tessera::checkpoint::save_hf_model(*copy, dir, at::kFloat, uint64_t{5} << 30, tessera::checkpoint::HfLayout::kFamily);
}

// Records what the trainer did, for a plain-PyTorch replay.
class TraceCallback : public tessera::core::Callback {
 public:
  explicit TraceCallback(std::string dir) : dir_(std::move(dir)) {}
  std::string name() const override { return "TraceCallback"; }
  void run_event(tessera::core::Event e, tessera::core::State& s, tessera::core::Logger& /*l*/) override {
    using tessera::core::Event;
    if (e == Event::kFitStart) {
      save_whole_model(s, dir_ + "/init");
      trace_["rank"] = s.rank;
      trace_["world_size"] = s.world_size;
    }
    if (e == Event::kBatchStart) {
      const at::Tensor ids = s.batch.input_ids.contiguous();
      trace_["batches"].push_back(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()));
      trace_["lrs"].push_back(s.current_lr());
    }
    if (e == Event::kBatchEnd) trace_["losses"].push_back(s.train_loss);
    if (e == Event::kFitEnd) {
      save_whole_model(s, dir_ + "/final");
      std::ofstream(dir_ + "/trace.json") << trace_.dump();
    }
  }

 private:
  std::string dir_;
  nlohmann::json trace_;
};

int train_trace(const std::string& recipe, const std::string& out_dir, const std::vector<std::string>& overrides) {
  auto trace = std::make_shared<TraceCallback>(out_dir);
  tessera::trainer::Trainer trainer(tessera::trainer::load_train_config(recipe, overrides), {{}, {trace}});
  trainer.fit();
  return 0;
}

// Runs a list of storage operations in one process ({"op":
// "put"|"put_file"|"put_parts"|"put_if"|"put_tree"|"get"|"range"|"download"|"list"|"remove"| "stat", ...}) and writes
// their results plus how often credentials were read and how many requests were sent.
int storage_batch(const std::string& ops_path, const std::string& out_path) {
  namespace storage = tessera::storage;
  std::ifstream in(ops_path);
  const auto ops = nlohmann::json::parse(in);
  nlohmann::json results = nlohmann::json::array();
  for (const auto& op : ops) {
    const std::string name = op.at("op");
    nlohmann::json r = nlohmann::json::object();
    try {
      if (name == "put") {
        storage::write(op.at("uri"), op.at("data").get<std::string>());
      } else if (name == "put_file") {
        storage::upload(op.at("path"), op.at("uri"));
      } else if (name == "put_if") {  // a conditional write: "expected" an ETag, or null for "no object yet"
        const auto etag = storage::write_if(op.at("uri"), op.at("data").get<std::string>(),
                                            op.at("expected").is_null()
                                                ? std::nullopt
                                                : std::optional<std::string>(op.at("expected").get<std::string>()));
        r["etag"] = etag ? nlohmann::json(*etag) : nlohmann::json();
      } else if (name == "put_tree") {  // a folder, "last" files last, with "replace": what it lacks is deleted
        storage::upload_tree(op.at("path"), op.at("uri"), op.value("last", std::vector<std::string>{}),
                             op.value("replace", false));
      } else if (name == "put_parts") {  // a file's bytes, split at "cuts", written as separate buffers
        const std::string bytes = tessera::util::read_file(op.at("path"));
        std::vector<std::string_view> parts;
        size_t from = 0;
        for (const size_t cut : op.at("cuts").get<std::vector<size_t>>()) {
          parts.emplace_back(std::string_view(bytes).substr(from, cut - from));
          from = cut;
        }
        parts.emplace_back(std::string_view(bytes).substr(from));
        storage::write_parts(op.at("uri"), parts);
      } else if (name == "get") {
        r["data"] = storage::read(op.at("uri"));
      } else if (name == "range") {
        r["data"] = storage::read_range(op.at("uri"), op.at("offset"), op.at("length"));
      } else if (name == "download") {
        storage::download(op.at("uri"), op.at("path"));
      } else if (name == "list") {
        for (const auto& o : storage::list(op.at("uri"))) r["objects"].push_back({o.uri, o.size, o.etag});
      } else if (name == "remove") {
        storage::remove(op.at("uri"));
      } else if (name == "sleep") {  // time passing between operations (credentials expiring)
        std::this_thread::sleep_for(std::chrono::duration<double>(op.at("seconds").get<double>()));
      } else if (name == "stat") {
        const auto s = storage::stat(op.at("uri"));
        r["size"] = s ? nlohmann::json(s->size) : nlohmann::json();
        if (s) r["etag"] = s->etag;
      }
    } catch (const tessera::Error& e) {
      r["error"] = e.what();
    }
    results.push_back(r);
  }
  nlohmann::json out = {{"results", results}, {"credential_loads", storage::credential_loads()}};
  try {
    if (storage::credential_loads() > 0) out["requests"] = storage::S3Client::shared().requests_sent();
  } catch (const tessera::Error&) {
    // no client was made (no credentials): nothing was sent
  }
  std::ofstream(out_path) << out.dump();
  return 0;
}

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "forward" && argc >= 5)
      return forward(argv[2], argv[3], argv[4], argc > 5 && std::string(argv[5]) == "--reference",
                     argc > 5 && std::string(argv[5]) == "--train");
    if (cmd == "export" && argc >= 4) {
      auto model = tessera::checkpoint::load_hf_model(argv[2]);
      const std::vector<std::string> opts(argv + 4, argv + argc);
      auto has = [&](const char* o) { return std::find(opts.begin(), opts.end(), o) != opts.end(); };
      tessera::checkpoint::save_hf_model(
          *model, argv[3], has("bf16") ? at::kBFloat16 : at::kFloat, uint64_t{5} << 30,
          has("family") ? tessera::checkpoint::HfLayout::kFamily : tessera::checkpoint::HfLayout::kTransformers,
          std::nullopt, has("transformers4") ? 4 : 5);
      return 0;
    }
    if (cmd == "generate" && argc >= 6) {
      return generate(argv[2], argv[3], argv[4], std::stoll(argv[5]),
                      argc > 6 ? std::optional<int64_t>(std::stoll(argv[6])) : std::nullopt);
    }
    if (cmd == "mds-write" && argc >= 4) return mds_write(argv[2], argv[3]);
    if (cmd == "mds-read" && argc >= 4) return mds_read(argv[2], argv[3]);
    if (cmd == "streaming" && argc >= 4) return streaming_cases(argv[2], argv[3]);
    if (cmd == "streaming-epoch" && argc >= 4) return streaming_epoch(argv[2], argv[3]);
    if (cmd == "train-trace" && argc >= 4) return train_trace(argv[2], argv[3], {argv + 4, argv + argc});
    if (cmd == "tokenize" && argc >= 5) return tokenize(argv[2], argv[3], argv[4]);
    if (cmd == "train-tokenizer" && argc >= 4) return train_tokenizer(argv[2], argv[3]);
    if (cmd == "finetuning-batches" && argc >= 4) return finetuning_batches(argv[2], argv[3]);
    if (cmd == "storage-batch" && argc >= 4) return storage_batch(argv[2], argv[3]);
    if (cmd == "chat-template" && argc >= 5) return chat_template(argv[2], argv[3], argv[4]);
    std::cerr << "usage: see the comment at the top of tests/compat/mpt_driver.cpp\n";
    return 2;
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
