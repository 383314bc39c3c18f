// Every test process gets its own temporary directory (TMPDIR), so that tests which ctest runs in parallel (one
// process per test) never share the fixed-name scratch directories they create under temp_directory_path().
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

class ProcessTmpdir : public ::testing::Environment {
 public:
  void SetUp() override {  // before the first test; listing the tests creates nothing
    const char* base = std::getenv("TMPDIR");
    dir_ = std::filesystem::path(base != nullptr && *base != '\0' ? base : "/tmp") /
           ("tessera_tests_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::filesystem::path dir_;
};

::testing::Environment* const kProcessTmpdir = ::testing::AddGlobalTestEnvironment(new ProcessTmpdir);

TEST(ProcessTmpdir, TempDirectoryIsPrivateToThisProcess) {
  EXPECT_NE(std::filesystem::temp_directory_path().string().find("tessera_tests_" + std::to_string(getpid())),
            std::string::npos);
}

}  // namespace
