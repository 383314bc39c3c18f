// Top-level recipe parsing: LLM Foundry's TrainConfig keys, delegated to each component's parser.
#include "tessera/trainer/train_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "tessera/algorithms/options.h"
#include "tessera/callbacks/options.h"
#include "tessera/config/reader.h"
#include "tessera/data/data_loader.h"
#include "tessera/eval/icl_task_keys.h"
#include "tessera/loggers/options.h"
#include "tessera/models/loss.h"
#include "tessera/models/metric.h"
#include "tessera/optim/optimizer.h"
#include "tessera/optim/scheduler.h"
#include "tessera/util/error.h"
#include "tessera/util/preemption.h"
#include "tessera/util/redact.h"

namespace tessera::trainer {

using core::Precision;
namespace {

using config::Section;
using config::Time;
using config::TimeUnit;

// Top-level keys of LLM Foundry's TrainConfig that Tessera does not implement yet.
const std::vector<std::string_view> kFoundryOnlyKeys = {"code_paths",
                                                        "eval_loaders",
                                                        "icl_tasks_str",
                                                        "eval_gauntlet_str",
                                                        "load_ignore_keys",
                                                        "save_ignore_keys",
                                                        "only_hf_checkpoint",
                                                        "only_composer_checkpoint",
                                                        "log_config",
                                                        "spin_dataloaders",
                                                        "device_train_grad_accum",
                                                        "device_train_batch_size",
                                                        "compile_config",
                                                        "metadata",
                                                        "parallelism_config",
                                                        "tp_config",
                                                        "train_subset_num_batches",
                                                        "dataloader",
                                                        "eval_subset_num_batches_per_loader",
                                                        "model_gauntlet",
                                                        "load_weights_only_strict",
                                                        "hf_save_path",
                                                        "fsdp_config_str",
                                                        "callbacks_str",
                                                        "seq_parallel_world_size"};

// Top-level keys Tessera reads (kept in step with parse_train_config; root.finish() re-checks at the end).
const std::vector<std::string_view> kTopLevelKeys = {"variables",
                                                     "max_seq_len",
                                                     "model",
                                                     "loss",
                                                     "metrics",
                                                     "tokenizer",
                                                     "train_loader",
                                                     "eval_loader",
                                                     "optimizer",
                                                     "scheduler",
                                                     "algorithms",
                                                     "callbacks",
                                                     "loggers",
                                                     "fsdp_config",
                                                     "parallelism",
                                                     "max_duration",
                                                     "eval_interval",
                                                     "eval_first",
                                                     "accumulate_train_batch_on_tokens",
                                                     "max_split_size_mb",
                                                     "expandable_segments",
                                                     "cuda_load_lazy",
                                                     "cuda_graphs",
                                                     "eval_subset_num_batches",
                                                     "global_train_batch_size",
                                                     "device_train_microbatch_size",
                                                     "device_eval_batch_size",
                                                     "precision",
                                                     "device",
                                                     "seed",
                                                     "run_name",
                                                     "save_folder",
                                                     "save_filename",
                                                     "save_latest_filename",
                                                     "save_interval",
                                                     "save_num_checkpoints_to_keep",
                                                     "save_overwrite",
                                                     "save_weights_only",
                                                     "save_async",
                                                     "load_path",
                                                     "load_weights_only",
                                                     "load_strict_model_weights",
                                                     "autoresume",
                                                     "preemption_signals",
                                                     "icl_tasks",
                                                     "icl_seq_len",
                                                     "icl_subset_num_batches",
                                                     "eval_gauntlet",
                                                     "profiler",
                                                     "console_log_interval",
                                                     "progress_bar",
                                                     "log_to_console",
                                                     "deterministic_mode",
                                                     "dist_timeout",
                                                     "python_log_level"};

template <class Options, class... Rest>
Options parse_named(Section& root, std::string_view key, const config::Registry<Options, Rest...>& registry,
                    bool required) {
  Section s = root.section(key);
  if (!s.present()) {
    if (required) root.fail(key, "missing required key");
    return Options{};
  }
  const std::string name = s.require_string("name");
  auto parsed = registry.parse(name, s, s, "name");
  return parsed ? std::move(*parsed) : Options{};
}

MicrobatchSize parse_microbatch(Section& root) {
  MicrobatchSize m;
  const config::Value* v = root.raw("device_train_microbatch_size");
  if (v == nullptr) return m;  // LLM Foundry's default: auto
  if (auto i = v->as_int()) {
    root.check(*i > 0, "device_train_microbatch_size", "must be positive or \"auto\"");
    m.automatic = false;
    m.samples = *i;
    return m;
  }
  root.check(v->is_scalar() && v->text() == "auto", "device_train_microbatch_size",
             "expected a positive integer or \"auto\", got " + v->type_name() + " " + v->brief());
  return m;
}

void parse_icl_tasks(Section& root, TrainConfig& cfg) {
  const config::Value* v = root.raw("icl_tasks");
  if (v == nullptr) return;
  if (v->is_scalar()) {
    cfg.icl_tasks_path = v->text();
    return;
  }
  root.check(v->is_sequence(), "icl_tasks",
             "expected a path to a tasks YAML or a list of tasks, got " + v->type_name());
  for (size_t i = 0; i < v->items().size(); ++i) {
    Section t(&v->items()[i], fmt::format("icl_tasks.{}", i), root.context());
    IclTaskOptions task;
    task.raw = v->items()[i];
    task.label = t.require_string("label");
    task.dataset_uri = t.require_string("dataset_uri");
    task.icl_task_type = t.get_choice(
        "icl_task_type", "",
        {"language_modeling", "multiple_choice", "schema", "generation_task_with_answers", "code_evaluation"});
    if (task.icl_task_type == "code_evaluation") t.not_supported("icl_task_type", "code_evaluation");
    const config::Value* shots = t.raw("num_fewshot");
    t.check(shots != nullptr && shots->is_sequence(), "num_fewshot", "expected a list of integers such as [0, 5]");
    for (const config::Value& k : shots->items()) {
      auto n = k.as_int();
      t.check(n && *n >= 0, "num_fewshot", "expected a list of non-negative integers, got " + shots->brief());
      task.num_fewshot.push_back(*n);
    }
    // Task-format keys, read by the ICL evaluator.
    for (std::string_view key : eval::kIclTaskKeys) t.raw(key);
    t.finish(eval::kIclTaskFoundryOnlyKeys);
    cfg.icl_tasks.push_back(std::move(task));
  }
}

}  // namespace

TrainConfig parse_train_config(config::Value resolved, const std::string& path) {
  config::ParseContext ctx(path);
  TrainConfig cfg;
  cfg.recipe_path = path;
  cfg.resolved = std::move(resolved);
  Section root(&cfg.resolved, "", ctx);

  std::vector<std::string_view> known = kTopLevelKeys;
  known.insert(known.end(), kFoundryOnlyKeys.begin(), kFoundryOnlyKeys.end());
  root.reject_unknown(known);
  root.raw("variables");  // free-form, only referenced through ${variables.*}
  cfg.max_seq_len = root.require_int("max_seq_len");
  root.check(cfg.max_seq_len > 0, "max_seq_len", "must be positive");

  {
    Section model = root.section("model");
    if (!model.present()) root.fail("model", "missing required key");
    const std::string name = model.require_string("name");
    if (auto parsed = models::model_registry().parse(name, model, model, "name")) {
      cfg.model = *std::move(parsed);
      cfg.model.name = name;
      // As in LLM Foundry, the model's max_seq_len is its own (MPTConfig default 2048), not the top-level value.
      model.check(cfg.model.max_seq_len >= cfg.max_seq_len, "max_seq_len",
                  fmt::format("the model's max_seq_len ({}) is shorter than the recipe's max_seq_len ({})",
                              cfg.model.max_seq_len, cfg.max_seq_len));
    }
  }
  if (root.has("loss")) cfg.loss = parse_named(root, "loss", models::loss_registry(), true);
  cfg.metrics = config::parse_components(root, "metrics", models::metric_registry());
  {
    Section tok = root.section("tokenizer");
    if (!tok.present()) root.fail("tokenizer", "missing required key");
    cfg.tokenizer = data::parse_tokenizer_options(tok);
  }
  cfg.train_loader = parse_named(root, "train_loader", data::loader_registry(), true);
  if (root.has("eval_loader")) cfg.eval_loader = parse_named(root, "eval_loader", data::loader_registry(), true);
  for (const data::LoaderOptions* loader : {&cfg.train_loader, cfg.eval_loader ? &*cfg.eval_loader : nullptr}) {
    if (loader == nullptr || !cfg.model.options.has_value()) continue;
    const char* key = loader == &cfg.train_loader ? "train_loader" : "eval_loader";
    root.check(loader->tokens.max_seq_len <= cfg.model.max_seq_len, key,
               fmt::format("dataset.max_seq_len ({}) exceeds the model's max_seq_len ({})", loader->tokens.max_seq_len,
                           cfg.model.max_seq_len));
  }
  cfg.optimizer = parse_named(root, "optimizer", optim::optimizer_registry(), true);
  cfg.scheduler = parse_named(root, "scheduler", optim::scheduler_registry(), true);
  cfg.algorithms = config::parse_components(root, "algorithms", algorithms::algorithm_registry());
  cfg.callbacks = config::parse_components(root, "callbacks", callbacks::callback_registry());
  cfg.loggers = config::parse_components(root, "loggers", loggers::logger_registry());
  {
    Section fsdp = root.section("fsdp_config");
    cfg.fsdp_configured = fsdp.present();
    cfg.fsdp = dist::parse_sharding_options(fsdp);
    if (Section mesh = root.section("parallelism"); mesh.present()) dist::parse_parallelism(mesh, fsdp, cfg.fsdp);
  }
  {
    const double seconds = root.get_double("dist_timeout", 600.0);
    root.check(seconds > 0, "dist_timeout", "must be a positive number of seconds");
    cfg.dist_timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  if (std::optional<std::string> level = root.get_optional_string("python_log_level")) {
    // Python's logging levels (LLM Foundry sets its and Composer's loggers to this one) as spdlog's.
    std::string lower;
    for (char c : *level) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const std::map<std::string, std::string> kLevels = {
        {"notset", "trace"}, {"debug", "debug"}, {"info", "info"},         {"warning", "warn"},
        {"warn", "warn"},    {"error", "error"}, {"critical", "critical"}, {"fatal", "critical"}};
    auto it = kLevels.find(lower);
    root.check(it != kLevels.end(), "python_log_level",
               fmt::format("'{}' is not a Python logging level (debug, info, warning, error, critical)", *level));
    cfg.log_level = it->second;
  }

  cfg.max_duration = root.require_time("max_duration", TimeUnit::kEpoch);
  root.check(cfg.max_duration.unit() != TimeUnit::kDuration, "max_duration", "cannot be given in `dur`");
  root.check(!cfg.max_duration.is_zero(), "max_duration", "must be positive");
  cfg.eval_interval = root.get_time("eval_interval", cfg.eval_interval, TimeUnit::kEpoch);
  cfg.eval_first = root.get_bool("eval_first", false);
  cfg.accumulate_train_batch_on_tokens = root.get_bool("accumulate_train_batch_on_tokens", true);
  cfg.max_split_size_mb = root.get_optional_int("max_split_size_mb");
  root.check(!cfg.max_split_size_mb || *cfg.max_split_size_mb > 0, "max_split_size_mb", "must be positive");
  cfg.expandable_segments = root.get_bool("expandable_segments", false);
  cfg.cuda_load_lazy = root.get_bool("cuda_load_lazy", false);
  cfg.cuda_graphs = root.get_bool("cuda_graphs", false);
  cfg.eval_subset_num_batches = root.get_int("eval_subset_num_batches", -1);
  root.check(cfg.eval_subset_num_batches == -1 || cfg.eval_subset_num_batches > 0, "eval_subset_num_batches",
             "must be -1 (all batches) or positive");

  cfg.global_train_batch_size = root.require_int("global_train_batch_size");
  root.check(cfg.global_train_batch_size > 0, "global_train_batch_size", "must be positive");
  cfg.device_train_microbatch_size = parse_microbatch(root);
  // LLM Foundry's default when absent (config_utils.update_config_with_batch_size_info): the train microbatch size,
  // or 1 with automatic microbatching.
  cfg.device_eval_batch_size =
      root.get_int("device_eval_batch_size",
                   cfg.device_train_microbatch_size.automatic ? 1 : cfg.device_train_microbatch_size.samples);
  root.check(cfg.device_eval_batch_size > 0, "device_eval_batch_size", "must be positive");

  const std::string precision =
      root.get_choice("precision", "amp_bf16", {"fp32", "amp_bf16", "amp_fp16", "amp_fp8", "auto"});
  cfg.precision_auto = precision == "auto";
  if (precision == "fp32") cfg.precision = Precision::kFp32;
  if (precision == "amp_fp16") cfg.precision = Precision::kAmpFp16;
  if (precision == "amp_fp8") cfg.precision = Precision::kAmpFp8;
  cfg.device = root.get_choice("device", cfg.device, {"auto", "cpu", "gpu"});
  cfg.seed = root.get_int("seed", 17);
  root.check(cfg.seed >= 0, "seed", "must be non-negative");
  cfg.deterministic_mode = root.get_bool("deterministic_mode", false);

  if (auto name = root.get_optional_string("run_name")) {
    cfg.run_name = *name;
  } else if (const char* env = std::getenv("RUN_NAME"); env != nullptr && *env != '\0') {
    cfg.run_name = env;
  } else {
    cfg.run_name = std::filesystem::path(path).stem().string();
  }

  cfg.save_folder = root.get_optional_string("save_folder");
  callbacks::SaveOptions& save = cfg.save;
  save.filename = root.get_string("save_filename", save.filename);
  root.check(!save.filename.empty() && save.filename.find('/') == std::string::npos &&
                 save.filename.find("{rank}") == std::string::npos,
             "save_filename", "must name one directory (no '/', no {rank}: all ranks share it)");
  save.latest_filename = root.get_string("save_latest_filename", save.latest_filename);
  root.check(save.latest_filename.find('/') == std::string::npos, "save_latest_filename", "must not contain '/'");
  save.interval = root.get_time("save_interval", save.interval, TimeUnit::kEpoch);
  root.check(!save.interval.is_zero(), "save_interval", "must be positive");
  save.num_checkpoints_to_keep = root.get_int("save_num_checkpoints_to_keep", -1);
  root.check(save.num_checkpoints_to_keep >= -1, "save_num_checkpoints_to_keep", "must be -1 (keep all) or >= 0");
  save.overwrite = root.get_bool("save_overwrite", false);
  save.weights_only = root.get_bool("save_weights_only", false);
  save.async = root.get_bool("save_async", true);
  cfg.load_path = root.get_optional_string("load_path");
  cfg.load.weights_only = root.get_bool("load_weights_only", false);
  cfg.load.strict_model_weights = root.get_bool("load_strict_model_weights", true);
  cfg.autoresume = root.get_bool("autoresume", false);
  root.check(!cfg.autoresume || cfg.save_folder.has_value(), "autoresume", "needs save_folder");
  {
    const std::vector<std::string> names = root.get_strings("preemption_signals", {"SIGTERM", "SIGUSR1"});
    cfg.preemption_signals.clear();
    for (const std::string& n : names) {
      try {
        cfg.preemption_signals.push_back(util::parse_signal_name(n));
      } catch (const ConfigError& e) {
        root.fail("preemption_signals", e.message());  // names the value and the accepted signals
      }
    }
  }

  parse_icl_tasks(root, cfg);
  if (const config::Value* v = root.raw("icl_seq_len"); v != nullptr && !v->is_null()) {
    const auto n = v->as_int();
    root.check(n && *n > 0, "icl_seq_len", "expected a positive integer, got " + v->brief());
    cfg.icl_seq_len = *n;
  }
  if (const config::Value* v = root.raw("icl_subset_num_batches"); v != nullptr && !v->is_null()) {
    const auto n = v->as_int();
    root.check(n && *n > 0, "icl_subset_num_batches", "expected a positive integer or null, got " + v->brief());
    cfg.icl_subset_num_batches = *n;
  }
  if (const config::Value* v = root.raw("eval_gauntlet"); v != nullptr && !v->is_null()) {
    root.check(v->is_scalar() || v->is_map(), "eval_gauntlet",
               "expected a path to a gauntlet YAML or a mapping, got " + v->type_name());
    root.check(cfg.icl_tasks_path.has_value() || !cfg.icl_tasks.empty(), "eval_gauntlet", "needs icl_tasks");
    cfg.eval_gauntlet = *v;
  }

  if (Section prof = root.section("profiler"); prof.present()) cfg.profiler = callbacks::parse_profiler_options(prof);

  cfg.console_log_interval = root.get_time("console_log_interval", cfg.console_log_interval, TimeUnit::kBatch);
  root.check(cfg.console_log_interval.unit() == TimeUnit::kBatch || cfg.console_log_interval.unit() == TimeUnit::kEpoch,
             "console_log_interval", "must be in ba or ep");
  cfg.progress_bar = root.get_bool("progress_bar", false);
  cfg.log_to_console = root.get_bool("log_to_console", true);

  root.finish(kFoundryOnlyKeys);
  ctx.throw_if_unsupported();
  return cfg;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  config::Value root = config::load_yaml_file(path);
  for (const std::string& o : overrides) config::apply_override(root, o);
  config::resolve_interpolations(root);
  return parse_train_config(std::move(root), path);
}

nlohmann::ordered_json recorded_config(const TrainConfig& cfg) {
  return util::redact_secrets(cfg.resolved.to_json());
}

}  // namespace tessera::trainer
