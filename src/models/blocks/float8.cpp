// Float8 Linear layers (precision: amp_fp8): dynamic per-tensor scaling and _scaled_mm, forward and backward.
#include "tessera/models/blocks/float8.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <string_view>
#include <vector>

#include "tessera/models/blocks/layers.h"

namespace tessera::models {
namespace {

double float8_max(at::ScalarType fp8) {
  return fp8 == at::kFloat8_e5m2 ? 57344.0 : 448.0;
}

bool divides(int64_t n) {
  return n % 16 == 0;
}

// A (rows, cols) float8 matrix laid out column-major, as _scaled_mm takes its second operand.
at::Tensor column_major(const at::Tensor& m) {
  return m.t().contiguous().t();
}

// The three GEMMs of y = x W^T (torchao's Float8Linear without the bias, which is added in the output's dtype):
//   output      y  = x8  . w8^T   (e4m3 x e4m3, fast accumulation)
//   input grad  gx = g8  . w8     (e5m2 x e4m3)
//   weight grad gw = g8^T . x8    (e5m2 x e4m3, in fp32: the master weights' gradient)
// The float8 copies of x and W are what backward keeps (a quarter of x in fp32).
struct Float8LinearFunction : public torch::autograd::Function<Float8LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            at::ScalarType out_dtype) {
    const int64_t in = x.size(-1);
    const at::Tensor x2 = x.reshape({-1, in});  // (M, K)
    auto [x8, x_inv] = to_float8(x2, at::kFloat8_e4m3fn);
    auto [w8, w_inv] = to_float8(weight, at::kFloat8_e4m3fn);  // (N, K)
    at::Tensor y = at::_scaled_mm(x8, w8.t(), x_inv, w_inv, {}, {}, out_dtype, /*use_fast_accum=*/true);
    ctx->save_for_backward({x8, x_inv, w8, w_inv});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x8 = saved[0], &x_inv = saved[1], &w8 = saved[2], &w_inv = saved[3];
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const at::Tensor g2 = grads[0].reshape({-1, w8.size(0)});  // (M, N)
    auto [g8, g_inv] = to_float8(g2, at::kFloat8_e5m2);
    const at::ScalarType gx_dtype = x_dtype == at::kFloat ? g2.scalar_type() : x_dtype;
    at::Tensor gx = at::_scaled_mm(g8, column_major(w8), g_inv, w_inv, {}, {}, gx_dtype, false);
    at::Tensor gw = at::_scaled_mm(g8.t().contiguous(), column_major(x8), g_inv, x_inv, {}, {}, at::kFloat, false);
    return {gx.to(x_dtype).view(ctx->saved_data["x_shape"].toIntVector()), gw.to(w_dtype), at::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> to_float8(const at::Tensor& x, at::ScalarType fp8) {
  const double top = float8_max(fp8);
  // max|x| in one reduction (no |x| temporary), in fp32.
  const at::Tensor amax = at::linalg_vector_norm(x, INFINITY, {}, false, at::kFloat).clamp_min(1e-12);
  const at::Tensor scale = at::reciprocal(amax).mul_(top);
  at::Tensor q = (x.to(at::kFloat) * scale).clamp_(-top, top).to(fp8);
  return {q, at::reciprocal(scale)};
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const at::DeviceType dev = x.device().type();
  const at::ScalarType out =
      at::autocast::is_autocast_enabled(dev) ? at::autocast::get_autocast_dtype(dev) : x.scalar_type();
  const int64_t rows = x.numel() / std::max<int64_t>(1, x.size(-1));
  if (!divides(x.size(-1)) || !divides(weight.size(0)) || !divides(rows)) return at::linear(x, weight, bias);
  at::Tensor y = Float8LinearFunction::apply(x, weight, out);
  return bias.defined() ? y + bias.to(out) : y;
}

int64_t apply_float8(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& m : model.modules()) {
    auto* lin = m->as<LinearImpl>();
    if (lin == nullptr || !divides(lin->in_features) || !divides(lin->out_features)) continue;
    lin->float8 = true;
    ++n;
  }
  return n;
}

std::string float8_unsupported_reason(const at::Device& device) {
  if (!device.is_cuda()) {
    return "float8 GEMMs need an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); this run is "
           "on the CPU, where ATen only emulates them";
  }
  try {
    const at::Tensor a = at::ones({16, 16}, at::TensorOptions().device(device)).to(at::kFloat8_e4m3fn);
    const at::Tensor one = at::ones({}, at::TensorOptions().device(device));
    (void)at::_scaled_mm(a, a.t(), one, one, {}, {}, at::kBFloat16, false);
  } catch (const c10::Error& e) {
    const std::string_view what = e.what_without_backtrace();
    return fmt::format("this GPU does not run float8 GEMMs (compute capability 8.9 or newer is needed): {}",
                       what.substr(0, what.find('\n')));
  }
  return "";
}

}  // namespace tessera::models
