// Checkpoints of a training run (see checkpointing.h): what each rank saves, the saver callback with its background
// writer, and restoring a State from a checkpoint or a Hugging Face folder.
#include "tessera/callbacks/checkpoint_saver.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string_view>
#include <variant>

#include "tessera/checkpoint/hf.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/storage/storage.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/safe_path.h"

namespace tessera::callbacks {

using core::Algorithm;
using core::Callback;
using core::ComponentState;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr const char* kComponent = "checkpoint";

using Held = core::HeldTensor;

// Whether this rank's copy of `h` is the one checkpoints store: shards per ParallelModel::stores_shards, frozen
// parameters (whole on every rank) from rank 0.
bool stores_held(const core::State& s, const Held& h) {
  return h.replicated ? s.rank == 0 : s.parallel->stores_shards();
}

// A flat view of elements [offset, offset + numel) of a held tensor (or a tensor shaped like one).
at::Tensor span_of(const at::Tensor& t, const dist::ShardSpan& sp) {
  return t.detach().view({-1}).narrow(0, sp.offset, sp.numel);
}

// Components with state, keyed by name (a repeated name gets "#2", "#3", ...).
std::vector<std::pair<std::string, std::variant<Algorithm*, Callback*>>> stateful_components(const core::State& s) {
  std::vector<std::pair<std::string, std::variant<Algorithm*, Callback*>>> out;
  std::map<std::string, int> seen;
  auto key = [&](const std::string& name) {
    const int n = ++seen[name];
    return n == 1 ? name : fmt::format("{}#{}", name, n);
  };
  for (const auto& a : s.algorithms) out.emplace_back(key(a->name()), a.get());
  for (const auto& c : s.callbacks) out.emplace_back(key(c->name()), c.get());
  return out;
}

std::optional<core::ComponentState> state_of(const std::variant<Algorithm*, Callback*>& c, const core::State& s) {
  return std::visit([&](auto* p) { return p->state_dict(s); }, c);
}

// Optimizer parameter j -> index of the held tensor it is.
std::vector<size_t> optimizer_to_held(const core::State& s, const std::vector<Held>& held) {
  std::vector<size_t> out;
  for (const at::Tensor& p : s.optimizer->params()) {
    size_t found = held.size();
    for (size_t i = 0; i < held.size(); ++i) {
      if (held[i].tensor.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) found = i;
    }
    if (found == held.size()) throw Error(kComponent, "an optimizer parameter is not one of the model's tensors");
    out.push_back(found);
  }
  return out;
}

// The pieces of `values` (shaped like held tensor `h`) under `prefix`, copied to host memory.
// `copy`: a snapshot in host memory that training may go on from (async saves); otherwise a view where the values
// already are in host memory (a synchronous save writes before training continues).
void add_pieces(checkpoint::RankPayload& payload, const std::string& prefix, const Held& h, const at::Tensor& values,
                bool copy) {
  for (const dist::ShardSpan& sp : h.spans) {
    checkpoint::Piece piece{prefix + sp.name, sp.shape, sp.start, sp.numel, sp.col_start, sp.cols};
    payload.pieces.emplace_back(std::move(piece), span_of(values, sp).to(at::kCPU, /*non_blocking=*/false, copy));
  }
}

// Fills `dst` (shaped like held tensor `h`) from the checkpoint's tensors `prefix + name`.
void read_pieces(checkpoint::CheckpointReader& r, const std::string& prefix, const Held& h, at::Tensor dst) {
  at::NoGradGuard no_grad;
  for (const dist::ShardSpan& sp : h.spans) {
    const std::string name = prefix + sp.name;
    if (!r.has_tensor(name)) throw Error(kComponent, fmt::format("{}: has no tensor {}", r.dir(), name));
    if (r.shape(name) != sp.shape) {
      throw Error(kComponent, fmt::format("{}: {} has shape [{}], this model's is [{}]", r.dir(), name,
                                          fmt::join(r.shape(name), ", "), fmt::join(sp.shape, ", ")));
    }
    at::Tensor target = span_of(dst, sp);
    at::Tensor host = target.device().is_cpu() ? target : at::empty({sp.numel}, target.options().device(at::kCPU));
    if (sp.cols > 0) {
      r.read_window(name, sp.col_start, sp.cols, sp.start, host);
    } else {
      r.read(name, sp.start, host);
    }
    if (!target.device().is_cpu()) target.copy_(host);
  }
}

// The counts a save_filename may name, and where each comes from: fill_name writes them, filename_regex matches them.
struct NameCount {
  const char* key;
  int64_t (*value)(const core::State&);
};
constexpr NameCount kNameCounts[] = {
    {"{epoch}", [](const core::State& s) { return s.timestamp.epoch; }},
    {"{batch}", [](const core::State& s) { return s.timestamp.batch; }},
    {"{batch_in_epoch}", [](const core::State& s) { return s.timestamp.batch_in_epoch; }},
    {"{sample}", [](const core::State& s) { return s.timestamp.sample; }},
    {"{sample_in_epoch}", [](const core::State& s) { return s.timestamp.sample_in_epoch; }},
    {"{token}", [](const core::State& s) { return s.timestamp.token; }},
    {"{token_in_epoch}", [](const core::State& s) { return s.timestamp.token_in_epoch; }},
    {"{world_size}", [](const core::State& s) { return static_cast<int64_t>(s.world_size); }}};
constexpr std::string_view kRunName = "{run_name}";

std::string fill_name(std::string pattern, const core::State& s) {
  const auto fill = [&](std::string_view k, const std::string& v) {
    for (size_t pos = pattern.find(k); pos != std::string::npos; pos = pattern.find(k, pos + v.size())) {
      pattern.replace(pos, k.size(), v);
    }
  };
  fill(kRunName, s.run_name);
  for (const NameCount& c : kNameCounts) fill(c.key, std::to_string(c.value(s)));
  return pattern;
}

// The names fill_name gives `pattern` in run `run_name`: each count as any number, {run_name} as this run's name.
// Only folders so named are this saver's to rotate or clean up.
std::regex filename_regex(const std::string& pattern, const std::string& run_name) {
  std::string re;
  const auto literal = [&](std::string_view text) {
    for (const char c : text) {
      if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) re += '\\';
      re += c;
    }
  };
  for (size_t i = 0; i < pattern.size();) {
    if (std::string_view(pattern).substr(i).rfind(kRunName, 0) == 0) {
      literal(run_name);
      i += kRunName.size();
      continue;
    }
    const auto count = std::find_if(std::begin(kNameCounts), std::end(kNameCounts), [&](const NameCount& c) {
      return std::string_view(pattern).substr(i).rfind(c.key, 0) == 0;
    });
    if (count != std::end(kNameCounts)) {
      re += "[0-9]+";
      i += std::string_view(count->key).size();
    } else {
      literal(std::string_view(pattern).substr(i, 1));
      ++i;
    }
  }
  return std::regex(re);
}

bool named_by(const std::regex& names, const std::string& dir) {
  return std::regex_match(fs::path(dir).filename().string(), names);
}

// Whether `dir` (a .tmp-NAME directory) holds only what a save writes there: rank files, receipts, metadata.json and
// their temporary files (FILE.tmp.<pid>.<n>).
bool holds_only_save_files(const fs::path& dir) {
  static const std::regex file(R"((rank[0-9]+\.(safetensors|receipt\.json)|metadata\.json)(\.tmp\.[0-9]+\.[0-9]+)?)");
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_symlink() || !e.is_regular_file() || !std::regex_match(e.path().filename().string(), file)) return false;
  }
  return !ec;
}

// Whether `e` (.tmp-REST or .old-REST in the save folder) is what an interrupted or finished save of this saver left:
// the temporary `latest` link; a temporary directory of a checkpoint named by `names` holding only a save's files; a
// checkpoint moved aside whose re-save completed (REST is a checkpoint again).
bool left_by_a_save(const fs::directory_entry& e, const std::string& rest, bool tmp, const std::regex& names,
                    const SaveOptions& o) {
  if (e.is_symlink()) return tmp && rest == o.latest_filename;
  if (!e.is_directory() || !std::regex_match(rest, names)) return false;
  if (tmp) return holds_only_save_files(e.path());
  return checkpoint::is_checkpoint(e.path().string()) &&
         checkpoint::is_checkpoint((fs::path(o.folder) / rest).string());
}

std::string now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Rank 0's choice among `candidates` (an index, -1 for none), made by `choose` on rank 0 and broadcast.
int64_t agree_on_index(core::State& s, const std::function<int64_t()>& choose) {
  const int64_t index = s.rank == 0 ? choose() : 0;
  at::Tensor t = at::full({1}, static_cast<double>(index), at::TensorOptions().dtype(at::kDouble).device(s.device));
  s.comm->broadcast(t, 0).wait();
  return static_cast<int64_t>(t.cpu().item<double>());
}

LoadedCheckpoint load_hf_weights(core::State& s, const std::string& dir, bool strict) {
  // The folder in the family's own layout or the model's transformers one (GPT-2 for a learned-position MPT), read
  // through memory maps: each rank copies only its spans, one tensor at a time.
  const checkpoint::HfWeights weights(*s.model, dir);
  at::NoGradGuard no_grad;
  for (const Held& h : s.held_layout()) {
    for (const dist::ShardSpan& sp : h.spans) {
      const std::optional<at::Tensor> stored = weights.param(sp.name);
      // A LoRA adapter attached at INIT is not part of the base model's folder: it keeps its initialisation (B = 0,
      // so training starts from the base model's function).
      const auto ends_with = [&](const char* suffix) {
        const std::string_view n(sp.name), x(suffix);
        return n.size() > x.size() && n.substr(n.size() - x.size()) == x;
      };
      if (!stored && (ends_with(".lora_A") || ends_with(".lora_B"))) continue;
      if (!stored) {
        if (strict) throw Error(kComponent, fmt::format("{}: has no weight {}", dir, sp.name));
        spdlog::warn("[checkpoint] {}: no weight {}; it keeps its initial value", dir, sp.name);
        continue;
      }
      // A tensor-parallel column window: its columns of the stored matrix, then its range of them.
      const at::Tensor source =
          sp.cols > 0 ? stored->narrow(1, sp.col_start, sp.cols).reshape({-1}) : stored->reshape({-1});
      span_of(h.tensor, sp).copy_(source.narrow(0, sp.start, sp.numel));
      weights.release(sp.name);
    }
  }
  // Every rank sees only its spans; rank 0 judges unexpected weights against the whole model.
  if (s.rank == 0) {
    for (const std::string& name : weights.unexpected()) {
      if (strict) throw Error(kComponent, fmt::format("{}: unexpected weight {}", weights.path_of(name), name));
      spdlog::warn("[checkpoint] {}: ignoring weight {} (not in this model)", weights.path_of(name), name);
    }
  }
  return {dir, nlohmann::json(), false};
}

}  // namespace

nlohmann::json timestamp_to_json(const config::Timestamp& t) {
  return {{"epoch", t.epoch},
          {"batch", t.batch},
          {"sample", t.sample},
          {"token", t.token},
          {"batch_in_epoch", t.batch_in_epoch},
          {"sample_in_epoch", t.sample_in_epoch},
          {"token_in_epoch", t.token_in_epoch},
          {"total_wct", t.total_wct},
          {"epoch_wct", t.epoch_wct},
          {"batch_wct", t.batch_wct}};
}

config::Timestamp timestamp_from_json(const nlohmann::json& j) {
  config::Timestamp t;
  t.epoch = j.at("epoch").get<int64_t>();
  t.batch = j.at("batch").get<int64_t>();
  t.sample = j.at("sample").get<int64_t>();
  t.token = j.at("token").get<int64_t>();
  t.batch_in_epoch = j.at("batch_in_epoch").get<int64_t>();
  t.sample_in_epoch = j.at("sample_in_epoch").get<int64_t>();
  t.token_in_epoch = j.at("token_in_epoch").get<int64_t>();
  t.total_wct = j.value("total_wct", 0.0);
  t.epoch_wct = j.value("epoch_wct", 0.0);
  t.batch_wct = j.value("batch_wct", 0.0);
  return t;
}

// ---- CheckpointSaver ----------------------------------------------------------------------------------------------

CheckpointSaver::CheckpointSaver(SaveOptions options, ExtraState extra)
    : o_(std::move(options)), extra_(std::move(extra)) {
  if (o_.filename.find("{rank}") != std::string::npos) {
    throw ConfigError("recipe", fmt::format("save_filename \"{}\": names the checkpoint directory all ranks share; "
                                            "{{rank}} is not allowed",
                                            o_.filename));
  }
}

CheckpointSaver::~CheckpointSaver() {
  if (writer_.joinable()) writer_.join();
}

void CheckpointSaver::wait() {
  if (writer_.joinable()) writer_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

bool CheckpointSaver::due(core::Event event, const core::State& s) const {
  if (last_saved_batch_ == s.timestamp.batch) return false;
  if (s.preempted()) return event == core::Event::kBatchCheckpoint;  // the checkpoint a preempted job resumes from
  const bool end = s.reached_max_duration();
  const config::Time& iv = o_.interval;
  if (event == core::Event::kEpochCheckpoint) {
    if (iv.unit() == config::TimeUnit::kEpoch) return end || s.timestamp.epoch % std::max<int64_t>(1, iv.count()) == 0;
    return end;
  }
  if (event != core::Event::kBatchCheckpoint) return false;
  if (iv.unit() == config::TimeUnit::kEpoch) return false;  // at EPOCH_CHECKPOINT (also the end of training)
  if (end) return true;
  config::TimeUnit unit = iv.unit();
  double every = iv.value();
  if (unit == config::TimeUnit::kDuration) {
    unit = s.max_duration.unit() == config::TimeUnit::kEpoch ? config::TimeUnit::kBatch : s.max_duration.unit();
    double total = s.max_duration.value();
    if (s.max_duration.unit() == config::TimeUnit::kEpoch) total *= static_cast<double>(s.dataloader_len.value_or(1));
    every = std::max(1.0, std::trunc(iv.value() * total));
  }
  const double prev = static_cast<double>(s.previous_timestamp.get(unit));
  const double now = static_cast<double>(s.timestamp.get(unit));
  return std::floor(prev / every) != std::floor(now / every);
}

void CheckpointSaver::run_event(core::Event event, core::State& s, core::Logger& logger) {
  if (event == core::Event::kFitStart) {
    if (s.rank == 0) {
      const std::regex names = filename_regex(o_.filename, s.run_name);
      std::vector<std::string> others;
      // A re-save that a crash interrupted between its two renames: the checkpoint it had moved aside goes back
      // before anything else (autoresume did so already, if it ran).
      checkpoint::restore_moved_aside(o_.folder);
      std::error_code ec;
      if (fs::is_directory(o_.folder, ec)) {  // what saves that a crash interrupted left (local folders)
        for (const fs::directory_entry& e : fs::directory_iterator(o_.folder, ec)) {
          const std::string n = e.path().filename().string();
          const bool tmp = n.rfind(".tmp-", 0) == 0;
          if (!tmp && n.rfind(".old-", 0) != 0) continue;
          if (left_by_a_save(e, n.substr(5), tmp, names, o_)) {
            fs::remove_all(e.path(), ec);
          } else {
            others.push_back(e.path().string());
          }
        }
      }
      // Remote folders: the objects of saves that a crash interrupted (no metadata.json).
      for (const std::string& dir : checkpoint::incomplete_checkpoints(o_.folder)) {
        if (!named_by(names, dir)) {
          others.push_back(dir);
          continue;
        }
        spdlog::info("[checkpoint] removing {}: an interrupted save (no metadata.json)", dir);
        checkpoint::remove_checkpoint(dir);
      }
      mention_left_alone(others);
      if (!o_.overwrite) {
        for (const std::string& dir : checkpoint::list_checkpoints(o_.folder)) {
          const int64_t batch =
              checkpoint::CheckpointReader(dir, false).metadata().at("timestamp").at("batch").get<int64_t>();
          if (batch > s.timestamp.batch) {
            throw ConfigError("recipe", fmt::format("save_folder {} already holds {} (batch {}), later than this run's "
                                                    "start (batch {}); set save_overwrite: true, autoresume: true, "
                                                    "or another save_folder",
                                                    o_.folder, dir, batch, s.timestamp.batch));
          }
        }
      }
    }
    return;
  }
  if (event == core::Event::kFitEnd) {
    wait();
    return;
  }
  if (due(event, s)) save(s, logger);
}

void CheckpointSaver::mention_left_alone(const std::vector<std::string>& others) {
  std::vector<std::string> fresh;
  for (const std::string& o : others) {
    if (mentioned_.insert(o).second) fresh.push_back(o);
  }
  if (fresh.empty()) return;
  spdlog::info(
      "[checkpoint] leaving {} alone: not checkpoints this run names by save_filename \"{}\" (only those "
      "are rotated or cleaned up)",
      fmt::join(fresh, ", "), o_.filename);
}

void CheckpointSaver::close(core::State& /*state*/, core::Logger& /*logger*/) {
  closing_ = true;  // FIT_END already waited for the last save, so a save still in flight here ends on an error
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

void CheckpointSaver::save(core::State& s, core::Logger& logger) {
  wait();  // one save at a time; a failed earlier write surfaces here
  last_saved_batch_ = s.timestamp.batch;
  const auto started = Clock::now();
  // Snapshot (blocking): every tensor copied to host memory (async) or viewed there (sync), the rest as JSON.
  auto payload = std::make_shared<checkpoint::RankPayload>();
  const std::vector<Held> held = s.held_layout();
  for (const Held& h : held) {
    if (stores_held(s, h)) add_pieces(*payload, "model/", h, h.tensor, o_.async);
  }
  nlohmann::json components = nlohmann::json::object();
  if (!o_.weights_only) {
    if (s.parallel->stores_shards() && s.optimizer) {  // the optimizer steps shards only
      const std::vector<size_t> to_held = optimizer_to_held(s, held);
      for (const auto& [key, t] : s.optimizer->state()) {
        const size_t dot = key.find('.');
        if (dot == std::string::npos) continue;  // "step": in the metadata
        const size_t j = std::stoul(key.substr(0, dot));
        add_pieces(*payload, fmt::format("optim/{}/", key.substr(dot + 1)), held[to_held[j]], t, o_.async);
      }
    }
    for (const auto& [key, c] : stateful_components(s)) {
      std::optional<core::ComponentState> st = state_of(c, s);
      if (!st) continue;
      components[key] = st->values;
      if (!st->per_parameter.empty()) {
        if (st->per_parameter.size() != held.size()) {
          throw Error(kComponent, fmt::format("{}: per-parameter state has {} tensors for {} parameters", key,
                                              st->per_parameter.size(), held.size()));
        }
        components[key]["__per_parameter__"] = true;
        for (size_t i = 0; i < held.size(); ++i) {
          if (stores_held(s, held[i])) {
            add_pieces(*payload, fmt::format("component/{}/", key), held[i], st->per_parameter[i], o_.async);
          }
        }
      }
    }
    payload->local["rng/cpu"] = at::detail::getDefaultCPUGenerator().get_state();
    // On a GPU, dropout and every other random op on the device draw from the device's generator (a seed and an
    // offset): without it a resumed run draws other masks than the uninterrupted one.
    if (s.device.is_cuda()) payload->local["rng/cuda"] = at::globalContext().defaultGenerator(s.device).get_state();
  }
  const std::string name = fill_name(o_.filename, s);
  const std::regex names = filename_regex(o_.filename, s.run_name);
  nlohmann::json meta;
  if (s.rank == 0) {
    meta["run_name"] = s.run_name;
    meta["saved_at"] = now_iso8601();
    meta["timestamp"] = timestamp_to_json(s.timestamp);
    meta["previous_timestamp"] = timestamp_to_json(s.previous_timestamp);
    meta["weights_only"] = o_.weights_only;
    meta["sharding"] = {{"strategy", dist::to_string(s.parallel->options().sharding.strategy)},
                        {"world_size", s.world_size}};
    if (s.model->has_hf_format())
      meta["hf_config"] = nlohmann::json::parse(checkpoint::hf_config_json(*s.model, at::kFloat));
    if (s.optimizer && !o_.weights_only) {
      meta["optimizer"] = {
          {"name", s.optimizer->options().name}, {"step", s.optimizer->steps()}, {"slots", s.optimizer->slot_names()}};
    }
    meta["components"] = components;
    if (extra_) {
      nlohmann::json extra = extra_();
      if (o_.weights_only) extra = {{"config", extra.value("config", nlohmann::json())}};
      meta.update(extra);
    }
  }
  const double blocking = std::chrono::duration<double>(Clock::now() - started).count();
  // A remote save's receipts name the attempt, so that rank 0 never takes an interrupted earlier save's for this one's.
  std::string attempt;
  if (storage::is_remote(o_.folder)) {
    attempt = std::to_string(agree_on_index(s, [] {
      std::random_device rd;
      return static_cast<int64_t>((uint64_t{rd()} << 20) ^ rd()) & ((int64_t{1} << 52) - 1);
    }));
  }
  const checkpoint::PendingCheckpoint pending =
      checkpoint::begin_checkpoint(o_.folder, name, s.rank, o_.timeout, attempt);
  const int rank = static_cast<int>(s.rank), world = static_cast<int>(s.world_size);
  last_save_ = {0, 0, blocking};
  auto write = [this, pending, payload, meta, rank, world, started, names]() mutable {
    try {
      const uint64_t bytes = checkpoint::write_rank_file(pending, rank, *payload);
      payload.reset();
      last_save_.bytes = bytes;
      if (rank == 0) {
        checkpoint::publish_checkpoint(pending, std::move(meta), world, o_.timeout, o_.latest_filename, &closing_);
        const double secs = std::chrono::duration<double>(Clock::now() - started).count();
        spdlog::info("[checkpoint] saved {} ({:.1f} MB from rank 0, {:.2f} s)", pending.final_dir, bytes / 1e6, secs);
        if (o_.num_checkpoints_to_keep >= 0) {
          // Only Tessera checkpoints named by save_filename count and go; anything else in the folder stays.
          std::vector<std::string> all, others;
          for (std::string& d : checkpoint::list_checkpoints(o_.folder, &others))
            (named_by(names, d) ? all : others).push_back(std::move(d));
          mention_left_alone(others);
          const size_t keep = static_cast<size_t>(std::max<int64_t>(1, o_.num_checkpoints_to_keep));
          for (size_t i = 0; i + keep < all.size(); ++i) {
            if (fs::path(all[i]).lexically_normal() == fs::path(pending.final_dir).lexically_normal()) continue;
            try {
              checkpoint::remove_checkpoint(all[i]);
              spdlog::info("[checkpoint] removed {} (save_num_checkpoints_to_keep: {})", all[i],
                           o_.num_checkpoints_to_keep);
            } catch (const std::exception& e) {  // the new checkpoint is safe: training goes on
              spdlog::warn("[checkpoint] could not remove {}: {}", all[i], e.what());
            }
          }
        }
      }
      last_save_.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    } catch (...) {
      if (rank == 0) checkpoint::abandon_checkpoint(pending);
      error_ = std::current_exception();
    }
  };
  saved_.push_back(pending.final_dir);
  logger.log_metrics({{"checkpoint/blocking_seconds", blocking}});
  if (o_.async) {
    writer_ = std::thread(std::move(write));
  } else {
    write();
    wait();
  }
}

// ---- Loading ------------------------------------------------------------------------------------------------------

namespace {

// The body of load_checkpoint for a Tessera checkpoint, on one rank. Each file's checksum is verified as the reader
// first maps it, before its bytes are copied.
LoadedCheckpoint load_sharded(core::State& s, const std::string& path, const LoadOptions& o) {
  checkpoint::CheckpointReader r(path, /*verify_checksums=*/true);
  const nlohmann::json& meta = r.metadata();
  const std::vector<Held> held = s.held_layout();
  at::NoGradGuard no_grad;

  // Model weights.
  std::set<std::string> names;
  for (const auto& item : s.model->named_parameters()) names.insert(item.key());
  std::set<std::string> stored;
  for (const std::string& n : r.tensor_names("model/")) stored.insert(n.substr(6));
  std::vector<std::string> missing, unexpected;
  std::set_difference(names.begin(), names.end(), stored.begin(), stored.end(), std::back_inserter(missing));
  std::set_difference(stored.begin(), stored.end(), names.begin(), names.end(), std::back_inserter(unexpected));
  if (o.strict_model_weights && (!missing.empty() || !unexpected.empty())) {
    throw Error(kComponent, fmt::format("{}: the weights do not match the model (missing: [{}]; unexpected: [{}]); "
                                        "load_strict_model_weights: false loads the common ones",
                                        path, fmt::join(missing, ", "), fmt::join(unexpected, ", ")));
  }
  for (const std::string& m : missing)
    spdlog::warn("[checkpoint] {}: no weight {}; it keeps its initial value", path, m);
  for (const Held& h : held) {
    Held present{h.tensor, {}};
    for (const dist::ShardSpan& sp : h.spans) {
      if (stored.count(sp.name)) present.spans.push_back(sp);
    }
    read_pieces(r, "model/", present, h.tensor);
  }
  const bool full = !o.weights_only && !meta.value("weights_only", false);
  if (!full) return {path, meta, false};

  // Optimizer state.
  if (s.optimizer) {
    if (!meta.contains("optimizer")) throw Error(kComponent, fmt::format("{}: has no optimizer state", path));
    const nlohmann::json& om = meta.at("optimizer");
    if (om.at("name").get<std::string>() != s.optimizer->options().name) {
      throw Error(kComponent, fmt::format("{}: saved with optimizer {}, this run uses {} (load_weights_only: true "
                                          "starts a new optimizer)",
                                          path, om.at("name").get<std::string>(), s.optimizer->options().name));
    }
    std::vector<std::pair<std::string, at::Tensor>> st;
    const int64_t step = om.at("step").get<int64_t>();
    st.emplace_back("step", at::scalar_tensor(step, at::kLong));
    if (step > 0) {
      const std::vector<size_t> to_held = optimizer_to_held(s, held);
      for (size_t j = 0; j < to_held.size(); ++j) {
        const Held& h = held[to_held[j]];
        for (const std::string& slot : s.optimizer->slot_names()) {
          at::Tensor t = at::zeros_like(h.tensor, at::TensorOptions().dtype(at::kFloat)).detach();
          read_pieces(r, fmt::format("optim/{}/", slot), h, t);
          st.emplace_back(fmt::format("{}.{}", j, slot), t);
        }
      }
    }
    s.optimizer->load_state(st);
  }

  // Algorithms and callbacks.
  const nlohmann::json& comps = meta.value("components", nlohmann::json::object());
  for (const auto& [key, c] : stateful_components(s)) {
    if (!comps.contains(key)) continue;
    core::ComponentState cs;
    cs.values = comps.at(key);
    if (cs.values.value("__per_parameter__", false)) {
      cs.values.erase("__per_parameter__");
      for (const Held& h : held) {
        at::Tensor t = at::zeros_like(h.tensor).detach();
        read_pieces(r, fmt::format("component/{}/", key), h, t);
        cs.per_parameter.push_back(t);
      }
    }
    std::visit([&](auto* p) { p->load_state_dict(cs, s); }, c);
  }

  if (o.restore_progress) {
    s.timestamp = timestamp_from_json(meta.at("timestamp"));
    s.previous_timestamp = timestamp_from_json(meta.value("previous_timestamp", meta.at("timestamp")));
    const int saved_world = r.world_size();
    at::Tensor rng = s.rank < saved_world ? r.read_local(static_cast<int>(s.rank), "rng/cpu") : at::Tensor();
    if (rng.defined()) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(rng);
      const at::Tensor cuda_rng =
          s.device.is_cuda() ? r.read_local(static_cast<int>(s.rank), "rng/cuda") : at::Tensor();
      if (cuda_rng.defined()) {
        at::Generator cuda_gen = at::globalContext().defaultGenerator(s.device);  // shares the device's generator
        cuda_gen.set_state(cuda_rng);
      }
    } else if (s.rank == 0 || s.rank == saved_world) {
      spdlog::warn("[checkpoint] {}: saved by {} ranks, resumed on {}: ranks from {} on keep their fresh RNG state",
                   path, saved_world, s.world_size, saved_world);
    }
    if (saved_world != s.world_size && s.rank == 0) {
      spdlog::info("[checkpoint] resharded {} from {} ranks ({}) to {}", path, saved_world,
                   meta.at("sharding").value("strategy", "?"), s.world_size);
    }
  }
  return {path, meta, true};
}

// The lowest rank whose `failed` is true (world_size when none): one all-reduce, so that every rank learns whether
// any rank failed and no rank goes on alone.
int64_t first_failed_rank(core::State& s, bool failed) {
  at::Tensor t = at::full({1}, static_cast<double>(failed ? s.rank : s.world_size),
                          at::TensorOptions().dtype(at::kDouble).device(s.device));
  s.comm->all_reduce(t, dist::ReduceOp::kMin).wait();
  return static_cast<int64_t>(t.cpu().item<double>());
}

}  // namespace

LoadedCheckpoint load_checkpoint(core::State& s, const std::string& path, const LoadOptions& o) {
  if (storage::is_remote(path)) {
    if (!storage::stat(storage::join(path, "metadata.json")) && storage::stat(storage::join(path, "config.json"))) {
      // A Hugging Face folder in object storage: downloaded whole, then read as a local one.
      const util::TempFolder local("tessera-hf");
      const std::string prefix = storage::join(path, "");
      // A listing is not trusted: every key must name a file under the temporary folder ("a/../../x" or a key
      // outside the prefix is refused), checked for all of them before anything is fetched.
      std::vector<std::pair<std::string, std::string>> files;
      for (const storage::ObjectInfo& obj : storage::list(prefix)) {
        if (!obj.uri.empty() && obj.uri.back() == '/') continue;  // a "folder" marker holds no file
        if (obj.uri.rfind(prefix, 0) != 0) {
          throw Error(kComponent, fmt::format("{}: the listing returned {}, which is not under it", prefix, obj.uri));
        }
        const std::string rel = obj.uri.substr(prefix.size());
        files.emplace_back(obj.uri, util::confined_path(local.path, rel, obj.uri, kComponent, "object key").string());
      }
      for (const auto& [uri, file] : files) storage::download(uri, file);
      LoadedCheckpoint loaded = load_hf_weights(s, local.path, o.strict_model_weights);
      loaded.path = path;
      return loaded;
    }
  } else if (!fs::exists(fs::path(path) / "metadata.json") && fs::exists(fs::path(path) / "config.json")) {
    return load_hf_weights(s, path, o.strict_model_weights);
  }
  std::optional<LoadedCheckpoint> loaded;
  std::string error;
  try {
    loaded = load_sharded(s, path, o);
  } catch (const Error& e) {
    error = e.message();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int64_t failed = first_failed_rank(s, !loaded.has_value());
  if (failed == s.world_size) return *std::move(loaded);
  if (loaded) throw Error(kComponent, fmt::format("cannot load {}: rank {} failed to (see its log)", path, failed));
  throw Error(kComponent, fmt::format("cannot load {}: {}", path, error));
}

std::optional<LoadedCheckpoint> load_newest_checkpoint(core::State& s, const std::string& folder,
                                                       const std::string& latest_filename, const LoadOptions& o) {
  // A re-save that a crash interrupted between its two renames: rank 0 renames the checkpoint it had moved aside back
  // first; the broadcast holds the other ranks until then.
  if (s.rank == 0) checkpoint::restore_moved_aside(folder);
  agree_on_index(s, [] { return int64_t{0}; });
  // Every rank lists the folder; rank 0's count is the reference (a rank seeing another listing has no shared
  // folder).
  const std::vector<std::string> candidates = checkpoint::checkpoint_candidates(folder, latest_filename);
  const int64_t count = agree_on_index(s, [&] { return static_cast<int64_t>(candidates.size()); });
  if (count != static_cast<int64_t>(candidates.size())) {
    throw Error(kComponent, fmt::format("rank {} sees {} checkpoints in {}, rank 0 sees {} (is the folder shared?)",
                                        s.rank, candidates.size(), folder, count));
  }
  std::vector<std::string> skipped;
  for (const std::string& c : candidates) {
    try {
      return load_checkpoint(s, c, o);
    } catch (const dist::CommError&) {
      throw;  // the ranks can no longer agree on anything: not a property of this checkpoint
    } catch (const Error& e) {
      // Every rank gets here together (load_checkpoint agrees on the outcome).
      if (s.rank == 0) spdlog::warn("[checkpoint] {}; trying the next older checkpoint", e.message());
      skipped.push_back(c);
    }
  }
  if (skipped.empty()) return std::nullopt;
  // Parts of the state may have been read from a broken checkpoint before its problem showed: never train on.
  throw Error(kComponent, fmt::format("{}: none of its {} checkpoints could be loaded ({}); see the warnings above",
                                      folder, skipped.size(), fmt::join(skipped, ", ")));
}

}  // namespace tessera::callbacks
