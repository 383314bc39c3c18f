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
    r->add_foundry_names({"wandb", "tensorboard", "mlflow", "file", "inmemory", "comet_ml", "neptune", "slack",
                          "mosaicml", "remote_uploader_downloader", "progress_bar", "console"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::loggers
