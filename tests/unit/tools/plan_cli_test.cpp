// The `plan` command: a plan printed and written as JSON, and the exit code and message for a mistake in its files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;

using Result = ::tessera::testing::CommandResult;

Result run_plan(const std::string& args) {
  return ::tessera::testing::run_command((fs::path(::tessera::testing::train_bin()).parent_path() / "plan").string() +
                                         " " + args);
}

TEST(PlanCli, PlansAGridAndWritesItAsJson) {
  const std::string data = std::string(::tessera::testing::source_dir()) + "/tests/data/planner";
  const fs::path out = fs::temp_directory_path() / "plan.json";
  const Result r = run_plan("--jobs " + data + "/grid-12-jobs.yaml --cluster " + data + "/h100-8.yaml " +
                            "--time-limit 2 --json " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Cluster: 1 node x 8 H100"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mpt-13b-lr1e-4-b64"), std::string::npos);
  EXPECT_NE(r.output.find("greedy largest first"), std::string::npos);
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["plan"]["placements"].size(), 12u);
  ASSERT_EQ(j["baselines"].size(), 3u);
  const double plan = j["plan"]["makespan_s"].get<double>();
  for (const auto& b : j["baselines"]) EXPECT_LE(plan, b["makespan_s"].get<double>() * (1 + 1e-9)) << b["policy"];
  EXPECT_GE(plan, j["solver"]["lower_bound_s"].get<double>());
  for (const auto& p : j["plan"]["placements"]) {
    EXPECT_LE(p["devices"].size(), 8u);
    EXPECT_LT(p["start_s"].get<double>(), p["end_s"].get<double>());
  }
}

TEST(PlanCli, AMistakeInAFileNamesItAndExitsWithTwo) {
  const fs::path dir = fs::temp_directory_path() / "plan_cli";
  fs::create_directories(dir);
  std::ofstream(dir / "cluster.yaml") << "devices_per_node: 8\ndevice: {peak_tflops: 989, memory_gib: 80}\n"
                                         "inter_node: {bandwith_gbps: 50}\n";
  std::ofstream(dir / "jobs.yaml") << "jobs:\n  - {recipe: " << ::tessera::testing::source_dir()
                                   << "/recipes/mpt-1b.yaml}\n";
  const Result r = run_plan("--jobs " + (dir / "jobs.yaml").string() + " --cluster " + (dir / "cluster.yaml").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("inter_node.bandwith_gbps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cluster.yaml"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
