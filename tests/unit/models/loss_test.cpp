// The chunked cross-entropy (models::chunked_cross_entropy) against torch's own cross_entropy on the whole fp32
// logits: loss and gradient in fp32 and bf16, with label smoothing, z-loss and ignored targets, over chunk sizes that
// do and do not divide the rows; and the memory it saves, measured by a counting CPU allocator.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "tessera/models/causal_lm.h"
#include "tessera/models/loss.h"

namespace loss_test {

using namespace tessera;

// torch's definition, unchunked: what CrossEntropyLoss computed before it was chunked.
at::Tensor reference(const at::Tensor& logits, const at::Tensor& targets, const models::CrossEntropyOptions& o) {
  const at::Tensor flat = logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat);
  at::Tensor loss =
      at::cross_entropy_loss(flat, targets, {}, at::Reduction::Sum, data::kIgnoreLabel, o.label_smoothing);
  if (o.z_loss != 0) {
    const at::Tensor keep = targets.ne(data::kIgnoreLabel).to(at::kFloat);
    loss = loss + o.z_loss * (at::logsumexp(flat, {-1}).pow(2) * keep).sum();
  }
  return loss;
}

struct Result {
  double loss;
  at::Tensor grad;
};

// The loss of `fn` on a leaf copy of `logits`, and its gradient under an upstream gradient of 0.37.
template <typename Fn>
Result run(const at::Tensor& logits, Fn fn) {
  at::Tensor x = logits.detach().clone().requires_grad_(true);
  at::Tensor loss = fn(x);
  torch::autograd::backward({loss * 0.37});
  return {loss.item<double>(), x.grad()};
}

struct Case {
  int64_t rows = 37;
  int64_t vocab = 1000;
};

std::pair<at::Tensor, at::Tensor> inputs(const Case& c, at::ScalarType dtype, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor logits = at::empty({c.rows, c.vocab}).normal_(0, 3, gen).to(dtype);
  at::Tensor targets = at::randint(c.vocab, {c.rows}, gen, at::kLong);
  const at::Tensor ignored = at::rand({c.rows}, gen).lt(0.2);
  targets.masked_fill_(ignored, data::kIgnoreLabel);
  targets[c.rows - 1] = data::kIgnoreLabel;  // the last position, as next_token_targets makes it
  return {logits, targets};
}

const std::vector<models::CrossEntropyOptions> kOptions = {{0, 0}, {0.1, 0}, {0, 1e-3}, {0.25, 0.01}};

TEST(ChunkedCrossEntropy, EqualsTorchsCrossEntropyInFp32) {
  const auto [logits, targets] = inputs({}, at::kFloat, 3);
  for (const auto& o : kOptions) {
    // torch's cross_entropy in fp64 on the same values: torch's own fp32 gradient is itself ~2e-6 of the largest off
    // (its softmax is exp(log_softmax), whose rounding grows with log Z).
    const Result want = run(logits.to(at::kDouble), [&](const at::Tensor& x) { return reference(x, targets, o); });
    // One row per chunk, 5 (not dividing 37), 16 and everything at once.
    for (const int64_t rows : {1, 5, 16, 37}) {
      const Result got = run(logits, [&](const at::Tensor& x) {
        return models::chunked_cross_entropy(x, targets, o, data::kIgnoreLabel, rows * logits.size(1));
      });
      SCOPED_TRACE(::testing::Message() << "label_smoothing " << o.label_smoothing << ", z_loss " << o.z_loss
                                        << ", rows per chunk " << rows);
      EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::abs(want.loss));
      ASSERT_EQ(got.grad.scalar_type(), at::kFloat);
      const double scale = want.grad.abs().max().item<double>();
      EXPECT_LE((got.grad.to(at::kDouble) - want.grad).abs().max().item<double>(), 1e-6 * scale);
      // Ignored rows get no gradient at all.
      EXPECT_EQ(got.grad.index({targets.eq(data::kIgnoreLabel)}).abs().max().item<double>(), 0.0);
    }
  }
}

TEST(ChunkedCrossEntropy, Bf16LogitsGetTheLossOfTheirFp32ValuesAndABf16GradientWithinOneRounding) {
  const auto [logits, targets] = inputs({}, at::kBFloat16, 4);
  for (const auto& o : kOptions) {
    const Result want = run(logits, [&](const at::Tensor& x) { return reference(x, targets, o); });
    const Result got = run(logits, [&](const at::Tensor& x) {
      return models::chunked_cross_entropy(x, targets, o, data::kIgnoreLabel, 7 * logits.size(1));
    });
    SCOPED_TRACE(::testing::Message() << "label_smoothing " << o.label_smoothing << ", z_loss " << o.z_loss);
    // The loss is computed from the same fp32 values: as close as in fp32.
    EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::abs(want.loss));
    // The gradient is written in bf16, as the reference's fp32 gradient is rounded to bf16 by the cast's backward:
    // the two differ by at most one bf16 rounding step (2^-8 of the value) where the fp32 values round differently.
    ASSERT_EQ(got.grad.scalar_type(), at::kBFloat16);
    const at::Tensor g = got.grad.to(at::kFloat), w = want.grad.to(at::kFloat);
    const double scale = w.abs().max().item<double>();
    EXPECT_TRUE((g - w).abs().le(w.abs() * (1.0 / 256) + 1e-6 * scale).all().item<bool>());
    EXPECT_GT(g.eq(w).to(at::kFloat).mean().item<double>(), 0.99);  // almost all bitwise equal
  }
}

TEST(ChunkedCrossEntropy, TheModelProtocolsLossesAreChunkedAndMeanIsTheSumOverTheCountedTokens) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor logits = at::empty({3, 8, 50}).normal_(0, 2, gen);
  at::Tensor labels = at::randint(50, {3, 8}, gen, at::kLong);
  labels[1][3] = data::kIgnoreLabel;
  const at::Tensor targets = models::next_token_targets(labels);
  const at::Tensor flat = logits.reshape({-1, 50});
  const double sum = at::cross_entropy_loss(flat, targets, {}, at::Reduction::Sum).item<double>();
  const double mean = at::cross_entropy_loss(flat, targets, {}, at::Reduction::Mean).item<double>();
  EXPECT_NEAR(models::causal_lm_loss(logits, labels, data::kIgnoreLabel, at::Reduction::Sum).item<double>(), sum,
              1e-6 * sum);
  EXPECT_NEAR(models::causal_lm_loss(logits, labels).item<double>(), mean, 1e-6 * mean);
  data::TokenBatch batch;
  batch.labels = labels;
  EXPECT_NEAR(models::CrossEntropyLoss().sum(logits, batch).item<double>(), sum, 1e-6 * sum);
}

// Counts the bytes LibTorch's CPU tensors hold, and their peak, around the default CPU allocator.
class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    auto* held = new Held{std::move(inner), n, this};
    const size_t now = live_.fetch_add(n) + n;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, held, &Held::release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  void reset_peak() { peak_.store(live_.load()); }
  size_t live() const { return live_.load(); }
  size_t peak() const { return peak_.load(); }

 private:
  struct Held {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
    static void release(void* p) {
      auto* h = static_cast<Held*>(p);
      h->owner->live_.fetch_sub(h->bytes);
      delete h;
    }
  };
  c10::Allocator* inner_;
  std::atomic<size_t> live_{0};
  std::atomic<size_t> peak_{0};
};

// The peak bytes above what was held before, of a forward and backward of `fn` on bf16 logits.
template <typename Fn>
size_t extra_peak(CountingAllocator& counter, const at::Tensor& logits, Fn fn) {
  at::Tensor x = logits.detach().clone().requires_grad_(true);
  const size_t before = counter.live();
  counter.reset_peak();
  {
    at::Tensor loss = fn(x);
    torch::autograd::backward({loss});
  }
  x.mutable_grad() = at::Tensor();
  return counter.peak() - before;
}

TEST(ChunkedCrossEntropy, NeverHoldsTheWholeBatchsFp32Logits) {
  c10::Allocator* original = c10::GetCPUAllocator();
  // Outlives the test: tensors allocated through it may be freed after it is uninstalled.
  static auto* counter = new CountingAllocator(original);
  c10::SetCPUAllocator(counter, /*priority=*/255);
  const Case c{512, 4096};
  const auto [logits, targets] = inputs(c, at::kBFloat16, 5);
  const models::CrossEntropyOptions o{0.1, 1e-4};
  const size_t fp32_logits = static_cast<size_t>(c.rows * c.vocab) * 4;
  const size_t unchunked = extra_peak(*counter, logits, [&](const at::Tensor& x) { return reference(x, targets, o); });
  const size_t chunked = extra_peak(*counter, logits, [&](const at::Tensor& x) {
    return models::chunked_cross_entropy(x, targets, o, data::kIgnoreLabel, 64 * c.vocab);
  });
  c10::SetCPUAllocator(original, /*priority=*/255);
  // torch's path holds the fp32 copy, its log-softmax and fp32 gradients at once; the chunked one holds the bf16
  // gradient (half an fp32 copy) and one chunk's fp32 temporaries (64 of 512 rows).
  EXPECT_GT(unchunked, 2 * fp32_logits) << "the reference does not hold what this test assumes";
  EXPECT_LT(chunked, fp32_logits) << "chunked peak " << chunked << " bytes, unchunked " << unchunked;
}

}  // namespace loss_test
