// Heartbeat records (the launcher watchdog's input): the file and its one-line format, scopes that restore the status,
// concurrent writers, and no file at all without TESSERA_HEARTBEAT_DIR.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessera/util/heartbeat.h"

namespace tessera::util {
namespace {

namespace fs = std::filesystem;

// Points the heartbeats at a fresh directory as rank `rank` for the scope of the test; afterwards they are off again
// (or as the environment had them).
class HeartbeatEnv {
 public:
  explicit HeartbeatEnv(const std::string& rank) {
    std::string tmpl = (fs::temp_directory_path() / "heartbeat_test_XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    save("TESSERA_HEARTBEAT_DIR", dir_.string());
    save("RANK", rank);
    detail::reload_heartbeat_env();
  }
  ~HeartbeatEnv() {
    for (const auto& [name, old] : saved_) {
      if (old) {
        ::setenv(name.c_str(), old->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
    detail::reload_heartbeat_env();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  HeartbeatEnv(const HeartbeatEnv&) = delete;
  HeartbeatEnv& operator=(const HeartbeatEnv&) = delete;
  const fs::path& dir() const { return dir_; }

 private:
  void save(const std::string& name, const std::string& value) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  fs::path dir_;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The status of a record "<time> <status>\n", after checking the format and that the time is now.
std::string status_in(const fs::path& p) {
  const std::string text = read_text(p);
  EXPECT_FALSE(text.empty()) << p;
  if (text.empty()) return "";
  EXPECT_EQ(text.find('\n'), text.size() - 1) << "one line: " << text;
  const size_t space = text.find(' ');
  EXPECT_NE(space, std::string::npos) << text;
  const double time = std::stod(text.substr(0, space));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(time, now, 5) << text;
  return text.substr(space + 1, text.size() - space - 2);
}

TEST(Heartbeat, WritesTheRecordAndScopesRestoreTheStatus) {
  const HeartbeatEnv env("3");
  const fs::path record = env.dir() / "rank3";
  heartbeat("batch 7");
  EXPECT_EQ(status_in(record), "batch 7");
  EXPECT_EQ(detail::heartbeat_status(), "batch 7");
  {
    const HeartbeatScope outer("all_reduce of 4096 Float elements");
    EXPECT_EQ(status_in(record), "waiting in all_reduce of 4096 Float elements");
    {
      const HeartbeatScope inner("barrier");
      EXPECT_EQ(status_in(record), "waiting in barrier");
    }
    EXPECT_EQ(status_in(record), "waiting in all_reduce of 4096 Float elements");
  }
  EXPECT_EQ(status_in(record), "batch 7");
  // A shorter line replaces a longer one whole; newlines cannot break the one-line format.
  heartbeat("two\nlines");
  EXPECT_EQ(status_in(record), "two lines");
  heartbeat(std::string(5000, 'x'));
  EXPECT_EQ(status_in(record), std::string(1000, 'x'));
  // Another heartbeat during a scope stands when the scope ends.
  heartbeat("batch 8");
  {
    const HeartbeatScope waiting("broadcast of 1 Float elements");
    heartbeat("batch 9");
  }
  EXPECT_EQ(status_in(record), "batch 9");
}

TEST(Heartbeat, AScopeWithNothingBeforeItLeavesRunning) {
  const HeartbeatEnv env("0");
  { const HeartbeatScope waiting("rendezvous with 2 ranks at 127.0.0.1:29500"); }
  EXPECT_EQ(status_in(env.dir() / "rank0"), "running");
}

TEST(Heartbeat, ThreadsWriteWholeLines) {
  const HeartbeatEnv env("1");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 500; ++i) {
        heartbeat("thread " + std::to_string(t) + " batch " + std::to_string(i));
        const HeartbeatScope waiting("all_gather of " + std::to_string(i) + " Float elements");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string status = status_in(env.dir() / "rank1");
  EXPECT_TRUE(status.rfind("thread ", 0) == 0 || status.rfind("waiting in all_gather of ", 0) == 0) << status;
}

TEST(Heartbeat, DoesNothingWithoutTheVariable) {
  const HeartbeatEnv env("0");  // restores the variable at the end
  ::unsetenv("TESSERA_HEARTBEAT_DIR");
  detail::reload_heartbeat_env();
  fs::remove(env.dir() / "rank0");  // opened while the variable was set
  heartbeat("batch 1");
  { const HeartbeatScope waiting("barrier"); }
  EXPECT_TRUE(fs::is_empty(env.dir()));
  EXPECT_EQ(detail::heartbeat_status(), "");
}

}  // namespace
}  // namespace tessera::util
