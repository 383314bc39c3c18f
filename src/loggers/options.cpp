// Logger option schemas.
#include "tessera/loggers/options.h"

namespace tessera::loggers {

config::ComponentRegistry& logger_registry() {
  static config::ComponentRegistry* registry = [] {
    auto* r = new config::ComponentRegistry("logger");
    r->add_foundry_names({"wandb", "tensorboard", "mlflow", "file", "inmemory", "comet_ml", "neptune", "slack",
                          "mosaicml", "remote_uploader_downloader", "progress_bar", "console"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::loggers
