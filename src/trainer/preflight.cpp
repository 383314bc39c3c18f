// Pre-flight (trainer/preflight.h): the recipe's inputs and outputs, checked before anything is built.
#include "tessera/trainer/preflight.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "tessera/callbacks/options.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/data/data_loader.h"
#include "tessera/data/tokenizer.h"
#include "tessera/eval/gauntlet.h"
#include "tessera/eval/icl.h"
#include "tessera/loggers/options.h"
#include "tessera/models/causal_lm.h"
#include "tessera/storage/probe.h"
#include "tessera/storage/storage.h"
#include "tessera/trainer/plan.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub.h"

namespace tessera::trainer {
namespace {

namespace fs = std::filesystem;

// The recipe file and line of `key` ("a.b.c"): its own value's, else its nearest ancestor's that the recipe has.
std::string where_of(const TrainConfig& cfg, const std::string& key) {
  const config::Value* v = &cfg.resolved;
  const config::Origin* origin = &v->origin();
  std::string rest = key;
  while (!rest.empty() && v->is_map()) {
    const size_t dot = rest.find('.');
    const std::string part = rest.substr(0, dot);
    rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
    v = v->find(part);
    if (v == nullptr) break;
    if (v->origin().line > 0 || !v->origin().override.empty()) origin = &v->origin();
  }
  const std::string shown = origin->describe();
  return shown.empty() ? cfg.recipe_path : shown;
}

class Checks {
 public:
  Checks(const TrainConfig& cfg, const PreflightOptions& o) : cfg_(cfg), o_(o) {}

  void add(const std::string& key, const std::string& message) {
    problems_.push_back({key, where_of(cfg_, key), message});
  }
  void add_all(const std::string& prefix, const config::Problems& found) {
    for (const config::Problem& p : found) add(prefix + p.key, p.message);
  }
  std::vector<PreflightProblem> take() { return std::move(problems_); }

  // The model on `meta` (shapes only); null, with the problem recorded, when it cannot be built.
  std::shared_ptr<models::CausalLM> model() {
    try {
      return models::model_registry().build(cfg_.model.name, cfg_.model, "meta", 0);
    } catch (const Error& e) {
      add("model", e.message());
      return nullptr;
    }
  }

  // The tokenizer, wherever it resolves (a file, a folder, a hub id in the cache), must load and fit the model's
  // vocabulary. One that resolves nowhere is a problem only for a run that tokenizes (fine-tuning data, ICL tasks);
  // a run over pre-tokenized MDS data goes on without it (an HF export then says it leaves the tokenizer out).
  void tokenizer(const models::CausalLM* model) {
    if (cfg_.tokenizer.name.empty()) return;
    fs::path resolved;
    try {
      resolved = util::resolve_hf_tokenizer(cfg_.tokenizer.name);
    } catch (const Error& e) {
      const bool icl = !cfg_.icl_tasks.empty() || cfg_.icl_tasks_path;
      const bool finetuning = cfg_.train_loader.finetuning || (cfg_.eval_loader && cfg_.eval_loader->finetuning);
      if (icl || finetuning) {
        add("tokenizer.name",
            fmt::format("{} need a tokenizer: {}", icl ? "icl_tasks" : "fine-tuning data", e.message()));
      }
      return;
    }
    try {
      const data::Tokenizer tok = data::Tokenizer::from_file(resolved);
      if (model != nullptr && tok.vocab_size() > model->vocab_size()) {
        add("tokenizer.name",
            fmt::format("{} has {} tokens, more than the model's vocab_size {}: ids past {} would "
                        "index outside the embedding",
                        cfg_.tokenizer.name, tok.vocab_size(), model->vocab_size(), model->vocab_size() - 1));
      }
    } catch (const Error& e) {
      add("tokenizer.name", e.message());
    }
  }

  void loader(const std::string& key, const data::LoaderOptions& options) {
    add_all(key + ".", data::loader_registry().check(options.name, options, context()));
  }

  void icl_tasks() {
    std::vector<eval::IclTaskConfig> tasks;
    try {
      if (cfg_.icl_tasks_path) {
        if (auto why = storage::unreadable(*cfg_.icl_tasks_path)) return add("icl_tasks", *why);
        tasks = eval::load_icl_tasks(*cfg_.icl_tasks_path);
      } else {
        const std::string base = fs::path(cfg_.recipe_path).parent_path().string();
        for (const IclTaskOptions& t : cfg_.icl_tasks) tasks.push_back(eval::parse_icl_task(t.raw, base));
      }
    } catch (const Error& e) {
      return add("icl_tasks", e.message());
    }
    for (const eval::IclTaskConfig& t : tasks) {
      if (auto why = storage::unreadable(t.dataset_uri)) add("icl_tasks", fmt::format("task {}: {}", t.label, *why));
    }
    if (cfg_.eval_gauntlet && cfg_.eval_gauntlet->is_scalar()) {
      fs::path g = cfg_.eval_gauntlet->text();
      const fs::path beside = fs::path(cfg_.recipe_path).parent_path() / g;
      std::error_code ec;
      if (!fs::exists(g, ec) && fs::exists(beside, ec)) g = beside;
      try {
        if (auto why = storage::unreadable(g.string())) return add("eval_gauntlet", *why);
        (void)eval::load_gauntlet(g.string());
      } catch (const Error& e) {
        add("eval_gauntlet", e.message());
      }
    }
  }

  // A Tessera checkpoint's model tensors against the model's: a shape that differs, or (strict) one that is missing.
  void checkpoint_matches(const std::string& key, const std::string& path, const models::CausalLM& model) {
    const checkpoint::CheckpointReader reader(path, false);
    std::vector<std::string> missing;
    for (const auto& item : model.named_parameters()) {
      const std::string name = "model/" + item.key();
      if (!reader.has_tensor(name)) {
        missing.push_back(item.key());
      } else if (reader.shape(name) != item.value().sizes().vec()) {
        return add(key,
                   fmt::format("{}: {} has shape [{}] there and [{}] in the model (another model size?)", path,
                               item.key(), fmt::join(reader.shape(name), ", "), fmt::join(item.value().sizes(), ", ")));
      }
    }
    if (!missing.empty() && cfg_.load.strict_model_weights) {
      add(key, fmt::format("{}: {} of the model's weights are not there (first: {}); load_strict_model_weights: "
                           "false loads the common ones",
                           path, missing.size(), missing.front()));
    }
  }

  // autoresume: the checkpoint the run would resume from (the newest that validates) fits the model.
  void resume_point(const models::CausalLM* model) {
    if (!cfg_.autoresume || !cfg_.save_folder || model == nullptr) return;
    const std::string folder = util::fill_path_pattern(*cfg_.save_folder, cfg_.run_name, 0);
    try {
      if (!storage::is_remote(folder) && storage::unreadable(folder)) return;  // nothing saved yet: a fresh start
      if (auto newest = checkpoint::find_latest_valid_checkpoint(folder, cfg_.save.latest_filename, false)) {
        checkpoint_matches("autoresume", *newest, *model);
      }
    } catch (const Error& e) {
      add("autoresume", e.message());
    }
  }

  // load_path: exists, validates (sizes; checksums are verified as it is read), and has the model's shapes.
  void load_path(const models::CausalLM* model) {
    if (!cfg_.load_path) return;
    const std::string& path = *cfg_.load_path;
    // An object store has no folders: a checkpoint or an HF folder there is a prefix, known by the files under it.
    const bool remote = storage::is_remote(path);
    if (!remote) {
      if (auto why = storage::unreadable(path)) return add("load_path", *why);
    }
    try {
      if (checkpoint::is_checkpoint(path)) {
        if (const std::string bad = checkpoint::validate_checkpoint(path, false); !bad.empty()) {
          return add("load_path", bad);
        }
        if (model != nullptr) checkpoint_matches("load_path", path, *model);
        return;
      }
      std::error_code ec;
      const bool hf = remote ? !storage::unreadable(storage::join(path, "config.json"))
                             : fs::exists(fs::path(path) / "config.json", ec);
      if (!hf) {
        return add("load_path", fmt::format("{}: neither a Tessera checkpoint (metadata.json) nor a Hugging Face "
                                            "folder (config.json)",
                                            path));
      }
      if (model == nullptr || remote) return;  // a remote folder's tensors are checked as they are downloaded
      const checkpoint::HfWeights weights(*model, path);
      for (const auto& item : model->named_parameters()) {
        if (!weights.param(item.key()) && cfg_.load.strict_model_weights) {
          return add("load_path", fmt::format("{}: no weight {} (load_strict_model_weights: false loads the others)",
                                              path, item.key()));
        }
      }
    } catch (const Error& e) {
      add("load_path", e.message());
    }
  }

  // save_folder: writable, with room on a local disk for the checkpoints the run keeps at once.
  void save_folder(const models::CausalLM* model) {
    if (!cfg_.save_folder) return;
    const std::string folder = util::fill_path_pattern(*cfg_.save_folder, cfg_.run_name, 0);
    if (auto why = storage::unwritable(folder, o_.probe_writes && o_.rank == 0)) return add("save_folder", *why);
    const std::optional<uint64_t> free = storage::free_bytes(folder);
    if (!free || model == nullptr || o_.rank != 0) return;
    Plan plan;
    plan.n_params = model->num_params();
    const double one = checkpoint_bytes_per_rank(cfg_, plan, dist::ShardingStrategy::kNoShard);
    // Kept at once: K, plus the one being written before the oldest goes; keeping all of them (K = -1), at least the
    // first (how many more the run keeps is its own to judge).
    const int64_t copies = cfg_.save.num_checkpoints_to_keep > 0 ? cfg_.save.num_checkpoints_to_keep + 1 : 1;
    const double need = one * static_cast<double>(copies);
    if (need > static_cast<double>(*free)) {
      add("save_folder", fmt::format("{}: {:.2f} GB free, and the run keeps up to {} checkpoint(s) of {:.2f} GB "
                                     "(fp32 weights{}); free space or lower save_num_checkpoints_to_keep",
                                     folder, static_cast<double>(*free) / 1e9, copies, one / 1e9,
                                     cfg_.save.weights_only ? "" : " and optimizer state"));
    }
  }

  void profiler() {
    if (!cfg_.profiler) return;
    const std::string folder = util::fill_path_pattern(cfg_.profiler->folder, cfg_.run_name, o_.rank);
    if (auto why = storage::unwritable(folder, false)) add("profiler.torch_prof_folder", *why);
  }

  void components(const std::string& family, const std::vector<config::ComponentOptions>& list,
                  const core::CallbackRegistry& registry) {
    for (const config::ComponentOptions& c : list) {
      add_all(family + "." + c.name + ".", registry.check(c.name, c.options, context()));
    }
  }

 private:
  config::CheckContext context() const { return {cfg_.run_name, o_.rank, o_.probe_writes && o_.rank == 0}; }

  const TrainConfig& cfg_;
  PreflightOptions o_;
  std::vector<PreflightProblem> problems_;
};

}  // namespace

std::vector<PreflightProblem> preflight(const TrainConfig& cfg, const PreflightOptions& options) {
  Checks checks(cfg, options);
  const std::shared_ptr<models::CausalLM> model = checks.model();
  checks.loader("train_loader", cfg.train_loader);
  if (cfg.eval_loader) checks.loader("eval_loader", *cfg.eval_loader);
  checks.tokenizer(model.get());
  checks.icl_tasks();
  checks.load_path(model.get());
  checks.resume_point(model.get());
  checks.save_folder(model.get());
  checks.profiler();
  checks.components("loggers", cfg.loggers, loggers::logger_registry());
  checks.components("callbacks", cfg.callbacks, callbacks::callback_registry());
  return checks.take();
}

std::string render_preflight(const TrainConfig& cfg, const std::vector<PreflightProblem>& problems) {
  std::ostringstream out;
  out << fmt::format("{}: {} problem{} found before the first step (nothing was started or written):", cfg.recipe_path,
                     problems.size(), problems.size() == 1 ? "" : "s");
  for (const PreflightProblem& p : problems) out << fmt::format("\n  {}: {}: {}", p.where, p.key, p.message);
  return out.str();
}

PreflightError::PreflightError(const TrainConfig& cfg, std::vector<PreflightProblem> problems)
    : ConfigError("preflight", render_preflight(cfg, problems)), problems_(std::move(problems)) {}

void require_preflight(const TrainConfig& cfg, const PreflightOptions& options) {
  std::vector<PreflightProblem> problems = preflight(cfg, options);
  if (!problems.empty()) throw PreflightError(cfg, std::move(problems));
}

}  // namespace tessera::trainer
