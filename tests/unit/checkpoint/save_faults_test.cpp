// Kills and failures at every step of a checkpoint save (issue 20 item 5): a FileEnv wrapper (util/file_env.h)
// fails one file operation of the save, or kills the process there with SIGKILL; afterwards autoresume finds only
// complete checkpoints, and the resumed run ends bitwise equal to an uninterrupted one.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/file_env.h"
#include "tessera/util/file_io.h"
#include "test_util.h"
#include "tiny_data.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The save under test: the one at batch 4 (of saves at 2, 4 and 6), from its first file operation until the save at
// batch 6 (the last) begins. Consecutive calls of one operation on one path (the chunks of a write) are one step.
constexpr const char* kSaveUnderTest = "-ba4";
constexpr const char* kNextSave = "-ba6";
constexpr const char* kStepEnv = "TESSERA_TEST_KILL_AT_STEP";
constexpr const char* kRootEnv = "TESSERA_TEST_SAVE_FAULTS_ROOT";  // the parent's directory, for the kill worker

// A path as a step names it: its file name, without the per-writer suffix of a temporary file (".tmp.<pid>.<n>").
std::string short_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  const size_t tmp = name.find(".tmp.");
  return tmp == std::string::npos ? name : name.substr(0, tmp + 4);
}

// Counts the steps of the save under test; at step `at` fails the operation (errno EIO) or kills the process.
class FaultyFiles : public util::FileEnv {
 public:
  enum class Mode { kRecord, kFail, kKill };
  FaultyFiles(Mode mode, int at) : mode_(mode), at_(at) {}

  int open(const std::string& path, int flags, mode_t mode) override {
    return step("open", path) ? -1 : FileEnv::open(path, flags, mode);
  }
  ssize_t write(int fd, const void* data, size_t n, const std::string& path) override {
    return step("write", path) ? -1 : FileEnv::write(fd, data, n, path);
  }
  int fsync(int fd, const std::string& path) override { return step("fsync", path) ? -1 : FileEnv::fsync(fd, path); }
  int close(int fd, const std::string& path) override {
    if (step("close", path)) {
      FileEnv::close(fd, path);  // the descriptor goes either way, as with a close that reports a deferred error
      errno = EIO;
      return -1;
    }
    return FileEnv::close(fd, path);
  }
  int rename(const std::string& from, const std::string& to) override {
    return step("rename", from, to) ? -1 : FileEnv::rename(from, to);
  }
  int unlink(const std::string& path) override { return step("unlink", path) ? -1 : FileEnv::unlink(path); }
  int mkdir(const std::string& path, mode_t mode) override {
    return step("mkdir", path) ? -1 : FileEnv::mkdir(path, mode);
  }
  int create_directories(const std::string& path) override {
    return step("create_directories", path) ? -1 : FileEnv::create_directories(path);
  }
  int remove_all(const std::string& path) override { return step("remove_all", path) ? -1 : FileEnv::remove_all(path); }
  int symlink(const std::string& target, const std::string& link) override {
    return step("symlink", link, target) ? -1 : FileEnv::symlink(target, link);
  }

  std::vector<std::string> steps() const {
    const std::lock_guard lock(mu_);
    return steps_;
  }
  bool fired() const {
    const std::lock_guard lock(mu_);
    return fired_;
  }

 private:
  // Whether this call fails (errno set); kills the process at the chosen step.
  bool step(const char* op, const std::string& path, const std::string& to = "") {
    const std::lock_guard lock(mu_);
    if ((path + to).find(kNextSave) != std::string::npos) done_ = true;
    if (!counting_ && !done_ && (path + to).find(kSaveUnderTest) != std::string::npos) counting_ = true;
    if (!counting_ || done_) return false;
    const std::string what = std::string(op) + " " + short_name(path) +
                             (to.empty() ? "" : " -> " + (to.find('/') == std::string::npos ? to : short_name(to)));
    if (what == last_) return false;  // the same step goes on
    last_ = what;
    steps_.push_back(what);
    if (static_cast<int>(steps_.size()) != at_ || mode_ == Mode::kRecord) return false;
    fired_ = true;
    if (mode_ == Mode::kKill) ::kill(::getpid(), SIGKILL);
    errno = EIO;
    return true;
  }

  Mode mode_;
  int at_;
  mutable std::mutex mu_;
  bool counting_ = false, done_ = false, fired_ = false;
  std::string last_;
  std::vector<std::string> steps_;
};

// Installs a FileEnv for the scope.
struct ScopedFileEnv {
  explicit ScopedFileEnv(util::FileEnv* env) { util::set_file_env(env); }
  ~ScopedFileEnv() { util::set_file_env(nullptr); }
  ScopedFileEnv(const ScopedFileEnv&) = delete;
  ScopedFileEnv& operator=(const ScopedFileEnv&) = delete;
};

fs::path root() {
  static const fs::path dir = [] {
    if (const char* parent = std::getenv(kRootEnv)) return fs::path(parent);  // a kill worker: the parent's data
    const fs::path d = fs::temp_directory_path() / "tessera_save_faults";
    fs::remove_all(d);
    testing::write_token_split(d / "data" / "train", 24, 1);
    testing::write_token_split(d / "data" / "val", 10, 2);
    return d;
  }();
  return dir;
}

fs::path folder_of(const std::string& run) {
  return root() / "runs" / run;
}

// 6 batches, 3 per epoch, dropout and a schedule over the whole run; a checkpoint every 2 batches.
trainer::TrainConfig config(const std::string& run, bool autoresume) {
  return testing::tiny_train_config(
      root() / "data", "device_train_microbatch_size: 4\ndevice_eval_batch_size: 4\nsave_interval: 2ba\n",
      {"run_name=" + run, "save_folder=" + folder_of(run).string(), "max_duration=6ba", "eval_interval=0",
       "deterministic_mode=true", "model.resid_pdrop=0.1", "scheduler.name=cosine_with_warmup",
       "scheduler.t_warmup=2ba", autoresume ? "autoresume=true" : "autoresume=false"});
}

std::vector<at::Tensor> train_to_the_end(const std::string& run, bool autoresume) {
  trainer::Trainer t(config(run, autoresume));
  t.fit();
  EXPECT_EQ(t.state().timestamp.batch, 6) << run;
  std::vector<at::Tensor> out;
  for (const auto& p : t.state().model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Every checkpoint autoresume could pick is complete: each listed one validates, and so does `latest`'s target.
void expect_only_complete_checkpoints(const std::string& run, const std::string& what) {
  const fs::path folder = folder_of(run);
  const std::vector<std::string> listed = checkpoint::list_checkpoints(folder.string());
  EXPECT_FALSE(listed.empty()) << what << ": the checkpoint at batch 2 is gone";
  for (const std::string& dir : listed) EXPECT_EQ(checkpoint::validate_checkpoint(dir), "") << what;
  if (fs::is_symlink(folder / "latest")) {
    const fs::path target = folder / fs::read_symlink(folder / "latest");
    if (fs::exists(target)) {
      EXPECT_EQ(checkpoint::validate_checkpoint(target.string()), "") << what;
    }
  }
}

// The kill worker: trains the run named by the parent with the kill armed at the given step; it dies there.
TEST(SaveFaultsWorker, TrainAndDieAtTheStep) {
  const char* at = std::getenv(kStepEnv);
  if (at == nullptr) GTEST_SKIP() << "a worker of SaveFaults.AKillAtEveryStepOfASaveResumesBitwise";
  FaultyFiles env(FaultyFiles::Mode::kKill, std::atoi(at));
  const ScopedFileEnv installed(&env);
  train_to_the_end(std::string("kill_") + at, false);
  ADD_FAILURE() << "the save had no step " << at;
}

class SaveFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::getenv(kStepEnv) != nullptr) return;
    expected_ = new std::vector<at::Tensor>(train_to_the_end("whole", false));
    FaultyFiles recorder(FaultyFiles::Mode::kRecord, 0);
    {
      const ScopedFileEnv installed(&recorder);
      train_to_the_end("recorded", false);
    }
    steps_ = new std::vector<std::string>(recorder.steps());
  }
  static void TearDownTestSuite() {
    delete expected_;
    delete steps_;
    expected_ = nullptr;
    steps_ = nullptr;
  }
  void SetUp() override {
    if (std::getenv(kStepEnv) != nullptr) GTEST_SKIP() << "in a kill worker";
  }

  // Resumes `run` with autoresume and expects the uninterrupted run's weights, bit for bit.
  static void expect_resumes_bitwise(const std::string& run, const std::string& what) {
    expect_only_complete_checkpoints(run, what);
    const std::vector<at::Tensor> got = train_to_the_end(run, true);
    ASSERT_EQ(got.size(), expected_->size()) << what;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], (*expected_)[i])) << what << ", tensor " << i;
    expect_only_complete_checkpoints(run, what + ", after the resumed run");
  }

  static std::vector<at::Tensor>* expected_;
  static std::vector<std::string>* steps_;
};
std::vector<at::Tensor>* SaveFaults::expected_ = nullptr;
std::vector<std::string>* SaveFaults::steps_ = nullptr;

TEST_F(SaveFaults, TheSaveHasAWriteFsyncRenamePublishSequence) {
  std::string all;
  for (const std::string& s : *steps_) all += s + "\n";
  // The rank file, its receipt and metadata.json are each written to a temporary name, fsynced and renamed; the
  // directory is renamed into place and `latest` replaced by a renamed symlink, each followed by a directory fsync.
  for (const char* want :
       {"mkdir .tmp-ep1-ba4\nopen rank0.safetensors.tmp\nwrite rank0.safetensors.tmp\nfsync rank0.safetensors.tmp\n"
        "close rank0.safetensors.tmp\nrename rank0.safetensors.tmp -> rank0.safetensors\n",
        "rename metadata.json.tmp -> metadata.json\nunlink rank0.receipt.json\nopen .tmp-ep1-ba4\nfsync .tmp-ep1-ba4\n"
        "close .tmp-ep1-ba4\nrename .tmp-ep1-ba4 -> ep1-ba4\n",
        "symlink .tmp-latest -> ep1-ba4\nrename .tmp-latest -> latest\n"}) {
    EXPECT_NE(all.find(want), std::string::npos) << want << " in\n" << all;
  }
  EXPECT_GE(steps_->size(), 25u) << all;
  std::printf("the save at batch 4: %zu steps\n", steps_->size());
}

TEST_F(SaveFaults, AFailureAtEveryStepOfASaveStopsTheRunAndResumesBitwise) {
  for (size_t k = 1; k <= steps_->size(); ++k) {
    const std::string run = "fail_" + std::to_string(k), what = "failing " + (*steps_)[k - 1];
    fs::remove_all(folder_of(run));
    FaultyFiles env(FaultyFiles::Mode::kFail, static_cast<int>(k));
    {
      const ScopedFileEnv installed(&env);
      std::optional<std::string> error;
      try {
        trainer::Trainer t(config(run, false));
        t.fit();
      } catch (const std::exception& e) {
        error = e.what();
      }
      ASSERT_TRUE(env.fired()) << what;
      // A failed step the save needs stops the run with an error naming the folder. Two kinds can fail without that:
      // removing a leftover (a receipt or temporary that a failed removal merely leaves behind, ignored on load), and
      // closing a directory's descriptor after its fsync succeeded (the entries are durable; a directory has no
      // buffered data for close to report).
      const std::string& op = (*steps_)[k - 1];
      const bool is_file = op.find(".safetensors") != std::string::npos || op.find(".json") != std::string::npos;
      const bool can_do_without =
          op.rfind("unlink ", 0) == 0 || op.rfind("remove_all ", 0) == 0 || (op.rfind("close ", 0) == 0 && !is_file);
      if (!can_do_without) {
        ASSERT_TRUE(error.has_value()) << what << ": the run went on after a failed step of its save";
      }
      if (error) {
        EXPECT_NE(error->find(folder_of(run).string()), std::string::npos) << what << ": " << *error;
      }
    }
    expect_resumes_bitwise(run, what);
  }
}

TEST_F(SaveFaults, AKillAtEveryStepOfASaveResumesBitwise) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (size_t k = 1; k <= steps_->size(); ++k) {
    const std::string run = "kill_" + std::to_string(k), what = "killed at " + (*steps_)[k - 1];
    fs::remove_all(folder_of(run));
    // The worker's environment: ours with the step, without gtest's sharding (the worker runs its one test).
    std::vector<std::string> env = {std::string(kStepEnv) + "=" + std::to_string(k),
                                    std::string(kRootEnv) + "=" + root().string()};
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string(*e).rfind("GTEST_", 0) != 0) env.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=SaveFaultsWorker.TrainAndDieAtTheStep";
    std::vector<char*> argv = {const_cast<char*>(self.c_str()), filter.data(), nullptr};
    const std::string log = (root() / (run + ".log")).string();
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execve(self.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << what << ": the worker was not killed\n"
                                                                    << util::read_file(log);
    expect_resumes_bitwise(run, what);
  }
}

}  // namespace
}  // namespace tessera
