// Logger option schemas.
#include "tessera/loggers/options.h"

namespace tessera::loggers {

config::ComponentRegistry& logger_registry() {
  static config::ComponentRegistry* registry = [] {
    auto* r = new config::ComponentRegistry("logger");
    r->add("jsonl", [](config::Section& s) -> std::any {
      JsonlLoggerOptions o;
      o.filename = s.get_string("filename", o.filename);
      s.check(!o.filename.empty(), "filename", "must not be empty");
      s.finish();
      return o;
    });
    r->add("tensorboard", [](config::Section& s) -> std::any {
      TensorBoardLoggerOptions o;
      o.log_dir = s.get_string("log_dir", o.log_dir);
      s.check(!o.log_dir.empty(), "log_dir", "must not be empty");
      o.flush_interval = s.get_int("flush_interval", o.flush_interval);
      s.check(o.flush_interval > 0, "flush_interval", "must be a positive number of batches");
      o.rank_zero_only = s.get_bool("rank_zero_only", o.rank_zero_only);
      s.finish();
      return o;
    });
    r->add_foundry_names({"wandb", "mlflow", "file", "inmemory", "comet_ml", "neptune", "slack", "mosaicml",
                          "remote_uploader_downloader", "progress_bar", "console"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::loggers
