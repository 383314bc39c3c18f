// Hugging Face MPT folder import and export.
#include "tessera/checkpoint/hf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr const char* kComponent = "hf";

const std::set<std::string> kModelKeys = {"d_model",
                                          "n_heads",
                                          "n_layers",
                                          "expansion_ratio",
                                          "max_seq_len",
                                          "vocab_size",
                                          "resid_pdrop",
                                          "emb_pdrop",
                                          "learned_pos_emb",
                                          "attn_config",
                                          "ffn_config",
                                          "logit_scale",
                                          "no_bias",
                                          "attention_bias",
                                          "embedding_fraction",
                                          "norm_type",
                                          "norm_eps",
                                          "init_config",
                                          "tie_word_embeddings",
                                          "fc_type",
                                          "use_pad_tok_in_ffn",
                                          "final_logit_softcapping",
                                          "block_overrides",
                                          "head_dim"};
const std::set<std::string> kAttnKeys = {"attn_type",
                                         "attn_pdrop",
                                         "attn_impl",
                                         "qk_ln",
                                         "qk_gn",
                                         "clip_qkv",
                                         "softmax_scale",
                                         "attn_uses_sequence_id",
                                         "sliding_window_size",
                                         "alibi",
                                         "alibi_bias_max",
                                         "rope",
                                         "rope_theta",
                                         "rope_impl",
                                         "rope_dail_config",
                                         "rope_hf_config",
                                         "kv_n_heads",
                                         "fused_qkv",
                                         "nope",
                                         "attn_logit_softcapping"};
const std::set<std::string> kInitKeys = {
    "name",     "fan_mode", "init_nonlinearity", "init_div_is_residual", "emb_init_std", "emb_init_uniform_lim",
    "init_std", "init_gain"};

nlohmann::json filtered(const nlohmann::json& in, const std::set<std::string>& keep) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : in.items()) {
    if (keep.count(k)) out[k] = v;
  }
  return out;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(kComponent, fmt::format("{}: cannot open", path.string()));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(kComponent, fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
}

}  // namespace

namespace {

// A config.json's contents as MPTOptions; `path` names it in messages.
models::MPTOptions parse_hf_config(const nlohmann::json& raw, const fs::path& path) {
  if (raw.value("model_type", "") != "mpt") {
    throw Error(kComponent,
                fmt::format("{}: model_type is \"{}\", expected \"mpt\"", path.string(), raw.value("model_type", "")));
  }
  nlohmann::json cfg = filtered(raw, kModelKeys);
  if (!cfg.contains("norm_eps") && raw.contains("layer_norm_epsilon")) cfg["norm_eps"] = raw["layer_norm_epsilon"];
  if (raw.contains("attn_config")) cfg["attn_config"] = filtered(raw["attn_config"], kAttnKeys);
  if (raw.contains("init_config") && raw["init_config"].is_object()) {
    cfg["init_config"] = filtered(raw["init_config"], kInitKeys);
  }
  if (cfg.contains("attn_config")) cfg["attn_config"]["attn_impl"] = "torch";  // both run as SDPA here
  // Parse through the recipe schema, so that config.json and recipes are validated by the same code.
  config::Origin origin;
  origin.file = path.string();
  config::Value v = config::parse_yaml(cfg.dump(), origin);
  config::ParseContext ctx(path.string());
  config::Section s(&v, "", ctx);
  models::MPTOptions o;
  try {
    o = models::parse_mpt_options(s);
    ctx.throw_if_unsupported();
  } catch (const ConfigError& e) {
    throw Error(kComponent, e.message());
  }
  o.init_device = "cpu";
  return o;
}

}  // namespace

models::MPTOptions read_hf_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  return parse_hf_config(read_json(path), path);
}

std::string hf_config_json(const models::MPTOptions& o, at::ScalarType dtype) {
  const char* norm = "layernorm";
  if (o.norm_type == models::NormType::kLowPrecisionLayerNorm) norm = "low_precision_layernorm";
  if (o.norm_type == models::NormType::kRMSNorm) norm = "rmsnorm";
  if (o.norm_type == models::NormType::kLowPrecisionRMSNorm) norm = "low_precision_rmsnorm";
  nlohmann::ordered_json attn = {
      {"attn_type", o.attn.attn_type},
      {"attn_pdrop", o.attn.attn_pdrop},
      {"attn_impl", "torch"},
      {"qk_ln", o.attn.qk_ln},
      {"qk_gn", o.attn.qk_gn},
      {"clip_qkv", o.attn.clip_qkv ? nlohmann::ordered_json(*o.attn.clip_qkv) : nlohmann::ordered_json()},
      {"softmax_scale",
       o.attn.softmax_scale ? nlohmann::ordered_json(*o.attn.softmax_scale) : nlohmann::ordered_json()},
      {"attn_uses_sequence_id", o.attn.attn_uses_sequence_id},
      {"sliding_window_size", o.attn.sliding_window_size},
      {"alibi", o.attn.alibi},
      {"alibi_bias_max", o.attn.alibi_bias_max},
      {"rope", o.attn.rope},
      {"rope_theta", o.attn.rope_theta},
      {"rope_impl", "dail"}};
  if (o.attn.attn_type == "grouped_query_attention") attn["kv_n_heads"] = o.attn.kv_n_heads;
  nlohmann::ordered_json ffn = {{"ffn_type", o.ffn.type == models::FfnType::kGLU ? "mptglu" : "mptmlp"}};
  if (o.ffn.ffn_hidden_size) ffn["ffn_hidden_size"] = *o.ffn.ffn_hidden_size;
  nlohmann::ordered_json init = {{"name", o.init.name},
                                 {"fan_mode", o.init.fan_mode},
                                 {"init_nonlinearity", o.init.init_nonlinearity},
                                 {"init_div_is_residual", o.init.init_div_is_residual},
                                 {"init_gain", o.init.init_gain}};
  if (o.init.emb_init_std) init["emb_init_std"] = *o.init.emb_init_std;
  if (o.init.emb_init_uniform_lim) init["emb_init_uniform_lim"] = *o.init.emb_init_uniform_lim;
  if (o.init.init_std) init["init_std"] = *o.init.init_std;
  nlohmann::ordered_json j = {
      {"architectures", {"MPTForCausalLM"}},
      {"model_type", "mpt"},
      {"d_model", o.d_model},
      {"n_heads", o.n_heads},
      {"n_layers", o.n_layers},
      {"expansion_ratio", o.expansion_ratio},
      {"max_seq_len", o.max_seq_len},
      {"vocab_size", o.vocab_size},
      {"resid_pdrop", o.resid_pdrop},
      {"emb_pdrop", o.emb_pdrop},
      {"learned_pos_emb", o.learned_pos_emb},
      {"attn_config", attn},
      {"ffn_config", ffn},
      {"init_device", "cpu"},
      {"logit_scale", o.logit_scale ? nlohmann::ordered_json(*o.logit_scale) : nlohmann::ordered_json()},
      {"no_bias", o.no_bias},
      {"embedding_fraction", o.embedding_fraction},
      {"norm_type", norm},
      {"norm_eps", o.norm_eps},
      {"layer_norm_epsilon", o.norm_eps},
      {"use_cache", false},
      {"init_config", init},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"torch_dtype", dtype == at::kBFloat16 ? "bfloat16" : (dtype == at::kHalf ? "float16" : "float32")}};
  if (o.attention_bias) j["attention_bias"] = *o.attention_bias;
  return j.dump(2) + "\n";
}

LoadReport load_weights(models::MPTForCausalLM& model,
                        const std::map<std::string, std::shared_ptr<SafetensorsFile>>& tensors, bool strict) {
  at::NoGradGuard no_grad;
  LoadReport report;
  const bool tied = model->options().tie_word_embeddings;
  std::set<std::string> used;
  for (auto& item : model->named_parameters()) {
    std::string source = item.key();
    if (!tensors.count(source) && tied && source == "transformer.wte.weight" && tensors.count("lm_head.weight")) {
      source = "lm_head.weight";
    }
    auto it = tensors.find(source);
    if (it == tensors.end()) {
      if (strict) {
        throw Error(kComponent,
                    fmt::format("{}: missing tensor {}",
                                tensors.empty() ? "(no files)" : tensors.begin()->second->path(), item.key()));
      }
      report.missing.push_back(item.key());
      continue;
    }
    const TensorInfo& info = it->second->info(source);
    if (info.shape != item.value().sizes().vec()) {
      throw Error(kComponent,
                  fmt::format("{}: tensor {} has shape [{}], the model expects [{}]", it->second->path(), source,
                              fmt::join(info.shape, ", "), fmt::join(item.value().sizes().vec(), ", ")));
    }
    item.value().copy_(it->second->view(source));
    used.insert(source);
  }
  for (const auto& [name, file] : tensors) {
    if (used.count(name)) continue;
    if (tied && name == "lm_head.weight") continue;  // the other half of a tied pair
    if (strict) throw Error(kComponent, fmt::format("{}: unexpected tensor {}", file->path(), name));
    report.unexpected.push_back(name);
  }
  return report;
}

models::MPTForCausalLM load_hf_model(const std::string& dir) {
  const models::MPTOptions o = read_hf_config(dir);
  if (fs::exists(fs::path(dir) / "pytorch_model.bin") && !fs::exists(fs::path(dir) / "model.safetensors") &&
      !fs::exists(fs::path(dir) / "model.safetensors.index.json")) {
    throw Error(kComponent, fmt::format("{}: only safetensors weights are loaded (pytorch_model.bin is a pickle, "
                                        "which could run code); convert it with save_pretrained(safe_serialization="
                                        "True)",
                                        dir));
  }
  models::MPTForCausalLM model(o);
  load_weights(model, open_safetensors_dir(dir), /*strict=*/true);
  return model;
}

void save_hf_model(models::MPTForCausalLM& model, const std::string& dir, at::ScalarType dtype,
                   uint64_t max_shard_bytes) {
  fs::create_directories(dir);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model->named_parameters()) tensors[item.key()] = item.value().detach().to(dtype);
  save_sharded_safetensors(dir, tensors, max_shard_bytes, {{"format", "pt"}});
  util::write_file_atomically((fs::path(dir) / "config.json").string(), hf_config_json(model->options(), dtype),
                              kComponent);
}

namespace {

// The model a checkpoint's hf_config describes, and its weights' names and shapes (sorted), checked against the
// checkpoint's model/ tensors: each must be there with its shape, and nothing else (LoRA adapters are refused).
struct CheckpointModel {
  nlohmann::json config;
  models::MPTOptions options;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
};

CheckpointModel checkpoint_model(const CheckpointReader& reader, const std::string& checkpoint_dir) {
  if (!reader.metadata().contains("hf_config")) {
    throw Error(kComponent, fmt::format("{}: metadata.json has no hf_config (not a model checkpoint)", checkpoint_dir));
  }
  CheckpointModel out;
  out.config = reader.metadata().at("hf_config");
  out.options = parse_hf_config(out.config, fs::path(checkpoint_dir) / "metadata.json");
  // On the meta device: names and shapes only.
  models::MPTOptions meta = out.options;
  meta.init_device = "meta";
  models::MPTForCausalLM model(meta);
  for (const auto& item : model->named_parameters()) {
    const std::string name = "model/" + item.key();
    if (!reader.has_tensor(name)) {
      throw Error(kComponent, fmt::format("{}: has no weight {}", checkpoint_dir, item.key()));
    }
    if (reader.shape(name) != item.value().sizes().vec()) {
      throw Error(kComponent,
                  fmt::format("{}: {} has shape [{}], the config gives [{}]", checkpoint_dir, item.key(),
                              fmt::join(reader.shape(name), ", "), fmt::join(item.value().sizes().vec(), ", ")));
    }
    out.tensors.emplace_back(item.key(), item.value().sizes().vec());
  }
  for (const std::string& name : reader.tensor_names("model/")) {
    const std::string key = name.substr(6);
    if (std::none_of(out.tensors.begin(), out.tensors.end(), [&](const auto& t) { return t.first == key; })) {
      throw Error(kComponent, fmt::format("{}: weight {} is not part of a plain MPT model (LoRA adapters? merge them "
                                          "before saving)",
                                          checkpoint_dir, key));
    }
  }
  std::sort(out.tensors.begin(), out.tensors.end());
  return out;
}

}  // namespace

models::MPTForCausalLM load_checkpoint_model(const std::string& checkpoint_dir) {
  CheckpointReader reader(checkpoint_dir);
  const CheckpointModel cm = checkpoint_model(reader, checkpoint_dir);
  models::MPTForCausalLM model(cm.options);  // allocated, not initialised: every weight is read below
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) reader.read("model/" + item.key(), 0, item.value());
  return model;
}

void export_checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& out_dir, at::ScalarType dtype) {
  CheckpointReader reader(checkpoint_dir);
  CheckpointModel cm = checkpoint_model(reader, checkpoint_dir);
  const fs::path out(out_dir);
  nlohmann::json& config = cm.config;
  const auto& tensors = cm.tensors;
  // safetensors header, then each tensor's bytes in the same order, streamed.
  std::vector<TensorLayout> layout;
  for (const auto& [name, shape] : tensors) layout.push_back({name, dtype, shape});
  const std::string header = safetensors_header(layout, {{"format", "pt"}});
  fs::create_directories(out);
  const fs::path final_path = out / "model.safetensors";
  const std::string tmp = final_path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(kComponent, fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  auto write_all = [&](const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t w = ::write(fd, p, size);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(kComponent, fmt::format("{}: write failed: {}", final_path.string(), why));
      }
      p += w;
      size -= static_cast<size_t>(w);
    }
  };
  write_all(header.data(), header.size());
  for (const auto& [name, shape] : tensors) {
    const at::Tensor t = reader.read_full("model/" + name).to(dtype).contiguous();
    write_all(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(kComponent, fmt::format("{}: fsync/close failed: {}", final_path.string(), std::strerror(errno)));
  }
  fs::rename(tmp, final_path);
  fs::remove(out / "model.safetensors.index.json");
  config["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : (dtype == at::kHalf ? "float16" : "float32");
  util::write_file_atomically((out / "config.json").string(), config.dump(2) + "\n", kComponent);
}

}  // namespace tessera::checkpoint
