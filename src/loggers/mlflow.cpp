// Composer's MLFlowLogger over MLflow's REST API (JSON over util/http.h).
#include "tessera/loggers/mlflow.h"

#include <fmt/format.h>
#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>
#include <utility>

#include "tessera/core/state.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/http.h"
#include "tessera/util/python_json.h"
#include "tessera/util/redact.h"
#include "tessera/util/safe_path.h"

namespace tessera::loggers {
namespace {

constexpr const char* kMlflow = "mlflow";
constexpr size_t kMaxParamValue = 6000;  // MLflow's MAX_PARAM_VAL_LENGTH
constexpr size_t kParamsPerBatch = 100;  // log-batch limits
constexpr size_t kMetricsPerBatch = 1000;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using Response = util::HttpResponse;

// One exchange with MLflow's clients' authentication (MLFLOW_TRACKING_TOKEN as a bearer token, else
// MLFLOW_TRACKING_USERNAME / _PASSWORD), retried on connection failures, 429 and 5xx (`attempts` in all, backing off
// from 0.5 s).
Response exchange(util::HttpRequest req, int attempts) {
  const std::string token = env_or("MLFLOW_TRACKING_TOKEN", "");
  if (!token.empty()) {
    req.headers.emplace_back("Authorization", "Bearer " + token);
  } else {
    req.basic_user = env_or("MLFLOW_TRACKING_USERNAME", "");
    req.basic_password = env_or("MLFLOW_TRACKING_PASSWORD", "");
  }
  Response r;
  double wait = 0.5;
  for (int attempt = 1;; ++attempt) {
    r = util::http_request(req);
    const bool transient = !r.transport_error.empty() || r.status == 429 || r.status >= 500;
    if (!transient || attempt >= attempts) return r;
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    wait *= 2;
  }
}

std::string query_string(const nlohmann::json& body) {
  std::string q;
  for (const auto& [k, v] : body.items()) {
    q += (q.empty() ? "?" : "&") + k + "=" + util::url_encode(v.is_string() ? v.get<std::string>() : v.dump());
  }
  return q;
}

// Python's str() of a JSON scalar, as MLflow's log_params stringifies values.
std::string python_str(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_number_float()) return util::python_float_repr(v.get<double>());
  return v.dump();
}

void flatten(const nlohmann::json& v, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (v.is_object() && !v.empty()) {
    for (const auto& [k, child] : v.items()) flatten(child, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  out.emplace_back(prefix, v.is_array() || v.is_object() ? v.dump() : python_str(v));
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const std::string& p : patterns) {
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// A metric value as MLflow's JSON API takes it (protobuf's JSON mapping spells the non-finite doubles).
nlohmann::json metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

nlohmann::json tag_list(const std::map<std::string, std::string>& tags) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [k, v] : tags) out.push_back({{"key", k}, {"value", v}});
  return out;
}

}  // namespace

// ---- MlflowClient
// -----------------------------------------------------------------------------------------------------

MlflowClient::MlflowClient(std::string tracking_uri, int attempts)
    : uri_(std::move(tracking_uri)), attempts_(attempts) {
  while (!uri_.empty() && uri_.back() == '/') uri_.pop_back();
  shown_uri_ = util::redact_uri(uri_);
  if (uri_.rfind("http://", 0) != 0 && uri_.rfind("https://", 0) != 0) {
    throw ConfigError(kMlflow, fmt::format("tracking_uri '{}': Tessera talks to an MLflow tracking server over HTTP "
                                           "(http://host:port or https://...); file stores and 'databricks' are not "
                                           "supported (set MLFLOW_TRACKING_URI or loggers.mlflow.tracking_uri)",
                                           shown_uri_));
  }
}

nlohmann::json MlflowClient::call(const std::string& method, const std::string& endpoint, const nlohmann::json& body,
                                  bool missing_ok) {
  const std::string url = uri_ + "/api/2.0/mlflow/" + endpoint + (method == "GET" ? query_string(body) : std::string());
  util::HttpRequest req;
  req.method = method;
  req.url = url;
  if (method != "GET") req.body = body.dump();
  req.headers.emplace_back("Content-Type", "application/json");
  const Response r = exchange(std::move(req), attempts_);
  // Messages show the URL without the tracking URI's user-info (a password written into it).
  if (!r.transport_error.empty()) {
    throw Error(kMlflow, util::redact_uri(
                             fmt::format("{} {}: {} (after {} attempts)", method, url, r.transport_error, attempts_)));
  }
  nlohmann::json parsed = nlohmann::json::parse(r.body, nullptr, false);
  if (r.status / 100 == 2) return parsed.is_discarded() ? nlohmann::json::object() : parsed;
  const std::string code = parsed.is_object() ? parsed.value("error_code", "") : "";
  if (missing_ok && r.status == 404 && code == "RESOURCE_DOES_NOT_EXIST") return nullptr;
  const std::string message = parsed.is_object() ? parsed.value("message", r.body) : r.body;
  throw Error(kMlflow, util::redact_uri(fmt::format("{} {}: HTTP {}{}: {}", method, url, r.status,
                                                    code.empty() ? "" : " " + code, message.substr(0, 2000))));
}

void MlflowClient::put_artifact(const std::string& path, const std::string& bytes) {
  const std::string url = uri_ + "/api/2.0/mlflow-artifacts/artifacts/" + path;
  util::HttpRequest req;
  req.method = "PUT";
  req.url = url;
  req.body = bytes;
  req.timeout_s = 3600;
  req.headers.emplace_back("Content-Type", "application/octet-stream");
  const Response r = exchange(std::move(req), attempts_);
  if (!r.transport_error.empty() || r.status / 100 != 2) {
    throw Error(kMlflow, util::redact_uri(fmt::format("PUT {}: {}", url,
                                                      r.transport_error.empty()
                                                          ? fmt::format("HTTP {}: {}", r.status, r.body.substr(0, 2000))
                                                          : r.transport_error)));
  }
}

std::vector<std::pair<std::string, std::string>> mlflow_params(const nlohmann::json& hparams) {
  std::vector<std::pair<std::string, std::string>> out;
  flatten(hparams, "", out);
  for (auto& [key, value] : out) {
    if (value.size() > kMaxParamValue) {
      spdlog::warn("mlflow: param {} is {} characters long; MLflow keeps {}, so it is cut there", key, value.size(),
                   kMaxParamValue);
      value.resize(kMaxParamValue);
    }
  }
  return out;
}

// ---- MlflowLogger
// -----------------------------------------------------------------------------------------------------

std::string mlflow_tracking_uri(const MlflowLoggerOptions& options) {
  return options.tracking_uri.empty() ? env_or("MLFLOW_TRACKING_URI", "") : options.tracking_uri;
}

MlflowLogger::MlflowLogger(MlflowLoggerOptions options, const core::RunContext& run)
    : o_(std::move(options)),
      run_(run),
      client_(mlflow_tracking_uri(o_)),
      last_flush_(std::chrono::steady_clock::now()) {
  if (o_.experiment_name.empty()) o_.experiment_name = env_or("MLFLOW_EXPERIMENT_NAME", "my-mlflow-experiment");
  experiment_id_ = env_or("MLFLOW_EXPERIMENT_ID", "");
  if (experiment_id_.empty()) {
    const nlohmann::json found =
        client_.call("GET", "experiments/get-by-name", {{"experiment_name", o_.experiment_name}}, true);
    if (!found.is_null()) {
      experiment_id_ = found.at("experiment").at("experiment_id").get<std::string>();
    } else {
      experiment_id_ = client_.call("POST", "experiments/create", {{"name", o_.experiment_name}})
                           .at("experiment_id")
                           .get<std::string>();
    }
  }
}

void MlflowLogger::start_run() {
  if (!run_id_.empty()) return;
  // Composer tags the run with the trainer's run name (RUN_NAME wins), which is what `resume` looks for.
  const std::string composer_run = env_or("RUN_NAME", run_.run_name);
  std::string name = o_.run_name.empty() ? run_.run_name : o_.run_name;
  if (!o_.rank_zero_only) name += fmt::format("-rank{}", run_.rank);
  std::map<std::string, std::string> tags = o_.tags;
  tags["run_name"] = composer_run;
  if (!o_.run_group.empty()) tags["run_group"] = o_.run_group;
  run_id_ = env_or("MLFLOW_RUN_ID", "");
  existing_run_ = !run_id_.empty();
  if (run_id_.empty() && o_.resume) {
    const nlohmann::json found = client_.call("POST", "runs/search",
                                              {{"experiment_ids", {experiment_id_}},
                                               {"filter", fmt::format("tags.run_name = \"{}\"", composer_run)},
                                               {"max_results", 1}});
    if (found.contains("runs") && !found["runs"].empty()) {
      run_id_ = found["runs"][0].at("info").at("run_id").get<std::string>();
      existing_run_ = true;
      client_.call("POST", "runs/update", {{"run_id", run_id_}, {"status", "RUNNING"}});
      spdlog::info("mlflow: resuming run {} ({}) in experiment {}", run_id_, name, experiment_id_);
    }
  }
  if (run_id_.empty()) {
    run_id_ = client_
                  .call("POST", "runs/create",
                        {{"experiment_id", experiment_id_},
                         {"run_name", name},
                         {"start_time", now_ms()},
                         {"tags", tag_list(tags)}})
                  .at("run")
                  .at("info")
                  .at("run_id")
                  .get<std::string>();
    spdlog::info("mlflow: run {} ({}) in experiment {} at {}", run_id_, name, experiment_id_, client_.shown_uri());
  } else {
    client_.call("POST", "runs/log-batch", {{"run_id", run_id_}, {"tags", tag_list(tags)}});
  }
}

void MlflowLogger::log_hyperparameters(const nlohmann::json& hparams) {
  start_run();
  nlohmann::json kept = nlohmann::json::object();
  for (const auto& [k, v] : hparams.items()) {
    if (!matches_any(k, o_.ignore_hyperparameters)) kept[k] = v;
  }
  // A resumed run keeps the params it has (MLflow refuses to change one); new keys are added.
  std::map<std::string, std::string> existing;
  if (existing_run_) {
    const nlohmann::json got = client_.call("GET", "runs/get", {{"run_id", run_id_}});
    if (got.contains("run") && got["run"].contains("data") && got["run"]["data"].contains("params")) {
      for (const auto& p : got["run"]["data"]["params"]) existing[p.at("key")] = p.at("value");
    }
  }
  nlohmann::json params = nlohmann::json::array();
  for (const auto& [k, v] : mlflow_params(kept)) {
    if (existing.count(k)) continue;
    params.push_back({{"key", k}, {"value", v}});
    if (params.size() == kParamsPerBatch) {
      client_.call("POST", "runs/log-batch", {{"run_id", run_id_}, {"params", params}});
      params = nlohmann::json::array();
    }
  }
  if (!params.empty()) client_.call("POST", "runs/log-batch", {{"run_id", run_id_}, {"params", params}});
}

void MlflowLogger::log_metrics(const core::Metrics& metrics, int64_t step) {
  start_run();
  const int64_t t = now_ms();
  for (const auto& [k, v] : metrics) {
    if (matches_any(k, o_.ignore_metrics)) continue;
    // As Composer: an unchanged value is sent again only every log_duplicated_metric_every_n_steps steps.
    auto it = last_.find(k);
    if (it != last_.end() && it->second.first == v &&
        step < it->second.second + o_.log_duplicated_metric_every_n_steps) {
      continue;
    }
    last_[k] = {v, step};
    auto renamed = o_.rename_metrics.find(k);
    const std::string& key = renamed == o_.rename_metrics.end() ? k : renamed->second;
    pending_.push_back({{"key", key}, {"value", metric_value(v)}, {"timestamp", t}, {"step", step}});
  }
  if (o_.synchronous) flush();
}

void MlflowLogger::send(nlohmann::json batch) {
  const size_t n = batch.size();
  try {
    client_.call("POST", "runs/log-batch", {{"run_id", run_id_}, {"metrics", std::move(batch)}});
  } catch (const Error& e) {
    // The server was unreachable through every retry: training goes on; what could not be sent is counted.
    dropped_ += static_cast<int64_t>(n);
    spdlog::warn("mlflow: {} metric values not logged: {}", n, e.what());
  }
}

void MlflowLogger::flush() {
  last_flush_ = std::chrono::steady_clock::now();
  if (pending_.empty() || run_id_.empty()) return;
  nlohmann::json batch = nlohmann::json::array();
  for (auto& m : pending_) {
    batch.push_back(std::move(m));
    if (batch.size() == kMetricsPerBatch) {
      send(std::move(batch));
      batch = nlohmann::json::array();
    }
  }
  if (!batch.empty()) send(std::move(batch));
  pending_ = nlohmann::json::array();
}

void MlflowLogger::run_event(core::Event event, core::State& state, core::Logger& /*logger*/) {
  if (event == core::Event::kInit) {
    if (!state.run_name.empty()) run_.run_name = state.run_name;
    start_run();
    return;
  }
  if (event == core::Event::kFitStart || event == core::Event::kEvalStandaloneStart) finished_ = false;
  if (event == core::Event::kFitEnd || event == core::Event::kEvalStandaloneEnd) finished_ = true;
  const bool due =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush_).count() >= o_.flush_interval;
  if ((event == core::Event::kBatchEnd && due) || event == core::Event::kEvalEnd || event == core::Event::kFitEnd ||
      event == core::Event::kEvalStandaloneEnd) {
    flush();
  }
}

namespace {

// A Hugging Face tokenizer's files: mlflow's transformers flavor keeps them under components/tokenizer/.
bool is_tokenizer_file(const std::string& name) {
  static const std::set<std::string> kNames = {
      "tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
      "tokenizer.model", "added_tokens.json",     "chat_template.jinja",     "vocab.txt"};
  return kNames.count(name) > 0;
}

std::string yaml_quoted(const std::string& s) {
  return nlohmann::json(s).dump();  // a JSON string is a YAML double-quoted scalar
}

}  // namespace

std::filesystem::path local_artifact_folder(const std::string& artifact_uri, const std::string& local_artifact_root,
                                            const std::string& run_id, const std::string& server) {
  namespace fs = std::filesystem;
  auto normal = [](std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return fs::path(p).lexically_normal();
  };
  const fs::path folder = normal(artifact_uri.rfind("file://", 0) == 0 ? artifact_uri.substr(7) : artifact_uri);
  if (local_artifact_root.empty()) {
    throw Error(kMlflow, fmt::format("run {}'s artifact location {} is a local folder that the tracking server at {} "
                                     "chose; Tessera writes into a local folder only under "
                                     "loggers.mlflow.local_artifact_root (set it to the server's artifact root, on a "
                                     "file system this machine shares), or use a server that proxies artifacts "
                                     "(mlflow-artifacts:, `mlflow server`'s default)",
                                     run_id, util::redact_uri(artifact_uri), server));
  }
  const fs::path root = normal(local_artifact_root);
  const fs::path rel = folder.lexically_relative(root);
  if (!folder.is_absolute() || !root.is_absolute() || rel.empty() || *rel.begin() == "..") {
    throw Error(kMlflow, fmt::format("run {}'s artifact location {}, which the tracking server at {} chose, is not "
                                     "inside loggers.mlflow.local_artifact_root {}: refusing to write there",
                                     run_id, util::redact_uri(artifact_uri), server, local_artifact_root));
  }
  return rel;
}

std::string MlflowLogger::log_model(const std::string& folder, const std::string& artifact_path,
                                    const std::string& registered_model_name, const std::string& logging_config_json) {
  namespace fs = std::filesystem;
  start_run();
  flush();
  const nlohmann::json logging = nlohmann::json::parse(logging_config_json);
  const nlohmann::json run = client_.call("GET", "runs/get", {{"run_id", run_id_}});
  const std::string artifact_uri = run.at("run").at("info").at("artifact_uri").get<std::string>();
  // Where the files go: through the server's artifact proxy, or straight into a local artifact folder.
  std::function<void(const std::string&, const std::string&)> put;
  if (artifact_uri.rfind("mlflow-artifacts:", 0) == 0) {
    std::string base = artifact_uri.substr(std::string("mlflow-artifacts:").size());
    const size_t scheme_end = base.rfind("//", 0) == 0 ? base.find('/', 2) : 0;  // mlflow-artifacts://host:port/...
    base = base.substr(scheme_end == std::string::npos ? base.size() : scheme_end);
    while (!base.empty() && base.front() == '/') base.erase(0, 1);
    put = [this, base](const std::string& rel, const std::string& bytes) {
      client_.put_artifact(base + "/" + rel, bytes);
    };
  } else if (artifact_uri.rfind("file://", 0) == 0 || artifact_uri.rfind('/', 0) == 0) {
    // A local folder: the server chose it, so it is written only inside the folder the user named for it.
    const fs::path base = local_artifact_folder(artifact_uri, o_.local_artifact_root, run_id_, client_.shown_uri());
    const fs::path root = o_.local_artifact_root;
    put = [root, base, artifact_uri](const std::string& rel, const std::string& bytes) {
      const std::string name = base == "." ? rel : base.generic_string() + "/" + rel;
      const fs::path path = util::confined_path(root, name, artifact_uri, kMlflow, "artifact path");
      fs::create_directories(path.parent_path());
      util::write_file_atomically(path.string(), bytes, kMlflow);
    };
  } else {
    throw Error(kMlflow, fmt::format("run {}'s artifact URI {} is neither the tracking server's artifact proxy "
                                     "(mlflow-artifacts:, `mlflow server`'s default) nor a local folder: Tessera "
                                     "cannot upload the model there",
                                     run_id_, util::redact_uri(artifact_uri)));
  }
  const nlohmann::json config =
      nlohmann::json::parse(util::read_file((fs::path(folder) / "config.json").string(), kMlflow));
  bool has_tokenizer = false;
  std::string tokenizer_type = "PreTrainedTokenizerFast";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(folder)) {
    if (!e.is_regular_file()) continue;
    files.push_back(e.path());
    if (is_tokenizer_file(e.path().filename().string())) has_tokenizer = true;
  }
  std::sort(files.begin(), files.end());
  if (fs::exists(fs::path(folder) / "tokenizer_config.json")) {
    const nlohmann::json tc = nlohmann::json::parse(
        util::read_file((fs::path(folder) / "tokenizer_config.json").string(), kMlflow), nullptr, false);
    if (tc.is_object() && tc.contains("tokenizer_class") && tc["tokenizer_class"].is_string()) {
      tokenizer_type = tc["tokenizer_class"].get<std::string>();
    }
  }
  uint64_t bytes_sent = 0;
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    const std::string rel = artifact_path + (is_tokenizer_file(name) ? "/components/tokenizer/" : "/model/") + name;
    const std::string bytes = util::read_file(f.string(), kMlflow);
    bytes_sent += bytes.size();
    put(rel, bytes);
  }
  // MLmodel: the transformers flavor as mlflow.transformers.log_model writes it for a text-generation checkpoint, with
  // LLM Foundry's logging config (task llm/v1/completions by default) as the model's metadata.
  nlohmann::json metadata = logging.value("metadata", nlohmann::json::object());
  if (!metadata.is_object()) metadata = nlohmann::json::object();
  metadata["task"] = logging.value("task", std::string("llm/v1/completions"));
  std::string dtype = config.value("torch_dtype", std::string("float32"));
  std::string mlmodel = fmt::format(
      "artifact_path: {}\nflavors:\n  python_function:\n    loader_module: mlflow.transformers\n"
      "  transformers:\n    code: null\n",
      yaml_quoted(artifact_path));
  mlmodel += has_tokenizer ? "    components:\n    - tokenizer\n" : "    components: []\n";
  mlmodel += "    framework: pt\n    instance_type: TextGenerationPipeline\n    model_binary: model\n";
  mlmodel += fmt::format("    pipeline_model_type: {}\n",
                         yaml_quoted(config.value("architectures", nlohmann::json::array({""}))[0].get<std::string>()));
  mlmodel +=
      fmt::format("    source_model_name: {}\n", yaml_quoted(metadata.value("pretrained_model_name", std::string(""))));
  mlmodel += "    task: text-generation\n";
  if (has_tokenizer) mlmodel += fmt::format("    tokenizer_type: {}\n", yaml_quoted(tokenizer_type));
  mlmodel += fmt::format("    torch_dtype: {}\n", yaml_quoted("torch." + dtype));
  mlmodel +=
      fmt::format("    transformers_version: {}\n", yaml_quoted(config.value("transformers_version", std::string(""))));
  mlmodel += fmt::format("metadata: {}\n", metadata.dump());
  mlmodel += fmt::format("run_id: {}\n", yaml_quoted(run_id_));
  put(artifact_path + "/MLmodel", mlmodel);

  std::string source = artifact_uri;
  while (!source.empty() && source.back() == '/') source.pop_back();
  source += "/" + artifact_path;
  std::string what = fmt::format("uploaded {} files ({} bytes) to run {} as {}", files.size() + 1, bytes_sent, run_id_,
                                 util::redact_uri(source));
  if (!registered_model_name.empty()) {
    const nlohmann::json existing =
        client_.call("GET", "registered-models/get", {{"name", registered_model_name}}, true);
    if (existing.is_null()) client_.call("POST", "registered-models/create", {{"name", registered_model_name}});
    const nlohmann::json version = client_.call("POST", "model-versions/create",
                                                {{"name", registered_model_name},
                                                 {"source", source},
                                                 {"run_id", run_id_},
                                                 {"tags", tag_list({{"task", metadata["task"].get<std::string>()}})}});
    what += fmt::format("; registered as {} version {}", registered_model_name,
                        version.at("model_version").at("version").get<std::string>());
  }
  return what;
}

void MlflowLogger::close(core::State& state, core::Logger& /*logger*/) {
  flush();
  if (run_id_.empty()) return;
  // FINISHED after a whole fit (or standalone evaluation); KILLED when the run stopped to be restarted (preemption, a
  // bad node); else FAILED.
  const char* status = finished_ ? "FINISHED" : state.preempted() ? "KILLED" : "FAILED";
  try {
    client_.call("POST", "runs/update", {{"run_id", run_id_}, {"status", status}, {"end_time", now_ms()}});
  } catch (const Error& e) {
    spdlog::warn("mlflow: could not mark run {} {}: {}", run_id_, status, e.what());
  }
  if (dropped_ > 0) spdlog::warn("mlflow: {} metric values could not be sent to {}", dropped_, client_.shown_uri());
}

}  // namespace tessera::loggers
