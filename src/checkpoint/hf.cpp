// Hugging Face folder import and export, for every model family through the model protocol.
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
#include "tessera/models/mpt.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr const char* kComponent = "hf";

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

models::MPTOptions read_hf_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  return models::mpt_options_from_hf_config(read_json(path), path.string());
}

std::string hf_config_json(const models::CausalLM& model, at::ScalarType dtype) {
  return model.hf_config(dtype).dump(2) + "\n";
}

LoadReport load_weights(models::CausalLM& model, const std::map<std::string, std::shared_ptr<SafetensorsFile>>& tensors,
                        bool strict) {
  at::NoGradGuard no_grad;
  LoadReport report;
  const std::optional<std::string> tied = model.tied_embedding_name();
  std::set<std::string> used;
  for (auto& item : model.named_parameters()) {
    std::string source = item.key();
    if (!tensors.count(source) && tied && source == *tied && tensors.count("lm_head.weight")) {
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

std::shared_ptr<models::CausalLM> load_hf_model(const std::string& dir) {
  const fs::path config = fs::path(dir) / "config.json";
  std::shared_ptr<models::CausalLM> model = models::build_from_hf_config(read_json(config), config.string(), "cpu");
  if (fs::exists(fs::path(dir) / "pytorch_model.bin") && !fs::exists(fs::path(dir) / "model.safetensors") &&
      !fs::exists(fs::path(dir) / "model.safetensors.index.json")) {
    throw Error(kComponent, fmt::format("{}: only safetensors weights are loaded (pytorch_model.bin is a pickle, "
                                        "which could run code); convert it with save_pretrained(safe_serialization="
                                        "True)",
                                        dir));
  }
  load_weights(*model, open_safetensors_dir(dir), /*strict=*/true);
  return model;
}

void save_hf_model(models::CausalLM& model, const std::string& dir, at::ScalarType dtype, uint64_t max_shard_bytes) {
  const std::string config = hf_config_json(model, dtype);  // refuses a model without an HF format before writing
  fs::create_directories(dir);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model.named_parameters()) tensors[item.key()] = item.value().detach().to(dtype);
  save_sharded_safetensors(dir, tensors, max_shard_bytes, {{"format", "pt"}});
  util::write_file_atomically((fs::path(dir) / "config.json").string(), config, kComponent);
}

namespace {

// The model a checkpoint's hf_config describes, and its weights' names and shapes (sorted), checked against the
// checkpoint's model/ tensors: each must be there with its shape, and nothing else (LoRA adapters are refused).
struct CheckpointModel {
  nlohmann::json config;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
};

CheckpointModel checkpoint_model(const CheckpointReader& reader, const std::string& checkpoint_dir) {
  if (!reader.metadata().contains("hf_config")) {
    throw Error(kComponent, fmt::format("{}: metadata.json has no hf_config (not a model checkpoint)", checkpoint_dir));
  }
  CheckpointModel out;
  out.config = reader.metadata().at("hf_config");
  // On the meta device: names and shapes only.
  const std::shared_ptr<models::CausalLM> model =
      models::build_from_hf_config(out.config, (fs::path(checkpoint_dir) / "metadata.json").string(), "meta");
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
      throw Error(kComponent, fmt::format("{}: weight {} is not part of a plain {} model (LoRA adapters? merge them "
                                          "before saving)",
                                          checkpoint_dir, key, model->family()));
    }
  }
  std::sort(out.tensors.begin(), out.tensors.end());
  return out;
}

}  // namespace

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
