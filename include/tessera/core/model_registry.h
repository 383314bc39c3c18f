// A logger destination that keeps models as well as metrics (MLflow's artifacts and model registry). hf_checkpointer
// hands it the final Hugging Face folder when `mlflow_registered_model_name` is set, as LLM Foundry's
// HuggingFaceCheckpointer hands its folder to Composer's MLFlowLogger.
#pragma once

#include <string>

namespace tessera::core {

class ModelRegistry {
 public:
  virtual ~ModelRegistry() = default;
  // Uploads `folder` (a complete Hugging Face folder: config.json, weights, tokenizer files) as the run's artifacts
  // under `artifact_path` and registers it as a new version of `registered_model_name`. `logging_config_json` is
  // hf_checkpointer's mlflow_logging_config as JSON ({"task": ..., "metadata": {...}}). Returns what it did, for the
  // log. Throws tessera::Error naming the server and what failed.
  virtual std::string log_model(const std::string& folder, const std::string& artifact_path,
                                const std::string& registered_model_name, const std::string& logging_config_json) = 0;
};

}  // namespace tessera::core
