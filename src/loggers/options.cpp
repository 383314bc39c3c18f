// The logger registry: option schemas and builders.
#include "tessera/loggers/options.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "tessera/config/value.h"
#include "tessera/loggers/loggers.h"
#include "tessera/loggers/mlflow.h"
#include "tessera/loggers/tensorboard.h"
#include "tessera/loggers/wandb.h"
#include "tessera/storage/probe.h"
#include "tessera/util/file_io.h"

namespace tessera::loggers {

core::CallbackRegistry& logger_registry() {
  static core::CallbackRegistry* registry = [] {
    auto* r = new core::CallbackRegistry("logger");
    r->add(
        "jsonl",
        [](config::Section& s) -> std::any {
          JsonlLoggerOptions o;
          o.filename = s.get_string("filename", o.filename);
          s.check(!o.filename.empty(), "filename", "must not be empty");
          s.finish();
          return o;
        },
        [](const std::any& options, const core::RunContext& run) -> std::shared_ptr<core::Callback> {
          const auto& o = std::any_cast<const JsonlLoggerOptions&>(options);
          // Metrics are reduced over the ranks before they are logged: one file, from rank 0, unless the name has
          // {rank}.
          if (run.rank != 0 && o.filename.find("{rank}") == std::string::npos) return nullptr;
          return std::make_shared<JsonlLogger>(util::fill_path_pattern(o.filename, run.run_name, run.rank));
        });
    r->add(
        "tensorboard",
        [](config::Section& s) -> std::any {
          TensorBoardLoggerOptions o;
          o.log_dir = s.get_string("log_dir", o.log_dir);
          s.check(!o.log_dir.empty(), "log_dir", "must not be empty");
          o.flush_interval = s.get_int("flush_interval", o.flush_interval);
          s.check(o.flush_interval > 0, "flush_interval", "must be a positive number of batches");
          o.rank_zero_only = s.get_bool("rank_zero_only", o.rank_zero_only);
          s.finish();
          return o;
        },
        [](const std::any& options, const core::RunContext& run) -> std::shared_ptr<core::Callback> {
          return std::make_shared<TensorBoardLogger>(std::any_cast<const TensorBoardLoggerOptions&>(options),
                                                     run.run_name);
        });
    r->add(
        "mlflow",
        [](config::Section& s) -> std::any {
          MlflowLoggerOptions o;
          o.experiment_name = s.get_string("experiment_name", o.experiment_name);
          o.run_name = s.get_string("run_name", o.run_name);
          o.tracking_uri = s.get_string("tracking_uri", o.tracking_uri);
          if (const config::Value* tags = s.raw("tags")) {
            s.check(tags->is_map(), "tags", "expected a mapping of tag names to values");
            for (const auto& [k, v] : tags->entries()) o.tags[k] = v.text();
          }
          if (const config::Value* renames = s.raw("rename_metrics")) {
            s.check(renames->is_map(), "rename_metrics", "expected a mapping of metric names to new names");
            for (const auto& [k, v] : renames->entries()) o.rename_metrics[k] = v.text();
          }
          o.rank_zero_only = s.get_bool("rank_zero_only", o.rank_zero_only);
          o.flush_interval = s.get_double("flush_interval", o.flush_interval);
          s.check(o.flush_interval >= 0, "flush_interval", "must be a non-negative number of seconds");
          o.synchronous = s.get_bool("synchronous", o.synchronous);
          o.resume = s.get_bool("resume", o.resume);
          o.ignore_metrics = s.get_strings("ignore_metrics", o.ignore_metrics);
          o.ignore_hyperparameters = s.get_strings("ignore_hyperparameters", o.ignore_hyperparameters);
          o.run_group = s.get_string("run_group", o.run_group);
          o.local_artifact_root = s.get_string("local_artifact_root", o.local_artifact_root);
          s.check(o.local_artifact_root.empty() || std::filesystem::path(o.local_artifact_root).is_absolute(),
                  "local_artifact_root", "must be an absolute path");
          o.log_duplicated_metric_every_n_steps =
              s.get_int("log_duplicated_metric_every_n_steps", o.log_duplicated_metric_every_n_steps);
          // Keys of Composer's logger that tune its Python side: accepted, said once.
          for (const char* key : {"log_system_metrics", "logging_buffer_seconds"}) {
            if (s.has(key)) {
              s.raw(key);
              spdlog::warn(
                  "loggers.mlflow.{}: tunes Composer's Python MLflow client; Tessera sends metrics every "
                  "flush_interval seconds and logs no system metrics (ignored)",
                  key);
            }
          }
          s.finish({"model_registry_prefix", "model_registry_uri"});
          return o;
        },
        [](const std::any& options, const core::RunContext& run) -> std::shared_ptr<core::Callback> {
          const auto& o = std::any_cast<const MlflowLoggerOptions&>(options);
          if (o.rank_zero_only && run.rank != 0) return nullptr;
          return std::make_shared<MlflowLogger>(o, run);
        });
    // Pre-flight: the folders the files go to can be written, and the tracking server answers.
    r->set_check("jsonl", [](const std::any& options, const config::CheckContext& c) -> config::Problems {
      const auto& o = std::any_cast<const JsonlLoggerOptions&>(options);
      const std::string file = util::fill_path_pattern(o.filename, c.run_name, c.rank);
      if (auto why = storage::unwritable(file, c.probe_writes)) return {{"filename", *why}};
      return {};
    });
    r->set_check("tensorboard", [](const std::any& options, const config::CheckContext& c) -> config::Problems {
      const auto& o = std::any_cast<const TensorBoardLoggerOptions&>(options);
      const std::string dir = util::fill_path_pattern(o.log_dir, c.run_name, c.rank);
      if (auto why = storage::unwritable(dir, c.probe_writes)) return {{"log_dir", *why}};
      return {};
    });
    r->set_check("mlflow", [](const std::any& options, const config::CheckContext& c) -> config::Problems {
      const auto& o = std::any_cast<const MlflowLoggerOptions&>(options);
      if (o.rank_zero_only && c.rank != 0) return {};
      try {
        MlflowClient client(mlflow_tracking_uri(o), /*attempts=*/2);
        (void)client.call("GET", "experiments/search", {{"max_results", 1}});
      } catch (const Error& e) {
        return {{"tracking_uri", e.message()}};
      }
      return {};
    });
    r->add(
        "wandb",
        [](config::Section& s) -> std::any {
          WandbLoggerOptions o;
          o.project = s.get_string("project", o.project);
          o.group = s.get_string("group", o.group);
          o.name = s.get_string("name", o.name);
          o.entity = s.get_string("entity", o.entity);
          o.tags = s.get_strings("tags", o.tags);
          if (s.get_bool("log_artifacts", false)) s.not_supported("log_artifacts", "checkpoints as W&B artifacts");
          o.rank_zero_only = s.get_bool("rank_zero_only", o.rank_zero_only);
          config::Section init = s.section("init_kwargs");
          for (const auto& [key, field] : {std::pair<const char*, std::string*>{"project", &o.project},
                                           {"group", &o.group},
                                           {"name", &o.name},
                                           {"entity", &o.entity},
                                           {"dir", &o.dir},
                                           {"id", &o.id},
                                           {"notes", &o.notes},
                                           {"job_type", &o.job_type}}) {
            *field = init.get_string(key, *field);
          }
          if (init.has("tags")) o.tags = init.get_strings("tags", o.tags);
          // resume: allow / must / true continue the run of that id; never / false / null start it fresh.
          if (const config::Value* v = init.raw("resume"); v != nullptr && !v->is_null()) {
            const std::optional<bool> b = v->as_bool();
            init.check(b.has_value() || v->text() == "allow" || v->text() == "must" || v->text() == "never" ||
                           v->text() == "auto",
                       "resume", "expected allow, must, never, auto, true or false");
            o.resume = b.value_or(v->text() == "allow" || v->text() == "must");
          }
          // mode: runs are written offline (`wandb sync` uploads them); `disabled` writes nothing.
          const std::string mode = init.get_choice("mode", "offline", {"offline", "online", "disabled"});
          init.finish({"config", "reinit", "settings", "save_code", "anonymous", "allow_val_change", "force",
                       "sync_tensorboard", "monitor_gym", "magic", "config_exclude_keys", "config_include_keys",
                       "fork_from", "resume_from"});
          s.finish();
          if (mode == "disabled") return std::any();
          return o;
        },
        [](const std::any& options, const core::RunContext& run) -> std::shared_ptr<core::Callback> {
          if (!options.has_value()) return nullptr;  // init_kwargs.mode: disabled
          const auto& o = std::any_cast<const WandbLoggerOptions&>(options);
          if (o.rank_zero_only && run.rank != 0) return nullptr;
          return std::make_shared<WandbLogger>(o, run);
        });
    r->set_check("wandb", [](const std::any& options, const config::CheckContext& c) -> config::Problems {
      if (!options.has_value()) return {};
      const auto& o = std::any_cast<const WandbLoggerOptions&>(options);
      if (auto why = storage::unwritable(wandb_root(o), false)) return {{"init_kwargs.dir", *why}};
      return {};
    });
    r->add_foundry_names({"file", "inmemory", "comet_ml", "neptune", "slack", "mosaicml", "remote_uploader_downloader",
                          "progress_bar", "console"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::loggers
