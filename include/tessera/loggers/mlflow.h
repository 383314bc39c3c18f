// `mlflow` (Composer's MLFlowLogger) over MLflow's REST API (/api/2.0/mlflow/...), without Python: an experiment
// found or created by name, a run created (or, with `resume`, the run tagged with this run name found again), the
// resolved recipe as params, metrics sent in batches, and the run's status at the end. What it sends is described in
// docs/training.md#mlflow.
//
//   MlflowClient c("http://127.0.0.1:5000");
//   nlohmann::json r = c.call("GET", "experiments/get-by-name", {{"experiment_name", "x"}});
//
// Not thread-safe. Errors (tessera::Error, component "mlflow") name the tracking URI (its user-info hidden), the
// endpoint and MLflow's own error_code and message.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/callback.h"
#include "tessera/core/model_registry.h"
#include "tessera/loggers/options.h"

namespace tessera::loggers {

// One MLflow tracking server. Authentication as MLflow's clients do: MLFLOW_TRACKING_TOKEN (a bearer token), else
// MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (basic). Requests that fail to connect or get 429 / 5xx are
// retried (`attempts` in all, backing off from 0.5 s).
class MlflowClient {
 public:
  explicit MlflowClient(std::string tracking_uri, int attempts = 4);
  // `method` GET (body as the query string) or POST (body as JSON) to /api/2.0/mlflow/<endpoint>; the response body.
  // A 404 with RESOURCE_DOES_NOT_EXIST returns null when `missing_ok`.
  nlohmann::json call(const std::string& method, const std::string& endpoint, const nlohmann::json& body,
                      bool missing_ok = false);
  // The tracking URI as messages show it: user-info ("http://user:password@host") hidden.
  const std::string& shown_uri() const { return shown_uri_; }
  // PUT `bytes` to the tracking server's artifact proxy (/api/2.0/mlflow-artifacts/artifacts/<path>), as MLflow's
  // clients upload to a `mlflow-artifacts:` artifact URI.
  void put_artifact(const std::string& path, const std::string& bytes);

 private:
  std::string uri_;
  std::string shown_uri_;
  int attempts_;
};

// Hyperparameters as MLflow params: nested keys joined with '.', lists as JSON, scalars as Python prints them
// (True, None, 0.001). Values longer than MLflow's 6000 characters are cut there (with a warning naming the key).
std::vector<std::pair<std::string, std::string>> mlflow_params(const nlohmann::json& hparams);

// Where log_model writes a run whose artifact URI (from the tracking server `server`, for messages) is a local folder
// (file:///path or /path): that folder relative to `local_artifact_root` (loggers.mlflow.local_artifact_root; "."
// for the root itself). The server chooses the folder, so it is written only inside the root the user named: throws
// tessera::Error naming the run and the URI when the root is unset or the folder is outside it.
std::filesystem::path local_artifact_folder(const std::string& artifact_uri, const std::string& local_artifact_root,
                                            const std::string& run_id, const std::string& server);

// The server a logger with these options talks to: tracking_uri, else MLFLOW_TRACKING_URI (empty when neither).
std::string mlflow_tracking_uri(const MlflowLoggerOptions& options);

class MlflowLogger : public core::LoggerDestination, public core::ModelRegistry {
 public:
  // Connects at construction: the experiment is found or created here, so that a wrong URI or a server that is down
  // fails the run before training starts.
  MlflowLogger(MlflowLoggerOptions options, const core::RunContext& run);
  std::string name() const override { return "MLFlowLogger"; }
  void log_metrics(const core::Metrics& metrics, int64_t step) override;
  void log_hyperparameters(const nlohmann::json& hparams) override;
  void run_event(core::Event event, core::State& state, core::Logger& logger) override;
  void close(core::State& state, core::Logger& logger) override;
  // As mlflow.transformers.log_model + registration do for LLM Foundry: the folder as a `transformers` flavor model
  // under the run's `artifact_path` (MLmodel, model/, components/tokenizer/), then a new version of the registered
  // model whose source is that artifact path. The run's artifact URI must be `mlflow-artifacts:` (a tracking server
  // that serves artifacts, `mlflow server`'s default) or a local folder inside `local_artifact_root`
  // (local_artifact_folder).
  std::string log_model(const std::string& folder, const std::string& artifact_path,
                        const std::string& registered_model_name, const std::string& logging_config_json) override;

  const std::string& experiment_id() const { return experiment_id_; }
  const std::string& run_id() const { return run_id_; }

 private:
  void start_run();
  void flush();
  void send(nlohmann::json batch);

  MlflowLoggerOptions o_;
  core::RunContext run_;
  MlflowClient client_;
  std::string experiment_id_;
  std::string run_id_;
  bool existing_run_ = false;  // the run was there before this process (resume, MLFLOW_RUN_ID): it may hold params
  // The last fit or standalone evaluation started reached its end: the run finished (else it failed or stopped).
  bool finished_ = false;
  std::map<std::string, std::pair<double, int64_t>> last_;  // metric -> (value, step) last sent
  nlohmann::json pending_ = nlohmann::json::array();        // metrics not sent yet
  std::chrono::steady_clock::time_point last_flush_;
  int64_t dropped_ = 0;  // metrics given up after the retries
};

}  // namespace tessera::loggers
