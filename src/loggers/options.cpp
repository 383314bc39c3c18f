// The logger registry: option schemas and builders.
#include "tessera/loggers/options.h"

#include "tessera/loggers/loggers.h"
#include "tessera/loggers/tensorboard.h"
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
    r->add_foundry_names({"wandb", "mlflow", "file", "inmemory", "comet_ml", "neptune", "slack", "mosaicml",
                          "remote_uploader_downloader", "progress_bar", "console"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::loggers
