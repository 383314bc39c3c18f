// The sharded checkpoint format (pieces written by several ranks read back as any range, atomic publication,
// corruption detection and fallback) and checkpointing a training run (a resumed run ends bitwise identical to an
// uninterrupted one, rotation after a resume, overwrite protection, HF export and import, a failing disk). Untrusted
// inputs (issue 61): what a save folder, a metadata.json, a `latest` pointer or an object-store listing holds never
// makes Tessera delete, read or write anything outside the folder it belongs to.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "log_capture.h"
#include "loopback_http.h"
#include "models/mpt/mpt.h"
#include "tessera/algorithms/algorithms.h"
#include "tessera/callbacks/checkpoint_saver.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/error.h"
#include "test_util.h"
#include "tiny_data.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointReader;
using checkpoint::Piece;
using checkpoint::RankPayload;
using testing::LogCapture;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "tessera_checkpoint_test" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Writes a checkpoint as `world` ranks would (one after the other, in this process) and publishes it.
void write_checkpoint(const fs::path& folder, const std::string& name, int64_t batch,
                      const std::vector<RankPayload>& ranks,
                      std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const int world = static_cast<int>(ranks.size());
  std::vector<checkpoint::PendingCheckpoint> pending;
  for (int r = 0; r < world; ++r) pending.push_back(checkpoint::begin_checkpoint(folder.string(), name, r, timeout));
  for (int r = 0; r < world; ++r)
    checkpoint::write_rank_file(pending[static_cast<size_t>(r)], r, ranks[static_cast<size_t>(r)]);
  nlohmann::json meta = {{"timestamp", callbacks::timestamp_to_json(config::Timestamp{.batch = batch})}};
  checkpoint::publish_checkpoint(pending[0], meta, world, timeout, "latest");
}

// A [10, 7] tensor (values 0..69) split over 4 ranks at uneven boundaries, and a [5] tensor on rank 0 only.
std::vector<RankPayload> four_rank_payload(double offset = 0) {
  const at::Tensor w = at::arange(70, at::kFloat) + offset;
  const std::vector<int64_t> cuts = {0, 18, 36, 54, 70};
  std::vector<RankPayload> ranks(4);
  for (size_t r = 0; r < 4; ++r) {
    ranks[r].pieces.emplace_back(Piece{"model/w", {10, 7}, cuts[r], cuts[r + 1] - cuts[r]},
                                 w.narrow(0, cuts[r], cuts[r + 1] - cuts[r]).clone());
    ranks[r].local["rng/cpu"] = at::full({3}, static_cast<int64_t>(r), at::kByte);
  }
  ranks[0].pieces.emplace_back(Piece{"model/b", {5}, 0, 5}, at::ones({5}, at::kDouble));
  return ranks;
}

TEST(CheckpointFormat, PiecesWrittenByFourRanksReadBackAsAnyRange) {
  const fs::path folder = fresh_dir("pieces");
  write_checkpoint(folder, "ep0-ba3", 3, four_rank_payload());
  EXPECT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep0-ba3"));
  EXPECT_FALSE(fs::exists(folder / ".tmp-ep0-ba3"));
  CheckpointReader r((folder / "ep0-ba3").string());
  EXPECT_EQ(r.world_size(), 4);
  EXPECT_EQ(r.tensor_names("model/"), (std::vector<std::string>{"model/b", "model/w"}));
  EXPECT_EQ(r.shape("model/w"), (std::vector<int64_t>{10, 7}));
  EXPECT_TRUE(at::equal(r.read_full("model/w"), at::arange(70, at::kFloat).view({10, 7})));
  EXPECT_EQ(r.read_full("model/b").scalar_type(), at::kDouble);
  // A range across three ranks' pieces, converted to another dtype on the way.
  at::Tensor part = at::empty({30}, at::kDouble);
  r.read("model/w", 15, part);
  EXPECT_TRUE(at::equal(part, at::arange(15, 45, at::kDouble)));
  EXPECT_TRUE(at::equal(r.read_local(2, "rng/cpu"), at::full({3}, 2, at::kByte)));
  EXPECT_FALSE(r.read_local(7, "rng/cpu").defined());
  at::Tensor beyond = at::empty({10}, at::kFloat);
  EXPECT_NE(testing::error_of([&] { r.read("model/w", 65, beyond); }).find("model/w: elements [65, 75) are outside"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { r.read_full("model/nope"); }).find("has no tensor model/nope"), std::string::npos);
}

TEST(CheckpointFormat, AGapInThePiecesIsAnErrorNotZeros) {
  const fs::path folder = fresh_dir("gap");
  std::vector<RankPayload> ranks = four_rank_payload();
  ranks[2].pieces.clear();  // elements [36, 54) of model/w are nowhere
  write_checkpoint(folder, "ep0-ba1", 1, ranks);
  CheckpointReader r((folder / "ep0-ba1").string());
  at::Tensor head = at::empty({36}, at::kFloat);
  r.read("model/w", 0, head);  // fully covered
  EXPECT_NE(testing::error_of([&] { r.read_full("model/w"); }).find("its pieces cover 52 of the 70 elements"),
            std::string::npos);
}

TEST(CheckpointFormat, ColumnWindowsReadBackAsAnyRangeOrWindow) {
  // A [10, 7] matrix stored as tensor parallelism's row-parallel slices: columns [0, 3) and [3, 7), each window split
  // over two ranks at a boundary inside a row (elements [0, 13) and [13, 30) of the 10 x 3 window, row-major in it).
  const fs::path folder = fresh_dir("windows");
  const at::Tensor w = at::arange(70, at::kFloat).view({10, 7});
  std::vector<RankPayload> ranks(4);
  const std::vector<std::pair<int64_t, int64_t>> windows = {{0, 3}, {3, 4}};
  for (size_t k = 0; k < 2; ++k) {
    const auto [c0, cols] = windows[k];
    const at::Tensor sub = w.narrow(1, c0, cols).contiguous().view({-1});
    const int64_t cut = 13;
    ranks[2 * k].pieces.emplace_back(Piece{"model/w", {10, 7}, 0, cut, c0, cols}, sub.narrow(0, 0, cut).clone());
    ranks[2 * k + 1].pieces.emplace_back(Piece{"model/w", {10, 7}, cut, 10 * cols - cut, c0, cols},
                                         sub.narrow(0, cut, 10 * cols - cut).clone());
  }
  write_checkpoint(folder, "ep0-ba1", 1, ranks);
  CheckpointReader r((folder / "ep0-ba1").string());
  EXPECT_TRUE(at::equal(r.read_full("model/w"), w));
  at::Tensor part = at::empty({25}, at::kFloat);
  r.read("model/w", 20, part);  // rows 2..6, through both windows of each
  EXPECT_TRUE(at::equal(part, at::arange(20, 45, at::kFloat)));
  // Another mesh's window, [2, 5) of every row, from elements 4 on: through all four pieces.
  at::Tensor window = at::empty({20}, at::kFloat);
  r.read_window("model/w", 2, 3, 4, window);
  EXPECT_TRUE(at::equal(window, w.narrow(1, 2, 3).contiguous().view({-1}).narrow(0, 4, 20)));
  // The same window as stored: one piece's values.
  at::Tensor same = at::empty({17}, at::kFloat);
  r.read_window("model/w", 3, 4, 13, same);
  EXPECT_TRUE(at::equal(same, w.narrow(1, 3, 4).contiguous().view({-1}).narrow(0, 13, 17)));
  at::Tensor wide = at::empty({4}, at::kFloat);
  EXPECT_NE(testing::error_of([&] { r.read_window("model/w", 5, 3, 0, wide); }).find("are outside it"),
            std::string::npos);
}

void flip_byte(const fs::path& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x10));
}

TEST(CheckpointFormat, ACorruptOrTruncatedNewestCheckpointFallsBackToThePrevious) {
  const fs::path folder = fresh_dir("fallback");
  for (int b = 1; b <= 3; ++b) write_checkpoint(folder, fmt::format("ep0-ba{}", b), b, four_rank_payload(b));
  EXPECT_EQ(checkpoint::find_latest_valid_checkpoint(folder.string(), "latest"), (folder / "ep0-ba3").string());
  // A bit flip deep in rank 2's data: only the checksum can tell.
  const fs::path bad = folder / "ep0-ba3" / "rank2.safetensors";
  flip_byte(bad, static_cast<std::streamoff>(fs::file_size(bad)) - 5);
  EXPECT_NE(checkpoint::validate_checkpoint((folder / "ep0-ba3").string()).find(bad.string() + ": xxh64 checksum"),
            std::string::npos);
  EXPECT_EQ(checkpoint::find_latest_valid_checkpoint(folder.string(), "latest").value_or(""),
            (folder / "ep0-ba2").string());
  // Truncation of the next one.
  const fs::path cut = folder / "ep0-ba2" / "rank0.safetensors";
  fs::resize_file(cut, fs::file_size(cut) - 100);
  EXPECT_NE(checkpoint::validate_checkpoint((folder / "ep0-ba2").string()).find("(truncated?)"), std::string::npos);
  EXPECT_EQ(checkpoint::find_latest_valid_checkpoint(folder.string(), "latest"), (folder / "ep0-ba1").string());
  // A reader refuses the corrupt file by name too.
  CheckpointReader r((folder / "ep0-ba3").string());
  EXPECT_NE(testing::error_of([&] { r.read_full("model/w"); }).find(bad.string()), std::string::npos);
  // A directory without metadata.json (a save that never finished) is not a checkpoint at all.
  fs::create_directories(folder / "ep0-ba9");
  EXPECT_EQ(checkpoint::list_checkpoints(folder.string()).size(), 3u);
}

TEST(CheckpointFormat, PublishingWithoutEveryRanksFileFailsAndKeepsLatest) {
  const fs::path folder = fresh_dir("missing_rank");
  write_checkpoint(folder, "ep0-ba1", 1, four_rank_payload());
  const auto p = checkpoint::begin_checkpoint(folder.string(), "ep0-ba2", 0, std::chrono::seconds(1));
  checkpoint::write_rank_file(p, 0, four_rank_payload()[0]);
  const std::string err = testing::error_of([&] {
    checkpoint::publish_checkpoint(p, {{"timestamp", callbacks::timestamp_to_json({})}}, 2,
                                   std::chrono::milliseconds(300), "latest");
  });
  EXPECT_NE(err.find("rank 1 did not finish writing rank1.safetensors"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(folder / ".tmp-ep0-ba2"));
  EXPECT_FALSE(fs::exists(folder / "ep0-ba2"));
  EXPECT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep0-ba1"));
}

// A run ending on an error (CheckpointSaver::close before FIT_END) stops rank 0's wait for a rank whose file is missing
// (that rank may be dead): the save is abandoned at once, not after the timeout, and `latest` stays. A save whose files
// are all there is still published.
TEST(CheckpointFormat, PublishingStopsWaitingForAMissingRankOnceTheRunEnds) {
  const fs::path folder = fresh_dir("stopped_publish");
  write_checkpoint(folder, "ep0-ba1", 1, four_rank_payload());
  const auto p = checkpoint::begin_checkpoint(folder.string(), "ep0-ba2", 0, std::chrono::seconds(1));
  checkpoint::write_rank_file(p, 0, four_rank_payload()[0]);
  const nlohmann::json meta = {{"timestamp", callbacks::timestamp_to_json({})}};
  const auto timeout = std::chrono::seconds(300);
  std::atomic<bool> stop{false};
  std::string err;
  std::thread publisher(
      [&] { err = testing::error_of([&] { checkpoint::publish_checkpoint(p, meta, 2, timeout, "latest", &stop); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(fs::exists(folder / "ep0-ba2"));
  const auto stopped = std::chrono::steady_clock::now();
  stop = true;
  publisher.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  EXPECT_LT(waited, 10 * testing::time_scale()) << "the publisher kept waiting for the missing rank";
  EXPECT_NE(err.find("rank 1 had not finished writing rank1.safetensors when this run ended on an error; the save is "
                     "abandoned"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(folder / ".tmp-ep0-ba2"));
  EXPECT_FALSE(fs::exists(folder / "ep0-ba2"));
  EXPECT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep0-ba1"));

  RankPayload whole;
  whole.pieces.emplace_back(Piece{"model/w", {10, 7}, 0, 70}, at::arange(70, at::kFloat));
  const auto q = checkpoint::begin_checkpoint(folder.string(), "ep0-ba3", 0, std::chrono::seconds(1));
  checkpoint::write_rank_file(q, 0, whole);
  checkpoint::publish_checkpoint(q, meta, 1, timeout, "latest", &stop);  // stop is set: every file is there already
  EXPECT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep0-ba3"));
  EXPECT_TRUE(fs::exists(folder / "ep0-ba3" / "metadata.json"));
}

// ---- Checkpointing a training run ---------------------------------------------------------------------------------

fs::path checkpoint_dataset() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / "tessera_checkpoint_test" / "data";
    testing::write_token_split(d / "train", 24, 1);
    testing::write_token_split(d / "val", 10, 2);
    return d;
  }();
  return dir;
}

// Dropout (the RNG matters), EMA (an algorithm's state), a cosine schedule over the whole run, 3 batches per epoch.
trainer::TrainConfig run_config(const std::string& run, const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> o = {
      "run_name=" + run,         "save_folder=" + (checkpoint_dataset().parent_path() / "runs" / "{run_name}").string(),
      "max_duration=8ba",        "eval_interval=0",
      "deterministic_mode=true", "model.resid_pdrop=0.1",
      "model.emb_pdrop=0.1",     "scheduler.name=cosine_with_warmup",
      "scheduler.t_warmup=2ba"};
  o.insert(o.end(), overrides.begin(), overrides.end());
  return testing::tiny_train_config(checkpoint_dataset(),
                                    "device_train_microbatch_size: 4\ndevice_eval_batch_size: 4\n"
                                    "algorithms: {ema: {half_life: 3ba}}\nsave_interval: 2ba\n",
                                    o);
}

std::vector<at::Tensor> checkpoint_weights_of(trainer::Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.state().model->parameters()) out.push_back(p.detach().clone());
  for (const auto& a : t.state().algorithms) {
    if (auto ema = std::dynamic_pointer_cast<algorithms::Ema>(a)) {
      for (const auto& w : ema->weights()) out.push_back(w.clone());
    }
  }
  return out;
}

fs::path run_folder(const std::string& run) {
  return checkpoint_dataset().parent_path() / "runs" / run;
}

TEST(Checkpointing, AResumedRunEndsBitwiseIdenticalToAnUninterruptedOne) {
  fs::remove_all(run_folder("whole"));
  fs::remove_all(run_folder("resumed"));
  trainer::Trainer whole(run_config("whole"));
  whole.fit();
  const auto expected = checkpoint_weights_of(whole);
  {
    // Crash after batch 5 (mid-epoch: 3 batches per epoch); the newest checkpoint is ba4.
    trainer::Trainer first(run_config("resumed"),
                           {.algorithms = {}, .callbacks = {std::make_shared<testing::CrashAt>(5)}});
    first.fit();
    EXPECT_EQ(first.state().timestamp.batch, 5);
  }
  EXPECT_EQ(fs::read_symlink(run_folder("resumed") / "latest"), fs::path("ep1-ba4"));
  trainer::Trainer second(run_config("resumed", {"autoresume=true"}));
  EXPECT_EQ(second.state().timestamp.batch, 4);
  EXPECT_EQ(second.state().timestamp.batch_in_epoch, 1);
  EXPECT_EQ(second.state().timestamp.sample_in_epoch, 8);
  second.fit();
  EXPECT_EQ(second.state().timestamp.batch, 8);
  const auto got = checkpoint_weights_of(second);
  ASSERT_EQ(got.size(), expected.size());
  ASSERT_GT(got.size(), second.state().model->parameters().size()) << "EMA weights compared too";
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], expected[i])) << "tensor " << i;
  // The same run saved every 2 batches and at the end: ba2, ba4, ba6, ba8.
  EXPECT_EQ(checkpoint::list_checkpoints(run_folder("whole").string()).size(), 4u);
  const CheckpointReader last((run_folder("whole") / "ep2-ba8").string());
  EXPECT_EQ(last.metadata()["optimizer"]["step"], 8);
  EXPECT_EQ(last.metadata()["dataset"]["train"]["epoch"], 2);
  EXPECT_EQ(last.metadata()["sharding"]["strategy"], "NO_SHARD");  // one rank runs the engine as DDP
  EXPECT_EQ(last.metadata()["config"]["run_name"], "whole");
}

TEST(Checkpointing, SynchronousSavesWriteTheSameBytesAndResumeBitwise) {
  // save_async: false writes straight from the live tensors (no snapshot copy): the files must be byte for byte the
  // async saves', and a crash-and-resume must still end on the uninterrupted weights.
  for (const char* run : {"async_ref", "sync_whole", "sync_resumed"}) fs::remove_all(run_folder(run));
  trainer::Trainer async_ref(run_config("async_ref"));
  async_ref.fit();
  trainer::Trainer whole(run_config("sync_whole", {"save_async=false"}));
  whole.fit();
  const auto expected = checkpoint_weights_of(whole);
  const CheckpointReader a((run_folder("async_ref") / "ep1-ba4").string());
  const CheckpointReader b((run_folder("sync_whole") / "ep1-ba4").string());
  EXPECT_EQ(a.metadata()["files"][0]["xxh64"], b.metadata()["files"][0]["xxh64"]);
  {
    trainer::Trainer first(run_config("sync_resumed", {"save_async=false"}),
                           {.algorithms = {}, .callbacks = {std::make_shared<testing::CrashAt>(5)}});
    first.fit();
  }
  trainer::Trainer second(run_config("sync_resumed", {"save_async=false", "autoresume=true"}));
  EXPECT_EQ(second.state().timestamp.batch, 4);
  second.fit();
  const auto got = checkpoint_weights_of(second);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], expected[i])) << "tensor " << i;
}

TEST(Checkpointing, AutoresumeSkipsACorruptNewestCheckpointAndRefusesWhenNoneLoads) {
  fs::remove_all(run_folder("corrupt"));
  {
    trainer::Trainer t(run_config("corrupt", {"max_duration=6ba"}));
    t.fit();
  }
  const auto all = checkpoint::list_checkpoints(run_folder("corrupt").string());
  ASSERT_EQ(all.size(), 3u);  // ba2, ba4, ba6
  // A bit flip deep in the newest one's data: its load fails on the checksum and the one before is used, whole.
  const fs::path newest = fs::path(all[2]) / "rank0.safetensors";
  flip_byte(newest, static_cast<std::streamoff>(fs::file_size(newest)) - 5);
  trainer::Trainer resumed(run_config("corrupt", {"max_duration=6ba", "autoresume=true"}));
  EXPECT_EQ(resumed.state().timestamp.batch, 4);
  CheckpointReader ba4(all[1]);
  for (const auto& item : resumed.state().model->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value().cpu(), ba4.read_full("model/" + item.key()))) << item.key();
  }
  // Every checkpoint broken: an error listing them, never a fresh start over weights read from a broken one.
  for (size_t i = 0; i < 2; ++i) {
    const fs::path f = fs::path(all[i]) / "rank0.safetensors";
    flip_byte(f, static_cast<std::streamoff>(fs::file_size(f)) - 5);
  }
  const std::string err = testing::error_of([] {
    trainer::Trainer t(run_config("corrupt", {"max_duration=6ba", "autoresume=true"}));
  });
  EXPECT_NE(err.find("none of its 3 checkpoints could be loaded"), std::string::npos) << err;
}

TEST(Checkpointing, RotationKeepsTheNewestAlsoAfterAResume) {
  fs::remove_all(run_folder("rotate"));
  const std::vector<std::string> o = {"save_interval=1ba", "save_num_checkpoints_to_keep=2"};
  {
    std::vector<std::string> first = o;
    first.emplace_back("max_duration=3ba");
    trainer::Trainer t(run_config("rotate", first));
    t.fit();
  }
  std::vector<std::string> second = o;
  second.emplace_back("autoresume=true");
  second.emplace_back("max_duration=5ba");
  trainer::Trainer t(run_config("rotate", second));
  EXPECT_EQ(t.state().timestamp.batch, 3);
  t.fit();
  const auto left = checkpoint::list_checkpoints(run_folder("rotate").string());
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(fs::path(left[0]).filename(), "ep1-ba4");
  EXPECT_EQ(fs::path(left[1]).filename(), "ep1-ba5");
  EXPECT_EQ(fs::read_symlink(run_folder("rotate") / "latest"), fs::path("ep1-ba5"));
}

TEST(Checkpointing, AFolderWithLaterCheckpointsIsRefusedWithoutOverwrite) {
  fs::remove_all(run_folder("overwrite"));
  {
    trainer::Trainer t(run_config("overwrite", {"max_duration=2ba"}));
    t.fit();
  }
  trainer::Trainer again(run_config("overwrite", {"max_duration=2ba"}));
  const std::string err = testing::error_of([&] { again.fit(); });
  EXPECT_NE(err.find("already holds"), std::string::npos) << err;
  EXPECT_NE(err.find("save_overwrite: true"), std::string::npos) << err;
  trainer::Trainer allowed(run_config("overwrite", {"max_duration=2ba", "save_overwrite=true"}));
  allowed.fit();
}

TEST(Checkpointing, AMissingLoadPathIsAnErrorNamingIt) {
  const std::string err =
      testing::error_of([] { trainer::Trainer t(run_config("missing", {"load_path=/no/such/ckpt"})); });
  EXPECT_NE(err.find("/no/such/ckpt"), std::string::npos) << err;
}

TEST(Checkpointing, ExportToHuggingFaceAndLoadItBackAsWeights) {
  fs::remove_all(run_folder("export"));
  trainer::Trainer t(run_config("export", {"max_duration=3ba", "algorithms.ema.half_life=1000ba"}));
  t.fit();
  const fs::path hf = checkpoint_dataset().parent_path() / "export_hf";
  fs::remove_all(hf);
  checkpoint::export_checkpoint_to_hf((run_folder("export") / "ep0-ba3").string(), hf.string());
  std::shared_ptr<models::CausalLM> loaded = checkpoint::load_hf_model(hf.string());
  auto a = t.state().model->named_parameters();
  auto b = loaded->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) EXPECT_TRUE(at::equal(item.value().cpu(), b[item.key()].cpu())) << item.key();
  // The checkpoint read as a model directly (what `eval --model CHECKPOINT` does).
  std::shared_ptr<models::CausalLM> direct =
      checkpoint::load_checkpoint_model((run_folder("export") / "ep0-ba3").string());
  auto as_mpt = [](const std::shared_ptr<models::CausalLM>& m) {
    return std::dynamic_pointer_cast<models::MPTForCausalLMImpl>(m);
  };
  EXPECT_EQ(as_mpt(direct)->options().d_model, as_mpt(t.state().model)->options().d_model);
  auto e = direct->named_parameters();
  ASSERT_EQ(a.size(), e.size());
  for (const auto& item : a) EXPECT_TRUE(at::equal(item.value().cpu(), e[item.key()].cpu())) << item.key();
  // load_path accepts the HF folder: same weights, a fresh start.
  trainer::Trainer from_hf(run_config("from_hf", {"load_path=" + hf.string(), "save_overwrite=true"}));
  EXPECT_EQ(from_hf.state().timestamp.batch, 0);
  auto c = from_hf.state().model->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(at::equal(item.value().cpu(), c[item.key()].cpu())) << item.key();
  // load_weights_only from a Tessera checkpoint: the weights, but time starts over.
  trainer::Trainer weights(run_config("weights", {"load_path=" + (run_folder("export") / "ep0-ba3").string(),
                                                  "load_weights_only=true", "save_overwrite=true"}));
  EXPECT_EQ(weights.state().timestamp.batch, 0);
  EXPECT_EQ(weights.state().optimizer->steps(), 0);
  auto d = weights.state().model->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(at::equal(item.value().cpu(), d[item.key()].cpu())) << item.key();
}

// `train` in a shell whose file size limit (ulimit -f, 1 KiB blocks) makes a write fail with EFBIG: the next save
// after `batches` fails. SIGXFSZ is ignored (inherited through exec) so that the write returns the error.
int run_limited(const std::string& run, const std::string& overrides, int64_t limit_kib, std::string* output) {
  const fs::path log = checkpoint_dataset().parent_path() / (run + ".log");
  const fs::path recipe = checkpoint_dataset().parent_path() / (run + ".yaml");
  std::ofstream(recipe) << run_config(run).resolved.to_json().dump();
  const std::string cmd =
      fmt::format("sh -c \"trap '' XFSZ; ulimit -f {}; exec {} --recipe {} {}\" > {} 2>&1", limit_kib,
                  ::tessera::testing::train_bin(), recipe.string(), overrides, log.string());
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  *output = std::string(std::istreambuf_iterator<char>(in), {});
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

TEST(Checkpointing, AFailingDiskFailsTheSaveAndKeepsThePreviousCheckpoint) {
  fs::remove_all(run_folder("disk"));
  std::string out;
  ASSERT_EQ(run_limited("disk", "max_duration=4ba", 1 << 20, &out), 0) << out;
  const fs::path folder = run_folder("disk");
  ASSERT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep1-ba4"));
  const uint64_t size = fs::file_size(folder / "ep1-ba4" / "rank0.safetensors");
  // Resume and train 2 more batches with files limited to half a rank file: the save at ba6 cannot be written.
  const int rc = run_limited("disk", "max_duration=6ba autoresume=true", static_cast<int64_t>(size / 2048), &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("rank0.safetensors"), std::string::npos) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  EXPECT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep1-ba4"));
  EXPECT_FALSE(fs::exists(folder / "ep1-ba6"));
  EXPECT_FALSE(fs::exists(folder / ".tmp-ep1-ba6"));
  EXPECT_EQ(checkpoint::validate_checkpoint((folder / "ep1-ba4").string()), "");
  // The disk is fine again: the run resumes from ba4 and finishes.
  ASSERT_EQ(run_limited("disk", "max_duration=6ba autoresume=true", 1 << 20, &out), 0) << out;
  EXPECT_NE(out.find("resumed from " + (folder / "ep1-ba4").string()), std::string::npos) << out;
  EXPECT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep1-ba6"));
}

// ---- Loss spikes
// ------------------------------------------------------------------------------------------------------

// Multiplies the loss of batch `batch` (1-based) by `factor` before backward: a real spike, in loss and gradients.
class SpikeAt : public core::Algorithm {
 public:
  SpikeAt(int64_t batch, double factor) : batch_(batch), factor_(factor) {}
  std::string name() const override { return "SpikeAt"; }
  bool match(core::Event e, const core::State& s) const override {
    return e == core::Event::kAfterLoss && s.timestamp.batch + 1 == batch_;
  }
  void apply(core::Event /*e*/, core::State& s, core::Logger& /*l*/) override { s.loss = s.loss * factor_; }

 private:
  int64_t batch_;
  double factor_;
};

// The model's weights at the end of every batch (index 0: before training).
class WeightLog : public core::Callback {
 public:
  std::string name() const override { return "WeightLog"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (e != core::Event::kFitStart && e != core::Event::kBatchEnd) return;
    std::vector<at::Tensor> w;
    for (const auto& p : s.model->parameters()) w.push_back(p.detach().clone());
    at.push_back(std::move(w));
  }
  bool same(size_t a, size_t b) const {
    for (size_t i = 0; i < at[a].size(); ++i) {
      if (!at::equal(at[a][i], at[b][i])) return false;
    }
    return true;
  }
  std::vector<std::vector<at::Tensor>> at;
};

std::shared_ptr<WeightLog> spike_run(const std::string& run, const std::string& response, int64_t batch, double factor,
                                     int64_t* end_batch = nullptr) {
  fs::remove_all(run_folder(run));
  auto log = std::make_shared<WeightLog>();
  trainer::Trainer t(
      run_config(
          run, {"algorithms.loss_spike_detection.response=" + response, "algorithms.loss_spike_detection.min_history=2",
                "algorithms.loss_spike_detection.outlier_multiplier=3", "algorithms.loss_spike_detection.patience=2"}),
      {.algorithms = {std::make_shared<SpikeAt>(batch, factor)}, .callbacks = {log}});
  t.fit();
  if (end_batch != nullptr) *end_batch = t.state().timestamp.batch;
  return log;
}

TEST(LossSpikes, ANonFiniteLossSkipsTheStepAtOnce) {
  // patience 2 does not delay a NaN.
  const auto log = spike_run("spike_nan", "skip", 5, std::nan(""));
  ASSERT_EQ(log->at.size(), 9u);
  EXPECT_TRUE(log->same(5, 4)) << "batch 5's step was skipped";
  EXPECT_FALSE(log->same(6, 5)) << "training went on";
  for (const auto& t : log->at.back()) EXPECT_TRUE(at::isfinite(t).all().item<bool>());
}

TEST(LossSpikes, ASpikeOutlastingPatienceRollsBackToTheNewestCheckpoint) {
  // Batches 5 and 6 spike (x100 each: the model is knocked off course by batch 5's update, which patience lets
  // through): at batch 6 the model goes back to the checkpoint of batch 4.
  fs::remove_all(run_folder("spike_rollback"));
  auto log = std::make_shared<WeightLog>();
  trainer::Trainer t(
      run_config(
          "spike_rollback",
          {"algorithms.loss_spike_detection.response=rollback", "algorithms.loss_spike_detection.min_history=2",
           "algorithms.loss_spike_detection.outlier_multiplier=3", "algorithms.loss_spike_detection.patience=2"}),
      {.algorithms = {std::make_shared<SpikeAt>(5, 100.0), std::make_shared<SpikeAt>(6, 100.0)}, .callbacks = {log}});
  t.fit();
  ASSERT_EQ(log->at.size(), 9u);
  EXPECT_FALSE(log->same(5, 4)) << "the first spike is within patience";
  EXPECT_TRUE(log->same(6, 4)) << "rolled back to ep1-ba4";
  EXPECT_FALSE(log->same(7, 6)) << "training went on";
  EXPECT_EQ(t.state().timestamp.batch, 8);
}

TEST(LossSpikes, StopEndsTrainingWithoutTheSpikingStep) {
  int64_t end = 0;
  const auto log = spike_run("spike_stop", "stop", 5, 1e4, &end);
  // A single spike is within patience 2; a spike at 5 and 6 would stop. Here: one spike, so it trains on.
  EXPECT_EQ(end, 8);
  EXPECT_FALSE(log->same(5, 4));
  fs::remove_all(run_folder("spike_stop2"));
  auto log2 = std::make_shared<WeightLog>();
  trainer::Trainer t(run_config("spike_stop2", {"algorithms.loss_spike_detection.response=stop",
                                                "algorithms.loss_spike_detection.min_history=2",
                                                "algorithms.loss_spike_detection.patience=1"}),
                     {.algorithms = {std::make_shared<SpikeAt>(5, 1e4)}, .callbacks = {log2}});
  t.fit();
  EXPECT_EQ(t.state().timestamp.batch, 5);
  ASSERT_EQ(log2->at.size(), 6u);
  EXPECT_TRUE(log2->same(5, 4));
}

// ---- Untrusted inputs (issue 61) ----------------------------------------------------------------------------------

// Every entry under `root`: relative path -> a file's bytes, "<dir>", or "-> target" for a symlink. A test compares
// it before and after to show that nothing there was created, changed or deleted.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root)) {
    const std::string rel = fs::relative(e.path(), root).string();
    if (e.is_symlink()) {
      out[rel] = "-> " + fs::read_symlink(e.path()).string();
    } else if (e.is_directory()) {
      out[rel] = "<dir>";
    } else {
      std::ifstream in(e.path(), std::ios::binary);
      out[rel] = std::string(std::istreambuf_iterator<char>(in), {});
    }
  }
  return out;
}

// A folder beside a test's save folder, which nothing may touch.
fs::path make_decoy(const fs::path& at) {
  fs::create_directories(at / "sub");
  std::ofstream(at / "keep.txt") << "the decoy's own file";
  std::ofstream(at / "sub" / "notes.txt") << "more";
  return at;
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

nlohmann::json read_metadata_file(const fs::path& dir) {
  std::ifstream in(dir / "metadata.json");
  return nlohmann::json::parse(in);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// One rank's whole [4] tensor, filled with `value`.
std::vector<RankPayload> one_rank_payload(float value) {
  std::vector<RankPayload> ranks(1);
  ranks[0].pieces.emplace_back(Piece{"model/w", {4}, 0, 4}, at::full({4}, value, at::kFloat));
  return ranks;
}

std::vector<std::string> names_of(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  for (const std::string& d : dirs) out.push_back(fs::path(d).filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CheckpointFormat, OnlyFoldersWhoseMetadataCarriesTheFormatMarkerAreCheckpoints) {
  const fs::path root = fresh_dir("listing");
  const fs::path folder = root / "run";
  write_checkpoint(folder, "ep0-ba1", 1, one_rank_payload(1));
  // A user's folder holding a metadata.json of their own, one that does not parse, and a plain folder.
  write_text(folder / "my_notes" / "metadata.json", R"({"timestamp": {"batch": 0}, "files": []})");
  write_text(folder / "my_notes" / "results.csv", "step,loss\n1,2.5\n");
  write_text(folder / "broken" / "metadata.json", "{");
  fs::create_directories(folder / "plots");
  std::vector<std::string> others;
  EXPECT_EQ(names_of(checkpoint::list_checkpoints(folder.string(), &others)), std::vector<std::string>{"ep0-ba1"});
  EXPECT_EQ(names_of(others), (std::vector<std::string>{"broken", "my_notes", "plots"}));
  EXPECT_FALSE(checkpoint::is_checkpoint((folder / "my_notes").string()));
  EXPECT_TRUE(checkpoint::is_checkpoint((folder / "ep0-ba1").string()));
}

TEST(Checkpointing, RotationDeletesOnlyThisRunsCheckpointsNeverAUsersFolder) {
  // save_num_checkpoints_to_keep: 1 with save_overwrite: true once removed save_folder/my_notes (it held a
  // metadata.json). Now only Tessera checkpoints named by save_filename rotate; the rest is left alone, logged once.
  const fs::path folder = run_folder("keep_user");
  fs::remove_all(folder);
  const fs::path decoy = folder.parent_path() / "keep_user-decoy";
  fs::remove_all(decoy);
  make_decoy(decoy);
  {
    trainer::Trainer t(run_config("keep_user", {"max_duration=1ba", "save_interval=1ba"}));
    t.fit();
  }
  // A copy of a checkpoint the user keeps under another name, and their notes.
  fs::copy(folder / "ep0-ba1", folder / "best", fs::copy_options::recursive);
  write_text(folder / "my_notes" / "metadata.json", R"({"timestamp": {"batch": 0}, "files": []})");
  write_text(folder / "my_notes" / "results.csv", "step,loss\n1,2.5\n");
  const auto notes = snapshot(folder / "my_notes"), best = snapshot(folder / "best"), outside = snapshot(decoy);
  LogCapture log;
  {
    trainer::Trainer t(run_config("keep_user", {"max_duration=3ba", "save_interval=1ba",
                                                "save_num_checkpoints_to_keep=1", "save_overwrite=true"}));
    t.fit();
  }
  EXPECT_EQ(names_of(checkpoint::list_checkpoints(folder.string())), (std::vector<std::string>{"best", "ep0-ba3"}));
  EXPECT_EQ(snapshot(folder / "my_notes"), notes);
  EXPECT_EQ(snapshot(folder / "best"), best);
  EXPECT_EQ(snapshot(decoy), outside);
  const std::string text = log.text();
  EXPECT_EQ(count_of(text, (folder / "my_notes").string()), 1u) << text;
  EXPECT_EQ(count_of(text, (folder / "best").string()), 1u) << text;
  EXPECT_NE(text.find("save_filename \"ep{epoch}-ba{batch}\""), std::string::npos) << text;
}

TEST(Checkpointing, ACheckpointMovedAsideByACrashedReSaveIsRestoredNotDeleted) {
  // A re-save of ep0-ba2 (save_overwrite, or a resumed run reaching the same batch) moves the old copy to
  // .old-ep0-ba2, then renames .tmp-ep0-ba2 into place. Killed in between, `latest` points at nothing; the next start
  // used to delete .old-ep0-ba2 and resume from ep0-ba1.
  const fs::path folder = run_folder("moved_aside");
  fs::remove_all(folder);
  const fs::path decoy = folder.parent_path() / "moved_aside-decoy";
  fs::remove_all(decoy);
  make_decoy(decoy);
  {
    trainer::Trainer t(run_config("moved_aside", {"max_duration=2ba", "save_interval=1ba"}));
    t.fit();
  }
  ASSERT_EQ(fs::read_symlink(folder / "latest"), fs::path("ep0-ba2"));
  const auto saved = snapshot(folder / "ep0-ba2");
  fs::rename(folder / "ep0-ba2", folder / ".old-ep0-ba2");
  fs::copy(folder / ".old-ep0-ba2", folder / ".tmp-ep0-ba2", fs::copy_options::recursive);
  // The user's own folders named like Tessera's hidden ones.
  write_text(folder / ".tmp-mine" / "notes.txt", "mine");
  write_text(folder / ".old-notes" / "metadata.json", R"({"files": []})");
  const auto mine = snapshot(folder / ".tmp-mine"), notes = snapshot(folder / ".old-notes"), outside = snapshot(decoy);
  LogCapture log;
  // autoresume (which runs before FIT_START) restores it and resumes from it.
  trainer::Trainer resumed(run_config("moved_aside", {"max_duration=2ba", "save_interval=1ba", "autoresume=true"}));
  EXPECT_EQ(resumed.state().timestamp.batch, 2);
  EXPECT_EQ(snapshot(folder / "ep0-ba2"), saved);
  EXPECT_FALSE(fs::exists(folder / ".old-ep0-ba2"));
  EXPECT_NE(log.text().find("restored " + (folder / "ep0-ba2").string()), std::string::npos) << log.text();
  // FIT_START's cleanup: the interrupted save's .tmp- goes; the user's folders stay, mentioned once.
  core::State s;
  s.run_name = "moved_aside";
  core::Logger logger(s);
  callbacks::CheckpointSaver saver({.folder = folder.string(), .overwrite = true}, nullptr);
  saver.run_event(core::Event::kFitStart, s, logger);
  EXPECT_FALSE(fs::exists(folder / ".tmp-ep0-ba2"));
  EXPECT_EQ(snapshot(folder / ".tmp-mine"), mine);
  EXPECT_EQ(snapshot(folder / ".old-notes"), notes);
  EXPECT_EQ(count_of(log.text(), (folder / ".tmp-mine").string()), 1u) << log.text();
  // FIT_START alone (no autoresume) restores too; and once the re-save completed, the stale copy goes.
  fs::rename(folder / "ep0-ba2", folder / ".old-ep0-ba2");
  saver.run_event(core::Event::kFitStart, s, logger);
  EXPECT_EQ(snapshot(folder / "ep0-ba2"), saved);
  fs::copy(folder / "ep0-ba2", folder / ".old-ep0-ba2", fs::copy_options::recursive);
  saver.run_event(core::Event::kFitStart, s, logger);
  EXPECT_FALSE(fs::exists(folder / ".old-ep0-ba2"));
  EXPECT_EQ(snapshot(folder / "ep0-ba2"), saved);
  EXPECT_EQ(checkpoint::find_latest_valid_checkpoint(folder.string(), "latest").value_or(""),
            (folder / "ep0-ba2").string());
  EXPECT_EQ(snapshot(folder / ".tmp-mine"), mine);
  EXPECT_EQ(snapshot(decoy), outside);
}

TEST(CheckpointFormat, FileNamesInMetadataAreNamesNotPaths) {
  const fs::path root = fresh_dir("manifest_names");
  const fs::path folder = root / "run", dir = folder / "ep0-ba1";
  const fs::path decoy = make_decoy(root / "decoy");
  write_checkpoint(folder, "ep0-ba1", 1, one_rank_payload(1));
  // The same file in the decoy: a reader that followed the name would read it from there.
  fs::copy_file(dir / "rank0.safetensors", decoy / "rank0.safetensors");
  const auto outside = snapshot(decoy);
  const nlohmann::json good = read_metadata_file(dir);
  for (const std::string& bad : {std::string("../../decoy/rank0.safetensors"), (decoy / "rank0.safetensors").string(),
                                 std::string("sub/../../../decoy/rank0.safetensors"), std::string("")}) {
    nlohmann::json m = good;
    m["files"][0]["name"] = bad;
    write_text(dir / "metadata.json", m.dump());
    const std::string err = testing::error_of([&] { CheckpointReader r(dir.string()); });
    EXPECT_NE(err.find((dir / "metadata.json").string() + ": file name \"" + bad + "\""), std::string::npos) << err;
    EXPECT_NE(err.find("refusing to use it as a path"), std::string::npos) << err;
    EXPECT_NE(checkpoint::validate_checkpoint(dir.string()).find("file name \"" + bad + "\""), std::string::npos);
    // Not a checkpoint for rotation or autoresume: `latest` names it, and it is skipped.
    EXPECT_TRUE(checkpoint::list_checkpoints(folder.string()).empty());
    EXPECT_FALSE(checkpoint::find_latest_valid_checkpoint(folder.string(), "latest").has_value());
  }
  EXPECT_EQ(snapshot(decoy), outside);
  write_text(dir / "metadata.json", good.dump());
  EXPECT_TRUE(at::equal(CheckpointReader(dir.string()).read_full("model/w"), at::ones({4})));
}

TEST(CheckpointFormat, ALatestPointerNamesOneCheckpointBesideIt) {
  const fs::path root = fresh_dir("latest_pointer");
  const fs::path folder = root / "run", decoy = root / "decoy";
  write_checkpoint(decoy, "ep0-ba9", 9, one_rank_payload(9));  // another run's, outside this folder
  write_checkpoint(folder, "ep0-ba1", 1, one_rank_payload(1));
  const auto outside = snapshot(decoy);
  for (const std::string& target : {std::string("../decoy/ep0-ba9"), (decoy / "ep0-ba9").string(), std::string("..")}) {
    fs::remove(folder / "latest");
    fs::create_symlink(target, folder / "latest");
    const std::string err = testing::error_of([&] { checkpoint::checkpoint_candidates(folder.string(), "latest"); });
    EXPECT_NE(err.find((folder / "latest").string() + ": points at \"" + target + "\""), std::string::npos) << err;
    EXPECT_NE(err.find("refusing to follow it"), std::string::npos) << err;
    EXPECT_NE(testing::error_of([&] {
                checkpoint::find_latest_valid_checkpoint(folder.string(), "latest");
              }).find("refusing to follow it"),
              std::string::npos);
  }
  EXPECT_EQ(snapshot(decoy), outside);
}

// A loopback S3 endpoint (loopback_http.h) that answers with a listing of its choice: HEAD is 200 for a listed key (404
// otherwise), GET ?list-type=2 lists the keys, and any other GET returns "{}" (as a hostile or broken endpoint may).
class ListingServer : public testing::LoopbackHttpServer {
 public:
  explicit ListingServer(std::vector<std::string> keys)
      : LoopbackHttpServer([keys = std::move(keys)](const Request& r) { return answer(keys, r); }) {}

 private:
  static Response answer(const std::vector<std::string>& keys, const Request& r) {
    if (r.target.find("list-type=2") != std::string::npos) {
      std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><IsTruncated>false</IsTruncated>";
      for (const std::string& k : keys) xml += fmt::format("<Contents><Key>{}</Key><Size>2</Size></Contents>", k);
      return {200, "", xml + "</ListBucketResult>", {}};
    }
    const std::string key = r.target.substr(r.target.find('/', 1) + 1);  // /bucket/key
    if (r.method == "HEAD") {
      const bool listed = std::find(keys.begin(), keys.end(), key) != keys.end();
      return listed ? Response{200, "", "{}", {{"ETag", "\"e\""}}} : Response{404, "", "", {}};
    }
    return {206, "", "{}", {{"Content-Range", "bytes 0-1/2"}, {"ETag", "\"e\""}}};
  }
};

TEST(Checkpointing, AnHfFolderInObjectStorageIsFetchedOnlyIntoItsTemporaryFolder) {
  // load_path: s3://.../hf (config.json, no metadata.json) downloads the listing into a temporary folder. A key with
  // dot-segments, from an endpoint that lists what it likes, once wrote beside that folder ($TMPDIR/../decoy/...).
  const fs::path root = fresh_dir("s3_listing");
  const fs::path decoy = make_decoy(root / "decoy");
  fs::create_directories(root / "tmp");
  const auto outside = snapshot(decoy);
  ListingServer server({"hf/../../decoy/pwned.txt", "hf/config.json"});
  // The process's S3 client is made from the environment at its first use, which is this test's (no other unit
  // test reaches S3 in-process).
  const testing::ScopedEnv endpoint("S3_ENDPOINT_URL", server.url()), key("AWS_ACCESS_KEY_ID", "test"),
      secret("AWS_SECRET_ACCESS_KEY", "test"), attempts("TESSERA_S3_MAX_ATTEMPTS", "1"),
      tmp("TMPDIR", (root / "tmp").string()), no_proxy("NO_PROXY", "127.0.0.1"),
      no_proxy_lower("no_proxy", "127.0.0.1");
  core::State s;
  const std::string err = testing::error_of([&] { callbacks::load_checkpoint(s, "s3://bucket/hf", {}); });
  ASSERT_FALSE(server.requests().empty()) << "the S3 client was made before this test set S3_ENDPOINT_URL";
  EXPECT_NE(err.find("s3://bucket/hf/../../decoy/pwned.txt: object key \"../../decoy/pwned.txt\" has a \"..\" segment"),
            std::string::npos)
      << err;
  for (const std::string& r : server.request_lines())
    EXPECT_EQ(r.find("pwned"), std::string::npos) << r;  // never fetched
  EXPECT_EQ(snapshot(decoy), outside);
  EXPECT_TRUE(fs::is_empty(root / "tmp"));  // the temporary folder is gone too
}

}  // namespace
}  // namespace tessera
