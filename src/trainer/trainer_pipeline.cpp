// A training step under pipeline parallelism: this rank's stage runs its share of every microbatch's forward and
// backward in the schedule's order (distributed/pipeline.h), and the stages pass activations forward and their
// gradients back, point to point over the rank's pipeline group. The loss is the one run_microbatches computes, on
// the last stage, so that a pipelined step equals the unpipelined one.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tessera/distributed/communicator.h"
#include "tessera/distributed/pipeline.h"
#include "tessera/models/context_parallel.h"
#include "tessera/trainer/precision_context.h"
#include "tessera/trainer/trainer.h"
#include "tessera/trainer/trainer_support.h"
#include "tessera/util/error.h"

namespace tessera::trainer {

using core::Event;
using detail::slice;

namespace {

// Forward messages (an activation, after a header giving its dtype and shape) and backward ones (its gradient, whose
// shape and dtype the receiver knows: those of what it sent) go on tags of their own.
constexpr int kActivationTag = 0;
constexpr int kGradientTag = 1;
constexpr int64_t kMaxDims = 6;

// Sends still in flight, with the tensors they read: kept until the step ends.
struct Sends {
  std::vector<std::pair<dist::Work, at::Tensor>> pending;
  void send(dist::Communicator& link, at::Tensor t, int peer, int tag, const std::string& what) {
    t = t.contiguous();
    dist::Work w = link.send(t, peer, tag, what);
    pending.emplace_back(std::move(w), std::move(t));
  }
  void wait() {
    for (auto& [w, t] : pending) w.wait();
    pending.clear();
  }
};

// What a message is, for failures and hang reports: "the activation of microbatch 2 for pipeline stage 1".
std::string message(const char* what, int64_t microbatch, const char* direction, int stage) {
  return fmt::format("the {} of microbatch {} {} pipeline stage {}", what, microbatch, direction, stage);
}

void send_activation(dist::Communicator& link, Sends& sends, const at::Tensor& x, int peer, int64_t microbatch) {
  if (x.dim() > kMaxDims) {
    throw Error("pipeline",
                fmt::format("a stage's output of {} dimensions (at most {} go between stages)", x.dim(), kMaxDims));
  }
  std::vector<int64_t> header(2 + kMaxDims, 0);
  header[0] = static_cast<int64_t>(x.scalar_type());
  header[1] = x.dim();
  for (int64_t d = 0; d < x.dim(); ++d) header[static_cast<size_t>(2 + d)] = x.size(d);
  const std::string what = message("activation", microbatch, "for", peer);
  sends.send(link, at::tensor(header, at::kLong).to(x.device()), peer, kActivationTag, what);
  sends.send(link, x.detach(), peer, kActivationTag, what);
}

// The activation of `rows` sequences of `positions` tokens (this rank's under context parallelism) from stage `peer`:
// the header's shape must lead with those, so that a malformed message never sizes an allocation.
at::Tensor receive_activation(dist::Communicator& link, int peer, const at::Device& device, int64_t microbatch,
                              int64_t rows, int64_t positions) {
  const std::string what = message("activation", microbatch, "from", peer);
  at::Tensor header = at::empty({2 + kMaxDims}, at::TensorOptions().dtype(at::kLong).device(device));
  link.recv(header, peer, kActivationTag, what).wait();
  const at::Tensor h = header.cpu();
  const auto* v = h.data_ptr<int64_t>();
  if (v[1] < 0 || v[1] > kMaxDims || v[0] < 0 || v[0] >= static_cast<int64_t>(at::ScalarType::NumOptions)) {
    throw Error("pipeline", fmt::format("rank {} of the pipeline group sent a malformed activation header", peer));
  }
  const std::vector<int64_t> shape(v + 2, v + 2 + v[1]);
  if (shape.size() < 2 || shape[0] != rows || shape[1] != positions ||
      std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    throw Error("pipeline",
                fmt::format("pipeline stage {} sent an activation of shape [{}] for microbatch {}, expected "
                            "[{}, {}, ...]",
                            peer, fmt::join(shape, ", "), microbatch, rows, positions));
  }
  at::Tensor x = at::empty(shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(v[0])).device(device));
  link.recv(x, peer, kActivationTag, what).wait();
  return x;
}

}  // namespace

void Trainer::run_pipeline(const data::TokenBatch& batch) {
  dist::ParallelModel& parallel = *state_.parallel;
  const dist::PipelineStageOptions& pp = parallel.options().pipeline;
  dist::Communicator& link = *pp.group;
  const int stage = pp.stage, last = pp.stages - 1;
  const int64_t n = batch.input_ids.size(0);
  const int64_t per =
      cfg_.fsdp.pipeline_microbatch_size > 0 ? cfg_.fsdp.pipeline_microbatch_size : state_.device_train_microbatch_size;
  const int64_t microbatches = (n + per - 1) / per;
  const std::vector<dist::PipelineAction> actions = dist::pipeline_actions(
      *dist::pipeline_schedule_named(cfg_.fsdp.pipeline_schedule), stage, pp.stages, microbatches);
  const double scale = token_scale();
  const at::DeviceType dev = state_.device.type();
  // Context parallelism within the stages: every stage runs on this rank's shard of the positions (activations
  // travel as shards), the last stage's loss scaled as without stages.
  const std::shared_ptr<models::ContextExchange> context = parallel.context_exchange();
  const double context_scale = context ? static_cast<double>(context->size()) : 1.0;
  std::shared_ptr<const models::ContextShard> shard;
  parallel.sync_stage_copies();  // the last stage's root: the first stage's, stepped last step (or loaded)

  struct InFlight {
    at::Tensor input;   // the activation received (stages after the first), a leaf whose gradient goes back
    at::Tensor output;  // the loss (last stage) or the activation sent on
  };
  std::vector<InFlight> flight(static_cast<size_t>(microbatches));
  Sends sends;
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(state_.device));
  int64_t backwards_left = microbatches;
  for (const dist::PipelineAction& a : actions) {
    const int64_t start = a.microbatch * per, end = std::min(n, start + per);
    InFlight& f = flight[static_cast<size_t>(a.microbatch)];
    if (a.kind == dist::PipelineAction::Kind::kForward) {
      state_.batch = slice(batch, start, end);
      engine_->run_event(Event::kBeforeForward);
      const data::TokenBatch whole = state_.batch;
      const models::ForwardOptions fo = microbatch_options(whole, context, shard);
      if (stage > 0) {
        const int64_t positions = fo.context ? fo.context->positions.size(0) : whole.input_ids.size(1);
        f.input = receive_activation(link, stage - 1, state_.device, a.microbatch, end - start, positions)
                      .requires_grad_(true);
        at::Tensor in = f.input;
        if (fo.context) {
          // The activation is this rank's positions'; the model cuts its layers' input to them from a whole-length
          // one (models/blocks/attention.h, context_positions_of), so it gets them at their places in one.
          std::vector<int64_t> shape = in.sizes().vec();
          shape.at(1) = whole.input_ids.size(1);
          in = at::zeros(shape, in.options()).index_copy(1, fo.context->positions, in);
        }
        parallel.set_stage_input(in);
      }
      {
        AutocastGuard autocast(state_.precision, dev);
        state_.outputs = state_.model->forward(whole.input_ids, fo);
      }
      engine_->run_event(Event::kAfterForward);
      if (stage == last) {
        engine_->run_event(Event::kBeforeLoss);
        {
          AutocastGuard autocast(state_.precision, dev);
          state_.loss = scaled_loss(loss_sum(), whole, end - start, n, nullptr, scale, context_scale);
        }
        engine_->run_event(Event::kAfterLoss);
        f.output = state_.loss;
        total.add_(state_.loss.detach().reshape({1}));
      } else {
        f.output = state_.outputs;
        send_activation(link, sends, f.output, stage + 1, a.microbatch);
      }
      continue;
    }
    // Gradients accumulate locally until the step's last backward, which reduces them (NO_SHARD's no_sync).
    parallel.prepare_backward(/*sync=*/--backwards_left == 0);
    engine_->run_event(Event::kBeforeBackward);
    if (stage == last) {
      loss_scaler_.scale(f.output).backward();
    } else {
      at::Tensor grad = at::empty(f.output.sizes(), f.output.options());  // contiguous, whatever the output's strides
      link.recv(grad, stage + 1, kGradientTag, message("gradient", a.microbatch, "from", stage + 1)).wait();
      torch::autograd::backward({f.output}, {grad});
    }
    if (stage > 0) {
      at::Tensor g = f.input.grad();
      if (!g.defined()) g = at::zeros_like(f.input);  // a stage whose output does not depend on its input
      sends.send(link, g, stage - 1, kGradientTag, message("gradient", a.microbatch, "for", stage - 1));
    }
    engine_->run_event(Event::kAfterBackward);
    f = InFlight{};
  }
  parallel.finish_backward();
  sends.wait();
  step_total_ = total;
}

}  // namespace tessera::trainer
