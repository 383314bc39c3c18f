// The CUDA path (docs/gpu.md): mixed precision with loss scaling, a real out-of-memory in auto microbatching, the
// fused SDPA kernels, NCCL, and bitwise resume on a GPU. Every test skips without a CUDA device and must pass on one
// (tools/gpu_check.sh runs them from the GPU kit).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "models/mpt/mpt.h"
#include "tessera/callbacks/checkpoint_saver.h"
#include "tessera/callbacks/oom_observer.h"
#include "tessera/distributed/communicator.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/float8.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/loss.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/nvml.h"
#include "test_util.h"
#include "tiny_data.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

#define TESSERA_REQUIRE_GPU() \
  if (util::device_info().cuda_devices == 0) GTEST_SKIP() << "no GPU"

fs::path dataset() {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / "tessera_gpu_test" / "data";
    testing::write_token_split(d / "train", 64, 1);
    testing::write_token_split(d / "val", 16, 2);
    return d;
  }();
  return dir;
}

// The tiny MPT of the trainer tests, on the GPU: 8 batches of 8 per epoch.
trainer::TrainConfig gpu_config(const std::vector<std::string>& overrides = {}) {
  return testing::tiny_train_config(
      dataset(), "device: gpu\neval_interval: 0\ndevice_train_microbatch_size: 4\ndevice_eval_batch_size: 8\n",
      overrides);
}

// The training loss of every batch, and what a test asks of particular batches.
class LossLog : public core::Callback {
 public:
  std::string name() const override { return "LossLog"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (e == core::Event::kBatchEnd) losses.push_back(s.loss.item<double>());
  }
  std::vector<double> losses;
};

std::vector<at::Tensor> weights_of(trainer::Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.state().model->parameters()) out.push_back(p.detach().cpu().clone());
  return out;
}

TEST(Gpu, TrainerRunsOnTheGpuWithFp32MasterWeightsInAmpBf16) {
  TESSERA_REQUIRE_GPU();
  trainer::Trainer t(gpu_config({"max_duration=4ep", "precision=amp_bf16"}));
  EXPECT_TRUE(t.state().device.is_cuda());
  const double before = t.eval().at("LanguageCrossEntropy");
  t.fit();
  const double after = t.eval().at("LanguageCrossEntropy");
  EXPECT_LT(after, before - 0.5);
  for (const auto& p : t.state().model->parameters()) {
    EXPECT_TRUE(p.is_cuda());
    EXPECT_EQ(p.scalar_type(), at::kFloat);
  }
}

TEST(Gpu, AmpFp16LossCurveFollowsFp32) {
  TESSERA_REQUIRE_GPU();
  auto fp32 = std::make_shared<LossLog>(), fp16 = std::make_shared<LossLog>();
  trainer::Trainer a(gpu_config({"max_duration=2ep", "precision=fp32", "deterministic_mode=true"}), {{}, {fp32}});
  a.fit();
  trainer::Trainer b(gpu_config({"max_duration=2ep", "precision=amp_fp16", "deterministic_mode=true"}), {{}, {fp16}});
  b.fit();
  ASSERT_EQ(fp32->losses.size(), 16u);
  ASSERT_EQ(fp16->losses.size(), 16u);
  // Stated tolerance (docs/gpu.md): every batch's loss within 1% of fp32's; no step was skipped (scale unchanged).
  for (size_t i = 0; i < fp32->losses.size(); ++i) {
    EXPECT_NEAR(fp16->losses[i], fp32->losses[i], 0.01 * fp32->losses[i]) << "batch " << i + 1;
  }
  EXPECT_LT(fp16->losses.back(), fp16->losses.front() - 0.3);
  EXPECT_EQ(b.loss_scale(), 65536.0);
  EXPECT_EQ(a.loss_scale(), 1.0);
}

// Puts an inf into one gradient after the backward of batch `batch` (the scaled gradients, before unscaling).
class Overflow : public core::Callback {
 public:
  explicit Overflow(int64_t batch) : batch_(batch) {}
  std::string name() const override { return "Overflow"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (s.timestamp.batch + 1 != batch_) return;
    if (e == core::Event::kBeforeTrainBatch) {
      for (const auto& p : s.model->parameters()) before.push_back(p.detach().clone());
    }
    // The gradients the optimizer steps (the engine's flat vectors), which the engine fills after the batch's last
    // microbatch (the earlier ones accumulate without a reduction).
    if (e == core::Event::kAfterBackward) {
      at::Tensor g = s.trainable_parameters().front().mutable_grad();
      if (g.defined()) {
        g.view(-1)[0].fill_(INFINITY);
        injected = true;
      }
    }
    if (e == core::Event::kBatchEnd) {
      for (const auto& p : s.model->parameters()) after.push_back(p.detach().clone());
    }
  }
  std::vector<at::Tensor> before, after;
  bool injected = false;

 private:
  int64_t batch_;
};

TEST(Gpu, AmpFp16OverflowSkipsTheStepAndHalvesTheScale) {
  TESSERA_REQUIRE_GPU();
  auto overflow = std::make_shared<Overflow>(3);
  trainer::Trainer t(gpu_config({"max_duration=6ba", "precision=amp_fp16"}), {{}, {overflow}});
  t.fit();
  ASSERT_TRUE(overflow->injected);
  EXPECT_EQ(t.loss_scale(), 32768.0);
  ASSERT_EQ(overflow->before.size(), overflow->after.size());
  ASSERT_FALSE(overflow->before.empty());
  for (size_t i = 0; i < overflow->before.size(); ++i) {
    EXPECT_TRUE(at::equal(overflow->before[i], overflow->after[i])) << "batch 3 changed parameter " << i;
  }
  for (const auto& p : t.state().model->parameters()) EXPECT_TRUE(at::isfinite(p).all().item<bool>());
}

// The allocator's cap for this process, lifted at the end of the scope.
class MemoryCap {
 public:
  explicit MemoryCap(double fraction) { c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, 0); }
  ~MemoryCap() {
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
  }
  MemoryCap(const MemoryCap&) = delete;
  MemoryCap& operator=(const MemoryCap&) = delete;
};

TEST(Gpu, OomObserverWritesTheAllocatorSnapshotOnARealOutOfMemory) {
  TESSERA_REQUIRE_GPU();
  // oom_observer records the allocator's history from FIT_START; an allocation the GPU cannot hold then writes the
  // snapshot (a pickle, as torch.cuda.memory._dump_snapshot writes it) named after the rank and the batch.
  const fs::path folder = fs::temp_directory_path() / "tessera_gpu_test" / "oom";
  fs::remove_all(folder);
  trainer::Trainer t(testing::tiny_train_config(
      dataset(),
      "device: gpu\neval_interval: 0\ndevice_train_microbatch_size: 4\ncallbacks: {oom_observer: {folder: " +
          folder.string() + ", filename: 'rank{rank}_b{batch}_oom'}}\n",
      {"max_duration=2ba"}));
  t.fit();
  EXPECT_THROW(at::empty({int64_t{1} << 42}, at::TensorOptions().device(at::kCUDA).dtype(at::kByte)),
               c10::OutOfMemoryError);
  const fs::path snapshot = folder / "rank0_b2_oom_snapshot.pickle";
  ASSERT_TRUE(fs::exists(snapshot));
  std::ifstream in(snapshot, std::ios::binary);
  char magic[2] = {};
  in.read(magic, 2);
  EXPECT_EQ(static_cast<unsigned char>(magic[0]), 0x80u) << "a pickle starts with its protocol opcode";
  EXPECT_GT(fs::file_size(snapshot), 1000u);
}

TEST(Gpu, AutoMicrobatchingHalvesOnARealOutOfMemory) {
  TESSERA_REQUIRE_GPU();
  // A 131072-token vocabulary makes the logits dominate: 1024 samples of 32 tokens hold 17 GB of fp32 logits before
  // the loss and its gradient, far over a cap of 5% of the GPU (4 GB on an H100, 7 GB on an H200); a few halvings
  // later a microbatch fits. The run then matches one that started at that size.
  const fs::path big = fs::temp_directory_path() / "tessera_gpu_test" / "big";
  testing::write_token_split(big / "train", 2048, 3);
  testing::write_token_split(big / "val", 8, 4);
  const std::vector<std::string> common = {"max_duration=2ba", "model.vocab_size=131072",
                                           "global_train_batch_size=1024", "deterministic_mode=true", "precision=fp32"};
  auto config = [&](const std::string& microbatch) {
    std::vector<std::string> o = common;
    o.push_back("device_train_microbatch_size=" + microbatch);
    return testing::tiny_train_config(big, "device: gpu\neval_interval: 0\ndevice_eval_batch_size: 8\n", o);
  };
  int64_t fitted = 0;
  std::vector<at::Tensor> retried;
  {
    const MemoryCap cap(0.05);
    trainer::Trainer t(config("auto"));
    t.fit();
    fitted = t.state().device_train_microbatch_size;
    retried = weights_of(t);
  }
  EXPECT_LT(fitted, 1024) << "nothing ran out of memory";
  EXPECT_GE(fitted, 1);
  trainer::Trainer direct(config(std::to_string(fitted)));
  direct.fit();
  const auto expected = weights_of(direct);
  ASSERT_EQ(retried.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(at::equal(retried[i], expected[i])) << "tensor " << i;
}

// The fused SDPA kernels the GPU trains on (flash for causal attention without a mask, memory-efficient with ALiBi's
// additive mask, grouped K/V) with the math fallback switched off, so a shape the fused kernels refuse fails here
// instead of passing on the fallback.
class FusedAttention : public ::testing::TestWithParam<bool> {};

// Accuracy, on one attention call as MPT makes it (4 query heads over 2 K/V heads, sequence 256, head dim 64, ALiBi's
// bias built and cast to bf16 as the model does): bf16 fused, forward and backward, against the explicit path in fp32
// on the same inputs. The reference is fp32 because the explicit path in bf16 is the less accurate one with ALiBi: it
// adds the bias (down to -64 here) to the scores in bf16, whose step there is 0.25-0.5, where the fused kernels add
// it in fp32.
TEST_P(FusedAttention, MatchesFp32Attention) {
  TESSERA_REQUIRE_GPU();
  const bool alibi = GetParam();
  const int64_t b = 2, h = 4, kv = 2, s = 256, hd = 64;
  const at::Device gpu(at::kCUDA, 0);
  at::manual_seed(11);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(gpu);
  const at::Tensor q = at::randn({b, h, s, hd}, f32).to(at::kBFloat16),
                   k = at::randn({b, kv, s, hd}, f32).to(at::kBFloat16),
                   v = at::randn({b, kv, s, hd}, f32).to(at::kBFloat16), up = at::randn({b, h, s, hd}, f32);
  models::AttentionInputs in;
  if (alibi) {
    const at::Tensor rel = at::arange(0, s, f32) - static_cast<double>(s - 1);
    const at::Tensor bias = models::alibi_slopes(h, 8.0).to(gpu).view({1, h, 1, 1}) * rel.view({1, 1, 1, s});
    const at::Tensor future = at::ones({s, s}, f32.dtype(at::kBool)).triu(1);
    in.mask = bias.masked_fill(future, std::numeric_limits<float>::lowest()).to(at::kBFloat16);
  } else {
    in.is_causal = true;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto run = [&](at::ScalarType dtype, bool reference) {
    models::AttentionInputs call = in;
    call.reference = reference;
    if (call.mask) call.mask = call.mask->to(dtype);
    auto leaf = [&](const at::Tensor& t) {
      return t.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_();
    };
    const at::Tensor qq = leaf(q), kk = leaf(k), vv = leaf(v);
    const at::Tensor out = models::attend(qq, kk, vv, call, scale, 0.0, true);
    (out.to(at::kFloat) * up).sum().backward();
    return std::vector<at::Tensor>{out.detach().to(at::kFloat), qq.grad().to(at::kFloat), kk.grad().to(at::kFloat),
                                   vv.grad().to(at::kFloat)};
  };
  auto& ctx = at::globalContext();
  const bool math = ctx.userEnabledMathSDP();
  ctx.setSDPUseMath(false);
  std::vector<at::Tensor> fused;
  try {
    fused = run(at::kBFloat16, false);
  } catch (...) {
    ctx.setSDPUseMath(math);
    throw;
  }
  ctx.setSDPUseMath(math);
  const auto expected = run(at::kFloat, true);
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (size_t i = 0; i < expected.size(); ++i) {
    // bf16 against fp32: within 2% of the tensor's largest magnitude, and pointing the same way (on the CPU's fused
    // kernel, forced at sequence 512: 0.3-1.2% and cosines over 0.99998; the explicit path in bf16 with ALiBi: 6-11%).
    const double largest = expected[i].abs().max().item<double>();
    EXPECT_LE((fused[i] - expected[i]).abs().max().item<double>(), 0.02 * largest) << names[i];
    const double cosine = at::cosine_similarity(fused[i].flatten(), expected[i].flatten(), 0).item<double>();
    EXPECT_GT(cosine, 0.9999) << names[i];
  }
}

// The whole model trains on the fused kernels (no math fallback), forward and backward, and agrees with its explicit
// path in direction. Both run in bf16, so with ALiBi the explicit path's bf16 bias addition (above) puts their
// largest differences at a few percent: the magnitude check is the test above's.
TEST_P(FusedAttention, ModelRunsOnTheFusedKernels) {
  TESSERA_REQUIRE_GPU();
  const bool alibi = GetParam();
  models::MPTOptions o;
  o.d_model = 256;
  o.n_heads = 4;
  o.n_layers = 2;
  o.vocab_size = 512;
  o.max_seq_len = 256;
  o.attn.kv_n_heads = 2;  // grouped-query attention
  o.attn.alibi = alibi;
  o.learned_pos_emb = !alibi;
  models::MPTForCausalLM m = models::build_mpt(o, 7);
  m->to(at::Device(at::kCUDA, 0), at::kBFloat16);
  const at::Tensor ids = at::randint(0, o.vocab_size, {2, 256}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  auto run = [&](bool reference) {
    m->zero_grad();
    models::ForwardOptions fo;
    fo.reference_attention = reference;
    const at::Tensor logits = m->forward(ids, fo);
    logits.to(at::kFloat).pow(2).mean().backward();
    std::vector<at::Tensor> out = {logits.detach().to(at::kFloat)};
    for (const auto& p : m->parameters()) out.push_back(p.grad().to(at::kFloat));
    return out;
  };
  const auto explicit_path = run(true);
  auto& ctx = at::globalContext();
  const bool math = ctx.userEnabledMathSDP();
  ctx.setSDPUseMath(false);
  std::vector<at::Tensor> fused;
  try {
    fused = run(false);
  } catch (...) {
    ctx.setSDPUseMath(math);
    throw;
  }
  ctx.setSDPUseMath(math);
  ASSERT_EQ(fused.size(), explicit_path.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(at::isfinite(fused[i]).all().item<bool>()) << "tensor " << i;
    const double cosine = at::cosine_similarity(fused[i].flatten(), explicit_path[i].flatten(), 0).item<double>();
    EXPECT_GT(cosine, 0.999) << "tensor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, FusedAttention, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("Alibi") : std::string("Causal");
                         });

TEST(Gpu, NcclCollectivesOnOneRank) {
  TESSERA_REQUIRE_GPU();
  dist::Rendezvous rv;
  rv.master_port = 29000 + static_cast<int>(getpid() % 1000);
  auto comm = dist::Communicator::connect(rv, at::Device(at::kCUDA, 0), std::chrono::seconds(60),
                                          /*process_group_for_one=*/true);
  EXPECT_EQ(comm->backend_name(), "nccl");
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::Tensor t = at::arange(5, cuda.dtype(at::kFloat));
  comm->all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(5, at::kFloat)));
  at::Tensor m = at::full({3}, 2.0, cuda.dtype(at::kDouble));
  comm->all_reduce(m, dist::ReduceOp::kMax).wait();
  EXPECT_TRUE(at::equal(m.cpu(), at::full({3}, 2.0, at::kDouble)));
  at::Tensor in = at::arange(6, cuda.dtype(at::kFloat)), out = at::empty({6}, cuda.dtype(at::kFloat));
  comm->reduce_scatter(out, in).wait();
  EXPECT_TRUE(at::equal(out.cpu(), at::arange(6, at::kFloat)));
  at::Tensor mine = at::full({4}, 7, cuda.dtype(at::kLong)), all = at::empty({4}, cuda.dtype(at::kLong));
  comm->all_gather(all, mine).wait();
  EXPECT_TRUE(at::equal(all.cpu(), at::full({4}, 7, at::kLong)));
  at::Tensor b = at::full({2}, 3.0, cuda.dtype(at::kBFloat16));
  comm->broadcast(b, 0).wait();
  EXPECT_TRUE(at::equal(b.cpu(), at::full({2}, 3.0, at::kBFloat16)));
  comm->barrier();
}

// One process per GPU (torchrun's convention): a rank whose local rank has no GPU is refused before it connects, with
// a message naming the rank and what to do, instead of sharing a GPU or hanging in the rendezvous.
TEST(Gpu, ARankWithoutAGpuOfItsOwnIsAConfigErrorNamingIt) {
  TESSERA_REQUIRE_GPU();
  const int gpus = util::device_info().cuda_devices;
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", std::to_string(gpus)},
      {"WORLD_SIZE", std::to_string(gpus + 1)},
      {"LOCAL_RANK", std::to_string(gpus)},
      {"LOCAL_WORLD_SIZE", std::to_string(gpus + 1)},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "1"}};  // never reached: the check comes before the rendezvous
  for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  std::string what;
  try {
    trainer::Trainer t(gpu_config());
  } catch (const ConfigError& e) {
    what = e.what();
  }
  for (const auto& kv : vars) unsetenv(kv.first.c_str());
  EXPECT_NE(what.find(fmt::format("rank {} (local rank {}) has no GPU of its own: this node has {} GPU(s) and {} "
                                  "processes; launch at most {} per node, or set device: cpu",
                                  gpus, gpus, gpus, gpus + 1, gpus)),
            std::string::npos)
      << what;
}

TEST(Gpu, CheckpointOfGpuTensorsResumesBitwiseInDeterministicMode) {
  TESSERA_REQUIRE_GPU();
  const fs::path runs = dataset().parent_path() / "runs";
  fs::remove_all(runs);
  auto config = [&](const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> o = {"run_name=" + run,         "save_folder=" + (runs / "{run_name}").string(),
                                  "max_duration=12ba",       "save_interval=4ba",
                                  "deterministic_mode=true", "model.resid_pdrop=0.1",
                                  "precision=amp_bf16",      "scheduler.name=cosine_with_warmup",
                                  "scheduler.t_warmup=2ba"};
    o.insert(o.end(), extra.begin(), extra.end());
    return gpu_config(o);
  };
  trainer::Trainer whole(config("whole", {}));
  whole.fit();
  const auto expected = weights_of(whole);
  {
    trainer::Trainer first(config("resumed", {}), {{}, {std::make_shared<testing::CrashAt>(6)}});
    first.fit();
  }
  trainer::Trainer second(config("resumed", {"autoresume=true"}));
  EXPECT_EQ(second.state().timestamp.batch, 4);
  second.fit();
  const auto got = weights_of(second);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], expected[i])) << "tensor " << i;
}

// The health monitor's and the watchdog's view of a GPU: NVML, loaded at run time, reads the device LibTorch uses.
TEST(Gpu, NvmlReadsTheDevicesUtilisationMemoryAndErrors) {
  TESSERA_REQUIRE_GPU();
  std::string why;
  const std::unique_ptr<util::Nvml> nvml = util::Nvml::open(&why);
  ASSERT_NE(nvml, nullptr) << why;
  EXPECT_GE(nvml->device_count(), 1);
  const std::string bus = util::cuda_pci_bus_id(0);
  ASSERT_FALSE(bus.empty());
  const util::GpuHealth before = nvml->read(bus);
  EXPECT_EQ(before.pci_bus_id, bus);
  EXPECT_GT(before.memory_total_bytes, 1e9);
  EXPECT_TRUE(before.xids.empty()) << "XID " << before.xids.front();
  // 2 GiB more in use, and a busy GPU while matmuls run.
  at::Tensor big = at::empty({int64_t{1} << 29}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  big.fill_(1);
  at::Tensor a = at::randn({8192, 8192}, at::TensorOptions().device(at::kCUDA));
  // NVML's utilisation is the fraction of its last sample period (1/6 s to 1 s) in which a kernel ran: each round
  // keeps the GPU busy for about half a second and reads it when the round's matmuls have finished.
  double busiest = 0;
  util::GpuHealth during;
  for (int i = 0; i < 8; ++i) {
    for (int k = 0; k < 20; ++k) a = at::mm(a, a).div_(8192);
    at::cuda::device_synchronize();
    during = nvml->read(bus);
    busiest = std::max(busiest, during.utilization_percent);
  }
  EXPECT_GE(during.memory_used_bytes - before.memory_used_bytes, 1.9 * (1 << 30));
  EXPECT_GT(busiest, 50) << "percent, while matmuls ran";
  EXPECT_LE(busiest, 100);
  if (before.ecc_uncorrected >= 0) {
    EXPECT_EQ(during.ecc_uncorrected, before.ecc_uncorrected);
  }
  const util::GpuHealth by_index = nvml->read_index(0);
  EXPECT_GT(by_index.memory_total_bytes, 1e9);
}

TEST(Gpu, AmpFp8LossFollowsAmpBf16) {
  TESSERA_REQUIRE_GPU();
  if (const std::string why = models::float8_unsupported_reason(at::Device(at::kCUDA, 0)); !why.empty()) {
    GTEST_SKIP() << why;
  }
  auto bf16 = std::make_shared<LossLog>(), fp8 = std::make_shared<LossLog>();
  trainer::Trainer a(gpu_config({"max_duration=4ep", "precision=amp_bf16", "deterministic_mode=true"}), {{}, {bf16}});
  a.fit();
  trainer::Trainer b(gpu_config({"max_duration=4ep", "precision=amp_fp8", "deterministic_mode=true"}), {{}, {fp8}});
  b.fit();
  ASSERT_EQ(bf16->losses.size(), 32u);
  ASSERT_EQ(fp8->losses.size(), 32u);
  // Stated band (docs/training.md#precision): every batch's loss within 1.5% of amp_bf16's, and it falls as far.
  for (size_t i = 0; i < bf16->losses.size(); ++i) {
    EXPECT_NEAR(fp8->losses[i], bf16->losses[i], 0.015 * bf16->losses[i]) << "batch " << i + 1;
  }
  EXPECT_LT(fp8->losses.back(), fp8->losses.front() - 0.3);
  // The weights stay fp32 masters: a checkpoint of this run is one of amp_bf16.
  for (const auto& p : b.state().model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
}

TEST(Gpu, ChunkedCrossEntropyHoldsLessThanTheWholeBatchsFp32Logits) {
  TESSERA_REQUIRE_GPU();
  const int64_t rows = 8192, vocab = 32768;  // bf16 logits: 512 MiB; in fp32: 1 GiB
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  const at::Tensor logits = at::randn({rows, vocab}, cuda).mul_(3).to(at::kBFloat16);
  const at::Tensor targets = at::randint(vocab, {rows}, cuda.dtype(at::kLong));
  const double fp32_bytes = static_cast<double>(rows * vocab) * 4;
  auto peak_of = [&](const std::function<at::Tensor(const at::Tensor&)>& loss_of, double& loss) {
    at::Tensor x = logits.clone().requires_grad_(true);
    at::cuda::device_synchronize();
    const auto agg = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    const double before =
        static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].current);
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    {
      at::Tensor l = loss_of(x);
      l.backward();
      loss = l.item<double>();
    }
    x.mutable_grad() = at::Tensor();
    return static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].peak) - before;
  };
  double want = 0, got = 0;
  const double unchunked = peak_of(
      [&](const at::Tensor& x) {
        return at::cross_entropy_loss(x.to(at::kFloat), targets, {}, at::Reduction::Sum, data::kIgnoreLabel, 0.1);
      },
      want);
  const double chunked = peak_of(
      [&](const at::Tensor& x) {
        return models::chunked_cross_entropy(x, targets, {0.1, 0});
      },
      got);
  EXPECT_NEAR(got, want, 1e-5 * want);
  EXPECT_GT(unchunked, 2 * fp32_bytes);
  EXPECT_LT(chunked, fp32_bytes) << "chunked peak " << chunked / 1e9 << " GB, unchunked " << unchunked / 1e9 << " GB";
}

// RMSNorm in fp32 (the residual stream under amp) runs ATen's fused kernel on a GPU: the formula's values and
// gradients, and, kept for backward, each row's rstd instead of the formula's (B, S, D) fp32 intermediates.
TEST(Gpu, RmsNormInFp32IsTheFusedKernelAndKeepsLessForBackward) {
  TESSERA_REQUIRE_GPU();
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  models::Norm norm(2048, models::NormType::kRMSNorm, 1e-5, false, cuda);
  {
    at::NoGradGuard no_grad;
    norm->weight.copy_(at::randn({2048}, cuda) * 0.5 + 1);
  }
  const at::Tensor x = at::randn({8, 1024, 2048}, cuda).mul_(2).requires_grad_(true);  // 64 MiB
  const at::Tensor grad_out = at::randn_like(x);
  const double x_bytes = static_cast<double>(x.numel()) * 4;
  const auto agg = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
  auto held_by = [&](const std::function<at::Tensor()>& forward, std::vector<at::Tensor>& grads) {
    at::cuda::device_synchronize();
    const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].current;
    at::Tensor y = forward();
    at::cuda::device_synchronize();
    const auto held = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].current - before;
    grads = torch::autograd::grad({y}, {x, norm->weight}, {grad_out});
    grads.insert(grads.begin(), y.detach());
    return static_cast<double>(held);
  };
  std::vector<at::Tensor> fused, formula;
  const double fused_held = held_by([&] { return norm(x); }, fused);
  const double formula_held =
      held_by([&] { return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-5) * norm->weight; }, formula);
  for (size_t i = 0; i < fused.size(); ++i) {
    const double err = (fused[i] - formula[i]).abs().max().item<double>() / formula[i].abs().max().item<double>();
    EXPECT_LT(err, 1e-5) << "output, input gradient, weight gradient: #" << i;
  }
  // The output itself is one x; the formula keeps at least one more (x * rstd) for its last multiply.
  EXPECT_LT(fused_held, formula_held - 0.9 * x_bytes)
      << "fused " << fused_held / 1e6 << " MB, formula " << formula_held / 1e6 << " MB held after forward";
}

// cuda_graphs: after two warmup batches the step's microbatches are captured once and replayed; a batch of another
// shape (the epoch's short last batch) runs eagerly between replays. With deterministic kernels the replays compute
// what the eager steps compute, bit for bit: every batch's loss and the weights after 20 batches (docs/gpu.md).
class StepRecord : public core::Callback {
 public:
  std::string name() const override { return "StepRecord"; }
  void run_event(core::Event e, core::State& s, core::Logger& /*l*/) override {
    if (e != core::Event::kBatchEnd) return;
    train_losses.push_back(s.train_loss);
    last_microbatch.push_back(s.loss.item<double>());
    rows.push_back(s.batch.input_ids.size(0));
  }
  std::vector<double> train_losses, last_microbatch;
  std::vector<int64_t> rows;
};

void expect_graphed_run_equals_eager(const std::vector<std::string>& extra) {
  std::vector<std::string> o = {"max_duration=20ba", "precision=amp_bf16", "deterministic_mode=true"};
  o.insert(o.end(), extra.begin(), extra.end());
  auto eager = std::make_shared<StepRecord>(), graphed = std::make_shared<StepRecord>();
  trainer::Trainer a(gpu_config(o), {{}, {eager}});
  a.fit();
  o.emplace_back("cuda_graphs=true");
  trainer::Trainer b(gpu_config(o), {{}, {graphed}});
  b.fit();
  ASSERT_EQ(eager->train_losses.size(), 20u);
  ASSERT_EQ(graphed->train_losses.size(), 20u);
  int64_t short_batches = 0;
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(graphed->train_losses[i], eager->train_losses[i]) << "batch " << i + 1;
    EXPECT_EQ(graphed->last_microbatch[i], eager->last_microbatch[i]) << "batch " << i + 1;
    if (i >= 2 && eager->rows[i] != eager->rows[2]) ++short_batches;
  }
  EXPECT_EQ(a.cuda_graph_replays(), 0);
  EXPECT_EQ(b.cuda_graph_replays(), 18 - short_batches);  // all but the two warmup batches and the short ones
  EXPECT_LT(graphed->train_losses.back(), graphed->train_losses.front() - 0.3);
  const auto want = weights_of(a), got = weights_of(b);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "tensor " << i;
}

TEST(Gpu, CudaGraphReplaysEqualTheEagerStepsBitwise) {
  TESSERA_REQUIRE_GPU();
  expect_graphed_run_equals_eager({});
}

// Dropout inside the graph: each replay draws fresh numbers from the generator, the ones the eager step draws.
TEST(Gpu, CudaGraphReplaysDrawDropoutAsTheEagerStepsDo) {
  TESSERA_REQUIRE_GPU();
  expect_graphed_run_equals_eager({"model.resid_pdrop=0.1", "model.emb_pdrop=0.1"});
}

// 64 samples in batches of 12: every epoch's sixth batch has 4 rows, runs eagerly, and the replays after it step the
// graph's gradients again (gradient clipping, eager after the replay, included).
TEST(Gpu, CudaGraphRunsShortBatchesEagerlyBetweenReplays) {
  TESSERA_REQUIRE_GPU();
  expect_graphed_run_equals_eager({"global_train_batch_size=12", "train_loader.drop_last=false",
                                   "algorithms.gradient_clipping.clipping_type=norm",
                                   "algorithms.gradient_clipping.clipping_threshold=0.5"});
}

// A research loss that reads a value on the host inside the step (a synchronisation, which a capture cannot hold):
// the capture fails, the run goes on eagerly from that batch with the graph's memory handed back, and its results are
// the run's without graphs, bit for bit.
class HostReadingLoss : public models::Loss {
 public:
  at::Tensor sum(const at::Tensor& logits, const data::TokenBatch& batch) const override {
    const double largest = logits.detach().abs().max().item<double>();
    const at::Tensor loss = models::CrossEntropyLoss(models::CrossEntropyOptions{}).sum(logits, batch);
    return std::isfinite(largest) ? loss : loss * 0;
  }
};

TEST(Gpu, CudaGraphCaptureThatFailsFallsBackToTheEagerStep) {
  TESSERA_REQUIRE_GPU();
  const std::vector<std::string> o = {"max_duration=10ba", "precision=amp_bf16", "deterministic_mode=true"};
  auto eager = std::make_shared<StepRecord>(), graphed = std::make_shared<StepRecord>();
  const auto loss = std::make_shared<HostReadingLoss>();
  trainer::Trainer a(gpu_config(o), {{}, {eager}, loss});
  a.fit();
  std::vector<std::string> with = o;
  with.emplace_back("cuda_graphs=true");
  trainer::Trainer b(gpu_config(with), {{}, {graphed}, loss});
  b.fit();
  EXPECT_EQ(b.cuda_graph_replays(), 0);
  ASSERT_EQ(graphed->train_losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(graphed->train_losses[i], eager->train_losses[i]) << "batch " << i + 1;
  const auto want = weights_of(a), got = weights_of(b);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "tensor " << i;
}

}  // namespace
}  // namespace tessera
