// The training losses: next-token cross-entropy (chunked, in fp32) and the registry of losses.
#include "tessera/models/loss.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "tessera/models/causal_lm.h"

namespace tessera::models {
namespace {

int64_t rows_per_chunk(const at::Tensor& logits, int64_t chunk_elements) {
  if (chunk_elements <= 0) chunk_elements = logits.is_cuda() ? (int64_t{1} << 25) : (int64_t{1} << 22);
  return std::max<int64_t>(1, chunk_elements / std::max<int64_t>(1, logits.size(1)));
}

// The loss summed over the counted rows; backward recomputes each chunk's softmax from the saved logits. Per counted
// row i with target t, log Z_i = logsumexp_j x_ij and smoothing e over V classes:
//   loss_i  = (1 - e) (log Z_i - x_it) + e (log Z_i - mean_j x_ij) + z (log Z_i)^2
//   d/dx_ij = softmax_ij (1 + 2 z log Z_i) - (1 - e) [j == t] - e / V
// (times the upstream gradient).
struct ChunkedCrossEntropyFunction : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            double smoothing, double z_loss, int64_t ignore_index, int64_t rows) {
    const int64_t n = logits.size(0), v = logits.size(1);
    const at::Tensor keep = targets.ne(ignore_index);                    // (N) bool
    const at::Tensor target = at::where(keep, targets, 0).unsqueeze(1);  // (N, 1), ignored rows point at class 0
    at::Tensor total = at::zeros({}, logits.options().dtype(at::kFloat));
    at::Tensor log_z = z_loss != 0 ? at::empty({n}, total.options()) : at::Tensor();  // (N), for the z-loss term
    for (int64_t r = 0; r < n; r += rows) {
      const int64_t m = std::min(rows, n - r);
      const at::Tensor x = logits.narrow(0, r, m);
      const at::Tensor lsm = at::log_softmax(x, 1, at::kFloat);  // (m, V) fp32: the only chunk-sized temporary
      at::Tensor row = lsm.gather(1, target.narrow(0, r, m)).squeeze(1).neg_();  // log Z - x_t
      if (smoothing != 0) row = row.mul_(1.0 - smoothing).sub_(lsm.sum(1), smoothing / static_cast<double>(v));
      if (z_loss != 0) {
        // log Z from any one column: x_i0 - log_softmax_i0.
        const at::Tensor lz = x.select(1, 0).to(at::kFloat) - lsm.select(1, 0);  // out of place: x is the logits
        log_z.narrow(0, r, m).copy_(lz);
        row = row.add_(lz.square(), z_loss);
      }
      total.add_(at::where(keep.narrow(0, r, m), row, 0).sum());
    }
    ctx->save_for_backward({logits, targets});
    ctx->saved_data["log_z"] = log_z;
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["z_loss"] = z_loss;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["rows"] = rows;
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& targets = saved[1];
    const at::Tensor log_z = ctx->saved_data["log_z"].toTensor();
    const double smoothing = ctx->saved_data["smoothing"].toDouble();
    const double z_loss = ctx->saved_data["z_loss"].toDouble();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const int64_t n = logits.size(0), v = logits.size(1);
    const at::Tensor keep = targets.ne(ignore_index);
    const at::Tensor target = at::where(keep, targets, 0).unsqueeze(1);
    // d loss / d row_i: the upstream gradient on counted rows, 0 on ignored ones; on the device (no host sync).
    const at::Tensor g = at::where(keep, grads[0].to(at::kFloat), 0.0f);  // (N)
    at::Tensor grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
    for (int64_t r = 0; r < n; r += rows) {
      const int64_t m = std::min(rows, n - r);
      // d/dx_ij = s_i (softmax_ij - c_i [j == t] - d_i) with s_i = g_i f_i, f_i = 1 + 2 z log Z_i, c_i = (1 - e) / f_i,
      // d_i = e / (V f_i): the subtractions in fp32 on the chunk's softmax, then one multiply that rounds once into
      // the gradient's dtype (12 bytes of traffic per logit in bf16, where softmax, scale, subtract, copy took 20).
      at::Tensor p = at::softmax(logits.narrow(0, r, m), 1, at::kFloat);  // (m, V) fp32
      at::Tensor s = g.narrow(0, r, m).unsqueeze(1);                      // (m, 1)
      if (z_loss == 0) {                                                  // f = 1
        p.scatter_add_(1, target.narrow(0, r, m), at::full({m, 1}, -(1.0 - smoothing), p.options()));
        if (smoothing != 0) p.sub_(smoothing / static_cast<double>(v));
      } else {
        const at::Tensor f = log_z.narrow(0, r, m).mul(2.0 * z_loss).add_(1.0).unsqueeze(1), inv_f = f.reciprocal();
        p.scatter_add_(1, target.narrow(0, r, m), inv_f * -(1.0 - smoothing));
        if (smoothing != 0) p.sub_(inv_f * (smoothing / static_cast<double>(v)));
        s = s * f;
      }
      at::Tensor out = grad.narrow(0, r, m);
      at::mul_out(out, p, s);
    }
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const CrossEntropyOptions& o,
                                 int64_t ignore_index, int64_t chunk_elements) {
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
              "chunked_cross_entropy: logits (N, V) and targets (N), got ", logits.sizes(), " and ", targets.sizes());
  return ChunkedCrossEntropyFunction::apply(logits, targets, o.label_smoothing, o.z_loss, ignore_index,
                                            rows_per_chunk(logits, chunk_elements));
}

at::Tensor CrossEntropyLoss::sum(const at::Tensor& logits, const data::TokenBatch& batch) const {
  return chunked_cross_entropy(logits.reshape({-1, logits.size(-1)}), next_token_targets(batch), o_);
}

LossRegistry& loss_registry() {
  static LossRegistry* r = [] {
    auto* reg = new LossRegistry("loss");
    reg->add(
        "cross_entropy",
        [](config::Section& s) {
          CrossEntropyOptions o;
          o.label_smoothing = s.get_double("label_smoothing", o.label_smoothing);
          s.check(o.label_smoothing >= 0 && o.label_smoothing < 1, "label_smoothing", "must be in [0, 1)");
          o.z_loss = s.get_double("z_loss", o.z_loss);
          s.check(o.z_loss >= 0, "z_loss", "must be non-negative");
          s.finish();
          return LossOptions{"cross_entropy", o};
        },
        [](const LossOptions& o) -> std::shared_ptr<const Loss> {
          return std::make_shared<CrossEntropyLoss>(std::any_cast<const CrossEntropyOptions&>(o.options));
        });
    return reg;
  }();
  return *r;
}

}  // namespace tessera::models
