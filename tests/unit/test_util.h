// Helpers shared by the unit tests.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/util/error.h"

namespace tessera::testing {

// Where the build put the source tree and the `train` binary (test_paths.cpp: the one translation unit that holds
// these paths, so that the other test files compile to the same objects in any checkout and a fresh clone's build
// takes them from ccache).
const char* built_source_dir();
const char* built_train_bin();

// The source tree and the `train` binary the tests use: where the build put them, unless the environment names
// others (TESSERA_SOURCE_DIR, TESSERA_TRAIN_BIN), as tools/gpu_check.sh does for the unpacked GPU kit.
inline const char* source_dir() {
  const char* env = std::getenv("TESSERA_SOURCE_DIR");
  return env != nullptr && *env != 0 ? env : built_source_dir();
}
inline const char* train_bin() {
  const char* env = std::getenv("TESSERA_TRAIN_BIN");
  return env != nullptr && *env != 0 ? env : built_train_bin();
}

// How many times longer than on an idle machine with an uninstrumented build a test allows real processes to take:
// the one knob for every grace, window and upper time bound in the tests (docs/testing.md#flakes). It is
// TESSERA_TEST_TIME_SCALE (default 1), times 3 in a sanitizer build (ASan's and TSan's processes start, run and exit
// slower; ASan's leak check runs at every exit), times the machine's load per core (the 1-minute load average over the
// cores online) when that is above 1, at most 4x. Read once per process. Only upper bounds scale: a test that checks
// that something did not happen too early keeps its bound.
inline double time_scale() {
  static const double scale = [] {
    double s = 1;
    if (const char* env = std::getenv("TESSERA_TEST_TIME_SCALE"); env != nullptr && *env != 0) {
      s = std::max(1.0, std::atof(env));
    }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    s *= 3;
#endif
    double load = 0;
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf", &load) != 1) load = 0;
      std::fclose(f);
    }
    const double cores = static_cast<double>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    s *= std::clamp(load / cores, 1.0, 4.0);
    return s;
  }();
  return scale;
}

// Sets or unsets environment variables and puts back what they were when it goes, the last change undone first.
// `const ScopedEnv home("HOME", dir)` for one variable (std::nullopt unsets it), or `ScopedEnv env;` then
// env.set()/env.unset() for several, as a test goes. Not thread-safe (setenv is not).
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ScopedEnv(const std::string& name, const std::optional<std::string>& value) { set(name, value); }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void set(const std::string& name, const std::optional<std::string>& value) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  void unset(const std::string& name) { set(name, std::nullopt); }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;  // name, value before
};

// A shell command's exit code (-1 when a signal ended it) and its output, stdout and stderr together.
struct CommandResult {
  int exit_code;
  std::string output;
};
inline CommandResult run_command(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The what() of the tessera::Error that `f` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// What a test of every shipped recipe needs on a machine without the models the fine-tuning recipes start from: a
// Hugging Face hub cache (HF_HUB_CACHE, set for this process and the tools it runs) with the published config.json
// of those hub models (tests/data/hub_configs/org--name.json), and, for sft-tiny-cpu, an override pointing its
// model at a folder shaped like the main job's export. Returns the overrides for `recipe`.
inline std::vector<std::string> shipped_recipe_overrides(const std::filesystem::path& recipe) {
  namespace fs = std::filesystem;
  static const fs::path root = [] {
    const fs::path r = fs::temp_directory_path() / "tessera_hub_cache";
    const std::string rev(40, '0');
    for (const auto& e : fs::directory_iterator(fs::path(source_dir()) / "tests" / "data" / "hub_configs")) {
      const std::string stem = e.path().stem().string();
      const fs::path model = r / ("models--" + stem);
      const fs::path dir = stem == "main-job-export" ? r / stem : model / "snapshots" / rev;
      fs::create_directories(dir);
      fs::copy_file(e.path(), dir / "config.json", fs::copy_options::overwrite_existing);
      if (stem != "main-job-export") {
        fs::create_directories(model / "refs");
        std::ofstream(model / "refs" / "main") << rev;
      }
    }
    setenv("HF_HUB_CACHE", r.c_str(), 1);
    return r;
  }();
  if (recipe.stem() == "sft-tiny-cpu") return {"variables.model_path=" + (root / "main-job-export").string()};
  return {};
}

}  // namespace tessera::testing
