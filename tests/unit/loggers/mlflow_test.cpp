// The `mlflow` logger against a stand-in server (fake_mlflow_server.h): a password written into the tracking URI is
// used (basic authentication) but never shown, and a local artifact location that the server chooses is written only
// inside the folder the user named. (tests/compat/test_mlflow.py runs the real server.)
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "fake_mlflow_server.h"
#include "log_capture.h"
#include "tessera/distributed/launcher.h"
#include "tessera/loggers/mlflow.h"
#include "tessera/util/file_io.h"
#include "test_util.h"

namespace tessera::loggers::mlflow_test {
namespace {

namespace fs = std::filesystem;
using tessera::testing::error_of;
using tessera::testing::FakeMlflowServer;
using tessera::testing::LogCapture;

// The MLFLOW_* variables that would change what the logger does, unset for the test.
void clear_mlflow_environment() {
  for (const char* name :
       {"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "RUN_NAME"}) {
    ::unsetenv(name);
  }
}

// Every file under `dir`, relative path -> bytes.
std::map<std::string, std::string> files_under(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = util::read_file(e.path().string());
  }
  return out;
}

TEST(Mlflow, APasswordInTheTrackingUriAuthenticatesButNoMessageShowsIt) {
  clear_mlflow_environment();
  // No server: the transport error names the URL without the password.
  const int closed = dist::free_local_port();
  MlflowClient nowhere(fmt::format("http://alice:hunter2@127.0.0.1:{}", closed), /*attempts=*/1);
  EXPECT_EQ(nowhere.shown_uri(), fmt::format("http://***@127.0.0.1:{}", closed));
  std::string e = error_of([&] { nowhere.call("GET", "experiments/get-by-name", {{"experiment_name", "x"}}); });
  EXPECT_NE(e.find(fmt::format("GET http://***@127.0.0.1:{}/api/2.0/mlflow/experiments/get-by-name?", closed)),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("hunter2"), std::string::npos) << e;
  // Not an HTTP server: refused naming the URI, without the password.
  e = error_of([] { MlflowClient("ftp://alice:hunter2@files.internal/mlruns"); });
  EXPECT_NE(e.find("tracking_uri 'ftp://***@files.internal/mlruns'"), std::string::npos) << e;
  EXPECT_EQ(e.find("hunter2"), std::string::npos) << e;

  // A server: the password goes to it as basic authentication; an HTTP error names the URL without it.
  FakeMlflowServer server;
  MlflowClient client(fmt::format("http://alice:hunter2@127.0.0.1:{}", server.port()), 1);
  e = error_of([&] { client.call("GET", "registered-models/get", {{"name", "m"}}); });
  EXPECT_NE(e.find(fmt::format("http://***@127.0.0.1:{}/api/2.0/mlflow/registered-models/get", server.port())),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("HTTP 404 RESOURCE_DOES_NOT_EXIST"), std::string::npos) << e;
  EXPECT_EQ(e.find("hunter2"), std::string::npos) << e;
  ASSERT_EQ(server.requests().size(), 1U);
  EXPECT_EQ(server.requests()[0].header("Authorization"), "Basic YWxpY2U6aHVudGVyMg==");  // base64("alice:hunter2")

  // The logger's own lines show the redacted URI.
  LogCapture log;
  MlflowLoggerOptions o;
  o.tracking_uri = fmt::format("http://alice:hunter2@127.0.0.1:{}", server.port());
  o.experiment_name = "e";
  MlflowLogger logger(o, core::RunContext{"run", 0, 1});
  logger.log_metrics({{"loss", 1.0}}, 0);
  spdlog::default_logger()->flush();
  EXPECT_NE(log.text().find(fmt::format("in experiment 1 at http://***@127.0.0.1:{}", server.port())),
            std::string::npos)
      << log.text();
  EXPECT_EQ(log.text().find("hunter2"), std::string::npos) << log.text();
}

TEST(Mlflow, ALocalArtifactLocationMustLieInsideTheLocalArtifactRoot) {
  const std::string server = "http://***@mlflow:5000";
  // No root: refused, naming the run, the location and the option.
  std::string e = error_of([&] { local_artifact_folder("file:///srv/mlruns/1/abc/artifacts", "", "abc", server); });
  EXPECT_NE(e.find("[mlflow] run abc's artifact location file:///srv/mlruns/1/abc/artifacts is a local folder that "
                   "the tracking server at http://***@mlflow:5000 chose"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("loggers.mlflow.local_artifact_root"), std::string::npos) << e;
  // Inside the root (file:// or a bare path; the root itself is "."), in the folder's relative form.
  EXPECT_EQ(local_artifact_folder("file:///srv/mlruns/1/abc/artifacts", "/srv/mlruns", "abc", server),
            fs::path("1/abc/artifacts"));
  EXPECT_EQ(local_artifact_folder("/srv/mlruns/2/x/artifacts/", "/srv/mlruns/", "x", server),
            fs::path("2/x/artifacts"));
  EXPECT_EQ(local_artifact_folder("file:///srv/mlruns", "/srv/mlruns", "x", server), fs::path("."));
  // Outside it: "..", a sibling with the root's name as a prefix, another folder, a relative path (file://host/path).
  for (const char* outside : {"file:///srv/mlruns/../../home/u/.ssh", "file:///srv/mlruns-other/1", "/etc",
                              "file://srv/mlruns/1", "relative/1"}) {
    e = error_of([&] { local_artifact_folder(outside, "/srv/mlruns", "abc", server); });
    EXPECT_NE(e.find("is not inside loggers.mlflow.local_artifact_root /srv/mlruns: refusing to write there"),
              std::string::npos)
        << outside << ": " << e;
  }
}

TEST(Mlflow, LogModelWritesALocalArtifactLocationOnlyInsideTheRoot) {
  clear_mlflow_environment();
  const util::TempFolder tmp("mlflow_test");
  const fs::path model = fs::path(tmp.path) / "model";
  fs::create_directories(model);
  std::ofstream(model / "config.json") << R"({"architectures": ["MPTForCausalLM"], "torch_dtype": "float32"})";
  std::ofstream(model / "model.safetensors") << "weights";
  const fs::path outside = fs::path(tmp.path) / "outside";
  const fs::path root = fs::path(tmp.path) / "mlruns";
  fs::create_directories(outside);
  fs::create_directories(root);
  auto log_model = [&](const std::string& artifact_uri, const std::string& local_root) {
    FakeMlflowServer server(artifact_uri);
    MlflowLoggerOptions o;
    o.tracking_uri = fmt::format("http://127.0.0.1:{}", server.port());
    o.experiment_name = "e";
    o.local_artifact_root = local_root;
    MlflowLogger logger(o, core::RunContext{"run", 0, 1});
    return error_of([&] { logger.log_model(model.string(), "final_model_checkpoint", "", "{}"); });
  };
  // The server points the run at a folder of its choosing: nothing is written there, with or without a root.
  const std::string evil = "file://" + (outside / "artifacts").string();
  std::string e = log_model(evil, "");
  EXPECT_NE(e.find("run run1's artifact location " + evil + " is a local folder that the tracking server"),
            std::string::npos)
      << e;
  e = log_model(evil, root.string());
  EXPECT_NE(e.find("is not inside loggers.mlflow.local_artifact_root " + root.string()), std::string::npos) << e;
  // A symbolic link inside the root that leads out of it is not followed.
  fs::create_directory_symlink(outside, root / "link");
  e = log_model("file://" + (root / "link" / "artifacts").string(), root.string());
  EXPECT_NE(e.find("through a symbolic link"), std::string::npos) << e;
  EXPECT_TRUE(files_under(outside).empty());
  // Inside the root: the model is written there.
  e = log_model("file://" + (root / "1" / "run1" / "artifacts").string(), root.string());
  EXPECT_EQ(e, "(no error)");
  const auto written = files_under(root / "1" / "run1" / "artifacts");
  EXPECT_EQ(written.at("final_model_checkpoint/model/model.safetensors"), "weights");
  EXPECT_TRUE(written.count("final_model_checkpoint/MLmodel"));
  EXPECT_TRUE(files_under(outside).empty());
}

}  // namespace
}  // namespace tessera::loggers::mlflow_test
