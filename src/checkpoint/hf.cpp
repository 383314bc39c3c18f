// Hugging Face folder import and export, for every model family through the model protocol.
#include "tessera/checkpoint/hf.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint_detail.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/data/tokenizer.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr const char* kHfComponent = "hf";

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(kHfComponent, fmt::format("{}: cannot open", path.string()));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(kHfComponent, fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
}

}  // namespace

std::string hf_config_json(const models::CausalLM& model, at::ScalarType dtype) {
  return model.hf_config(dtype).dump(2) + "\n";
}

HfWeights::HfWeights(const models::CausalLM& model, const std::string& dir)
    : dir_(dir), tied_(model.tied_embedding_name()) {
  const fs::path config_path = fs::path(dir) / "config.json";
  const nlohmann::json config = read_json(config_path);
  model_type_ = config.is_object() ? config.value("model_type", "") : "";
  models::HfFormat format;
  const models::HfAdapter& adapter = models::hf_model_type_registry().adapter(model_type_);
  if (model_type_ == model.family()) {
    format = models::family_hf_format(model, at::kFloat);
  } else if (!adapter.text_model_type.empty() && adapter.text_model_type == model.family()) {
    // A multimodal folder: the text model's own layout under the folder's prefix.
    format = models::family_hf_format(model, at::kFloat);
    for (models::HfTensor& t : format.tensors) t.name = adapter.stored_name(t.name);
  } else {
    format = model.hf_format(at::kFloat);
    const std::string type = format.config.value("model_type", "");
    if (type != model_type_) {
      throw Error(kHfComponent, fmt::format("{}: model_type \"{}\" is not a layout of this {} model (it reads \"{}\" "
                                            "and \"{}\")",
                                            config_path.string(), model_type_, model.family(), model.family(), type));
    }
  }
  for (models::HfTensor& t : format.tensors) {
    if (t.param.empty()) {
      zeros_.push_back(std::move(t));
    } else {
      by_param_[t.param] = std::move(t);
    }
  }
  if (fs::exists(fs::path(dir) / "pytorch_model.bin") && !fs::exists(fs::path(dir) / "model.safetensors") &&
      !fs::exists(fs::path(dir) / "model.safetensors.index.json")) {
    throw Error(kHfComponent, fmt::format("{}: only safetensors weights are loaded (pytorch_model.bin is a pickle, "
                                          "which could run code); convert it with save_pretrained(safe_serialization="
                                          "True)",
                                          dir));
  }
  files_ = open_safetensors_dir(dir);
  if (!adapter.ignored_prefixes.empty()) {
    const auto ignored =
        std::count_if(files_.begin(), files_.end(), [&](const auto& entry) { return adapter.drops(entry.first); });
    if (ignored > 0) {
      spdlog::info("hf: {}: {} tensors besides the {} text model are left aside (under {})", dir, ignored,
                   adapter.text_model_type, fmt::join(adapter.ignored_prefixes, ", "));
    }
  }
}

std::string HfWeights::path_of(const std::string& name) const {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second->path();
  return files_.empty() ? dir_ : files_.begin()->second->path();
}

std::optional<HfWeights::Stored> HfWeights::locate(const std::string& name) const {
  auto m = by_param_.find(name);
  if (m == by_param_.end()) return std::nullopt;
  std::string source = m->second.name;
  const std::string& head = models::hf_model_type_registry().adapter(model_type_).tied_head;
  if (!files_.count(source) && tied_ && name == *tied_ && files_.count(head)) source = head;
  auto it = files_.find(source);
  if (it == files_.end()) return std::nullopt;
  return Stored{&m->second, it->second.get(), source};
}

std::optional<at::Tensor> HfWeights::param(const std::string& name) const {
  const std::optional<Stored> found = locate(name);
  if (!found) return std::nullopt;
  const models::HfTensor& t = *found->tensor;
  const std::string& source = found->name;
  const auto* file = found->file;
  const TensorInfo& info = file->info(source);
  if (info.shape != t.shape) {
    throw Error(kHfComponent, fmt::format("{}: tensor {} has shape [{}], the model expects [{}]", file->path(), source,
                                          fmt::join(info.shape, ", "), fmt::join(t.shape, ", ")));
  }
  at::Tensor v = file->view(source);
  if (t.transpose) v = v.t().contiguous();
  return v;
}

void HfWeights::release(const std::string& name) const {
  if (const std::optional<Stored> found = locate(name)) found->file->release(found->name);
}

std::vector<std::string> HfWeights::unexpected() const {
  std::set<std::string> taken;
  for (const auto& [param, t] : by_param_) taken.insert(t.name);
  for (const models::HfTensor& z : zeros_) {
    taken.insert(z.name);
    auto it = files_.find(z.name);
    if (it == files_.end()) continue;
    if (it->second->info(z.name).shape != z.shape || it->second->view(z.name).count_nonzero().item<int64_t>() != 0) {
      throw Error(kHfComponent, fmt::format("{}: tensor {} is not all zeros, but this model has no such parameter (it "
                                            "would compute another function)",
                                            it->second->path(), z.name));
    }
  }
  const models::HfAdapter& adapter = models::hf_model_type_registry().adapter(model_type_);
  std::vector<std::string> out;
  for (const auto& [name, file] : files_) {
    if (taken.count(name) || (tied_ && name == adapter.tied_head)) continue;
    if (!adapter.drops(name)) out.push_back(name);
  }
  return out;
}

LoadReport load_weights(models::CausalLM& model, const HfWeights& weights, bool strict) {
  at::NoGradGuard no_grad;
  LoadReport report;
  for (auto& item : model.named_parameters()) {
    const std::optional<at::Tensor> stored = weights.param(item.key());
    if (!stored) {
      if (strict) throw Error(kHfComponent, fmt::format("{}: missing tensor {}", weights.path_of(""), item.key()));
      report.missing.push_back(item.key());
      continue;
    }
    item.value().copy_(*stored);
    weights.release(item.key());
  }
  for (const std::string& name : weights.unexpected()) {
    if (strict) throw Error(kHfComponent, fmt::format("{}: unexpected tensor {}", weights.path_of(name), name));
    report.unexpected.push_back(name);
  }
  return report;
}

std::shared_ptr<models::CausalLM> load_hf_model(const std::string& dir) {
  const fs::path config = fs::path(dir) / "config.json";
  std::shared_ptr<models::CausalLM> model = models::build_from_hf_config(read_json(config), config.string(), "cpu");
  load_weights(*model, HfWeights(*model, dir), /*strict=*/true);
  return model;
}

namespace {

// The format an export writes; transformers' layouts with config.json in `transformers_version`'s form (4 or 5).
models::HfFormat format_in(const models::CausalLM& model, at::ScalarType dtype, HfLayout layout,
                           int transformers_version) {
  if (transformers_version != 4 && transformers_version != 5) {
    throw Error(kHfComponent,
                fmt::format("transformers_version {}: an export's config.json is written for transformers 4 or 5",
                            transformers_version));
  }
  if (layout == HfLayout::kFamily) return models::family_hf_format(model, dtype);
  models::HfFormat format = model.hf_format(dtype);
  format.config = models::hf_config_for(format.config, transformers_version);
  if (transformers_version == 5 && format.config.contains("rope_parameters")) {
    spdlog::info(
        "hf export: config.json in transformers 5's form (rotary settings in rope_parameters), which transformers 4 "
        "would read with its default rope base; write it with transformers_version 4 (convert --transformers-version "
        "4) for transformers 4");
  }
  return format;
}

std::vector<TensorLayout> layout_of(const models::HfFormat& format, at::ScalarType dtype) {
  std::vector<TensorLayout> out;
  for (const models::HfTensor& t : format.tensors) out.push_back({t.name, dtype, t.shape});
  return out;
}

// Stored tensor `t` from the parameter value `value` (undefined for zeros).
at::Tensor stored_form(const models::HfTensor& t, const at::Tensor& value) {
  if (t.param.empty()) return at::zeros(t.shape, at::kFloat);
  return t.transpose ? value.t() : value;
}

// The tokenizer files transformers' AutoTokenizer reads from a folder (those present are copied).
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "tokenizer.model", "chat_template.jinja"};

// generation_config.json and the tokenizer's files, written before config.json (which marks a complete folder).
void write_extras(const fs::path& dir, const nlohmann::ordered_json& config, const std::optional<fs::path>& tokenizer) {
  std::optional<data::Tokenizer> tok;
  if (tokenizer) {
    tok = data::Tokenizer::from_file(*tokenizer);  // checks it loads, and reads its special tokens
    if (config.contains("vocab_size") && config["vocab_size"].is_number_integer() &&
        tok->vocab_size() > config["vocab_size"].get<int64_t>()) {
      spdlog::warn("hf export: the tokenizer {} has {} tokens, more than the model's vocab_size {}",
                   tokenizer->string(), tok->vocab_size(), config["vocab_size"].get<int64_t>());
    }
    for (const char* name : kTokenizerFiles) fs::remove(dir / name);  // no stale file of an earlier tokenizer
    if (fs::is_directory(*tokenizer)) {
      for (const char* name : kTokenizerFiles) {
        if (fs::is_regular_file(*tokenizer / name))
          util::write_file_atomically((dir / name).string(),
                                      util::read_file((*tokenizer / name).string(), kHfComponent), kHfComponent);
      }
    } else {
      util::write_file_atomically((dir / "tokenizer.json").string(), util::read_file(tokenizer->string(), kHfComponent),
                                  kHfComponent);
      // A lone tokenizer.json loads in AutoTokenizer as the generic fast tokenizer, with decode as `tokenizers`'.
      const nlohmann::ordered_json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                         {"clean_up_tokenization_spaces", false}};
      util::write_file_atomically((dir / "tokenizer_config.json").string(), tc.dump(2) + "\n", kHfComponent);
    }
  }
  // The ids `generate` uses: config.json's, else the tokenizer's special tokens.
  nlohmann::ordered_json gen = nlohmann::ordered_json::object();
  const auto put = [&](const char* key, std::optional<int32_t> from_tokenizer) {
    if (config.contains(key) && !config[key].is_null()) {
      gen[key] = config[key];
    } else if (from_tokenizer) {
      gen[key] = *from_tokenizer;
    }
  };
  put("bos_token_id", tok ? tok->bos_token_id() : std::nullopt);
  put("eos_token_id", tok ? tok->eos_token_id() : std::nullopt);
  put("pad_token_id", tok ? tok->pad_token_id() : std::nullopt);
  util::write_file_atomically((dir / "generation_config.json").string(), gen.dump(2) + "\n", kHfComponent);
}

}  // namespace

void save_hf_model(models::CausalLM& model, const std::string& dir, at::ScalarType dtype, uint64_t max_shard_bytes,
                   HfLayout layout, const std::optional<std::filesystem::path>& tokenizer, int transformers_version) {
  // Refuses before anything is written.
  const models::HfFormat format = format_in(model, dtype, layout, transformers_version);
  fs::create_directories(dir);
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model.named_parameters()) params[item.key()] = item.value();
  save_sharded_safetensors_streamed(dir, layout_of(format, dtype),
                                    [&](size_t i) {
                                      const models::HfTensor& t = format.tensors[i];
                                      return stored_form(t,
                                                         t.param.empty() ? at::Tensor() : params.at(t.param).detach());
                                    },
                                    max_shard_bytes, {{"format", "pt"}});
  write_extras(dir, format.config, tokenizer);
  util::write_file_atomically((fs::path(dir) / "config.json").string(), format.config.dump(2) + "\n", kHfComponent);
}

namespace {

// The model a checkpoint's hf_config describes, built on the meta device (names and shapes only), checked against
// the checkpoint's model/ tensors: each weight must be there with its shape, and nothing else (LoRA adapters are
// refused).
struct CheckpointModel {
  nlohmann::json config;
  std::shared_ptr<models::CausalLM> meta;
};

CheckpointModel checkpoint_model(const CheckpointReader& reader, const std::string& checkpoint_dir) {
  if (!reader.metadata().contains("hf_config")) {
    throw Error(kHfComponent,
                fmt::format("{}: metadata.json has no hf_config (not a model checkpoint)", checkpoint_dir));
  }
  CheckpointModel out;
  out.config = reader.metadata().at("hf_config");
  out.meta = models::build_from_hf_config(out.config, (fs::path(checkpoint_dir) / "metadata.json").string(), "meta");
  std::set<std::string> names;
  for (const auto& item : out.meta->named_parameters()) {
    const std::string name = "model/" + item.key();
    if (!reader.has_tensor(name)) {
      throw Error(kHfComponent, fmt::format("{}: has no weight {}", checkpoint_dir, item.key()));
    }
    if (reader.shape(name) != item.value().sizes().vec()) {
      throw Error(kHfComponent,
                  fmt::format("{}: {} has shape [{}], the config gives [{}]", checkpoint_dir, item.key(),
                              fmt::join(reader.shape(name), ", "), fmt::join(item.value().sizes().vec(), ", ")));
    }
    names.insert(name);
  }
  for (const std::string& name : reader.tensor_names("model/")) {
    if (!names.count(name)) {
      throw Error(kHfComponent, fmt::format("{}: weight {} is not part of a plain {} model (LoRA adapters? merge them "
                                            "before saving)",
                                            checkpoint_dir, name.substr(6), out.meta->family()));
    }
  }
  return out;
}

}  // namespace

ModelSource resolve_model_source(const std::string& path, const std::string& tool) {
  ModelSource src;
  if (!fs::exists(path)) {
    src.path = util::resolve_hf_folder(path).string();
  } else if (fs::exists(fs::path(path) / "config.json")) {
    src.path = path;
  } else if (fs::exists(fs::path(path) / "metadata.json")) {
    src.path = path;
    src.hf = false;
  } else if (fs::is_directory(path) && !list_checkpoints(path).empty()) {
    const auto found = find_latest_valid_checkpoint(path, "latest");
    if (!found) throw Error(tool, fmt::format("{}: none of its checkpoints is valid", path));
    spdlog::info("using {}", *found);
    src.path = *found;
    src.hf = false;
  } else {
    throw ConfigError(tool, fmt::format("--model {}: not a Hugging Face folder (config.json), a Tessera checkpoint "
                                        "(metadata.json) or a folder of checkpoints",
                                        path));
  }
  if (src.hf) {
    src.config_file = (fs::path(src.path) / "config.json").string();
    src.config = read_json(src.config_file);
  } else {
    src.config_file = (fs::path(src.path) / "metadata.json").string();
    const nlohmann::json metadata = detail::read_metadata(src.path);
    if (!metadata.contains("hf_config")) {
      throw Error(kHfComponent, fmt::format("{}: metadata.json has no hf_config (not a model checkpoint)", src.path));
    }
    src.config = metadata.at("hf_config");
  }
  return src;
}

std::shared_ptr<models::CausalLM> load_any_model(const std::string& path, const std::string& tool) {
  const ModelSource src = resolve_model_source(path, tool);
  return src.hf ? load_hf_model(src.path) : load_checkpoint_model(src.path);
}

std::shared_ptr<models::CausalLM> load_checkpoint_model(const std::string& checkpoint_dir) {
  CheckpointReader reader(checkpoint_dir);
  const CheckpointModel cm = checkpoint_model(reader, checkpoint_dir);
  // Allocated, not initialised: every weight is read below.
  std::shared_ptr<models::CausalLM> model =
      models::build_from_hf_config(cm.config, (fs::path(checkpoint_dir) / "metadata.json").string(), "cpu");
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) reader.read("model/" + item.key(), 0, item.value());
  return model;
}

void export_checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& out_dir, at::ScalarType dtype,
                             HfLayout layout, uint64_t max_shard_bytes,
                             const std::optional<std::filesystem::path>& tokenizer, int transformers_version) {
  CheckpointReader reader(checkpoint_dir);
  const CheckpointModel cm = checkpoint_model(reader, checkpoint_dir);
  // The format refuses a model transformers cannot represent before anything is written.
  const models::HfFormat format = format_in(*cm.meta, dtype, layout, transformers_version);
  fs::create_directories(out_dir);
  save_sharded_safetensors_streamed(out_dir, layout_of(format, dtype),
                                    [&](size_t i) {
                                      const models::HfTensor& t = format.tensors[i];
                                      return stored_form(
                                          t, t.param.empty() ? at::Tensor() : reader.read_full("model/" + t.param));
                                    },
                                    max_shard_bytes, {{"format", "pt"}});
  write_extras(out_dir, format.config, tokenizer);
  util::write_file_atomically((fs::path(out_dir) / "config.json").string(), format.config.dump(2) + "\n", kHfComponent);
}

std::optional<std::string> checkpoint_tokenizer_name(const std::string& checkpoint_dir) {
  const CheckpointReader reader(checkpoint_dir);
  const nlohmann::json& meta = reader.metadata();
  const auto config = meta.find("config");
  if (config == meta.end() || !config->is_object()) return std::nullopt;
  const auto tok = config->find("tokenizer");
  if (tok == config->end() || !tok->is_object()) return std::nullopt;
  const auto name = tok->find("name");
  if (name == tok->end() || !name->is_string()) return std::nullopt;
  return name->get<std::string>();
}

}  // namespace tessera::checkpoint
