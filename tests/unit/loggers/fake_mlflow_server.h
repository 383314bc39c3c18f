// A stand-in for an MLflow tracking server on loopback, for tests of what the `mlflow` logger sends: it answers the
// REST calls the logger makes (experiments/get-by-name, runs/create, runs/log-batch, runs/get, runs/update, artifact
// PUTs, the model registry) with fixed answers and records every request (loopback_http.h serves them).
// tests/compat/test_mlflow.py tests against the real server.
#pragma once

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "loopback_http.h"

namespace tessera::testing {

class FakeMlflowServer : public LoopbackHttpServer {
 public:
  // `artifact_uri`: what runs/get says the run's artifact location is.
  explicit FakeMlflowServer(std::string artifact_uri = "mlflow-artifacts:/1/run1/artifacts")
      : LoopbackHttpServer(
            [artifact_uri = std::move(artifact_uri)](const Request& r) { return answer(r, artifact_uri); }) {}

 private:
  static Response answer(const Request& r, const std::string& artifact_uri) {
    int status = 200;
    nlohmann::json json = nlohmann::json::object();
    if (r.target.find("experiments/get-by-name") != std::string::npos) {
      json = {{"experiment", {{"experiment_id", "1"}}}};
    } else if (r.target.find("runs/create") != std::string::npos) {
      json = {{"run", {{"info", {{"run_id", "run1"}}}}}};
    } else if (r.target.find("runs/get") != std::string::npos) {
      json = {{"run",
               {{"info", {{"run_id", "run1"}, {"artifact_uri", artifact_uri}}}, {"data", nlohmann::json::object()}}}};
    } else if (r.target.find("registered-models/get") != std::string::npos) {
      status = 404;
      json = {{"error_code", "RESOURCE_DOES_NOT_EXIST"}, {"message", "no such model"}};
    } else if (r.target.find("model-versions/create") != std::string::npos) {
      json = {{"model_version", {{"version", "1"}}}};
    }
    return {status, "application/json", json.dump(), {}};
  }
};

}  // namespace tessera::testing
