// Tensor parallelism's two boundary functions and the split Linear layers (see tensor_parallel.h).
#include "tessera/models/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include "tessera/models/layers.h"

namespace tessera::models {
namespace {

at::Tensor summed(const at::Tensor& x, TensorParallelGroup* group) {
  at::Tensor t = x.contiguous().clone();
  group->all_reduce(t);
  return t;
}

struct EnterFunction : public torch::autograd::Function<EnterFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, TensorParallelGroup* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<TensorParallelGroup*>(ctx->saved_data["group"].toInt());
    // Every rank of the group runs this backward: each one's share of the outputs reaches the loss.
    return {grads[0].defined() ? summed(grads[0], group) : at::Tensor(), at::Tensor()};
  }
};

struct ExitFunction : public torch::autograd::Function<ExitFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, TensorParallelGroup* group) {
    (void)ctx;
    return summed(x, group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    (void)ctx;
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

at::Tensor tensor_parallel_enter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group || group->size() == 1) return x;
  return EnterFunction::apply(x, group.get());
}

at::Tensor tensor_parallel_exit(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group || group->size() == 1) return x;
  return ExitFunction::apply(x, group.get());
}

at::Tensor column_parallel(LinearImpl& layer, const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group) return layer.forward(x);
  return at::linear(tensor_parallel_enter(x, group), layer.weight, layer.bias);
}

at::Tensor row_parallel(LinearImpl& layer, const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group) return layer.forward(x);
  at::Tensor y = tensor_parallel_exit(at::linear(x, layer.weight), group);
  return layer.bias.defined() ? y + layer.bias : y;
}

void add_column_parallel(std::vector<TensorParallelSplit>& plan, const std::string& prefix, const LinearImpl& layer,
                         std::vector<int64_t> blocks) {
  plan.push_back({prefix + ".weight", 0, blocks});
  if (layer.bias.defined()) plan.push_back({prefix + ".bias", 0, std::move(blocks)});
}

void add_row_parallel(std::vector<TensorParallelSplit>& plan, const std::string& prefix) {
  plan.push_back({prefix + ".weight", 1, {}});
}

}  // namespace tessera::models
