// The differentiable collectives of tensor, sequence, context and vocabulary parallelism (see parallel_ops.h).
#include "tessera/distributed/parallel_ops.h"

#include <torch/csrc/autograd/custom_function.h>

#include "tessera/data/batch.h"

namespace tessera::dist {
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

// Dimension `dim` of x through a dimension-0 collective of the group.
at::Tensor gather_dim(const at::Tensor& x, int64_t dim, TensorParallelGroup* group) {
  return group->all_gather(x.movedim(dim, 0).contiguous()).movedim(0, dim);
}
at::Tensor reduce_scatter_dim(const at::Tensor& x, int64_t dim, TensorParallelGroup* group) {
  return group->reduce_scatter(x.movedim(dim, 0).contiguous()).movedim(0, dim);
}
at::Tensor share_dim(const at::Tensor& x, int64_t dim, TensorParallelGroup* group) {
  const int64_t share = x.size(dim) / group->size();
  return x.narrow(dim, group->rank() * share, share).contiguous();
}

// The four boundaries along one dimension (the sequence for sequence parallelism, the keys' positions for context
// parallelism, the vocabulary for the head): (forward, backward) = (share, all-gather), (all-gather, share),
// (all-gather, reduce-scatter), (reduce-scatter, all-gather).
enum class SeqOp { kScatter, kGather, kGatherToSplit, kReduceScatter };

struct SequenceFunction : public torch::autograd::Function<SequenceFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, TensorParallelGroup* group,
                            int64_t op, int64_t dim) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["op"] = op;
    ctx->saved_data["dim"] = dim;
    switch (static_cast<SeqOp>(op)) {
      case SeqOp::kScatter:
        return share_dim(x, dim, group);
      case SeqOp::kGather:
      case SeqOp::kGatherToSplit:
        return gather_dim(x, dim, group);
      case SeqOp::kReduceScatter:
        return reduce_scatter_dim(x, dim, group);
    }
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<TensorParallelGroup*>(ctx->saved_data["group"].toInt());
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const at::Tensor& g = grads[0];
    at::Tensor out;
    if (g.defined()) {
      switch (static_cast<SeqOp>(ctx->saved_data["op"].toInt())) {
        case SeqOp::kScatter:
        case SeqOp::kReduceScatter:
          out = gather_dim(g, dim, group);
          break;
        case SeqOp::kGather:
          out = share_dim(g, dim, group);
          break;
        case SeqOp::kGatherToSplit:
          out = reduce_scatter_dim(g, dim, group);
          break;
      }
    }
    return {out, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor sequence_op(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group, SeqOp op,
                       int64_t dim = 1) {
  return SequenceFunction::apply(x, group.get(), static_cast<int64_t>(op), dim);
}

}  // namespace

VocabShard vocab_shard(int64_t vocab, const TensorParallelGroup& group) {
  const int64_t rows = vocab / group.size();
  return {group.rank() * rows, rows};
}

at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& ids, int64_t vocab, int64_t padding_idx,
                                    const std::shared_ptr<TensorParallelGroup>& group) {
  const VocabShard v = vocab_shard(vocab, *group);
  const at::Tensor mine = ids.ge(v.start).logical_and(ids.lt(v.start + v.rows));
  const at::Tensor local = (ids - v.start).clamp(0, v.rows - 1);
  const int64_t pad = padding_idx >= v.start && padding_idx < v.start + v.rows ? padding_idx - v.start : -1;
  const at::Tensor rows = at::embedding(weight, local, pad) * mine.unsqueeze(-1).to(weight.scalar_type());
  return tensor_parallel_exit(rows, group);
}

at::Tensor gather_along(const at::Tensor& x, int64_t dim, const std::shared_ptr<TensorParallelGroup>& group,
                        bool sum_gradient) {
  if (!group || group->size() == 1) return x;
  return sequence_op(x, group, sum_gradient ? SeqOp::kGatherToSplit : SeqOp::kGather, dim);
}

at::Tensor vocab_gather(const at::Tensor& local_logits, const std::shared_ptr<TensorParallelGroup>& group) {
  return gather_along(local_logits, local_logits.dim() - 1, group, /*sum_gradient=*/false);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets, int64_t vocab,
                                        double label_smoothing, double z_loss,
                                        const std::shared_ptr<TensorParallelGroup>& group) {
  const VocabShard v = vocab_shard(vocab, *group);
  const at::Tensor l = local_logits.to(at::kFloat).reshape({-1, local_logits.size(-1)});  // (N, V / T)
  const int64_t n = l.size(0);
  // The max over the whole vocabulary (a shift for stability; no gradient flows through it).
  const at::Tensor maxes = group->all_gather(std::get<0>(l.detach().max(1)).view({1, n}).contiguous());  // (T, N)
  const at::Tensor m = std::get<0>(maxes.max(0));                                                        // (N)
  const at::Tensor sum_exp = tensor_parallel_exit((l - m.unsqueeze(1)).exp().sum(1), group);
  const at::Tensor lse = sum_exp.log() + m;  // log Z per position
  const at::Tensor keep = targets.ne(data::kIgnoreLabel);
  const at::Tensor mine = keep.logical_and(targets.ge(v.start)).logical_and(targets.lt(v.start + v.rows));
  const at::Tensor local = (targets - v.start).clamp(0, v.rows - 1).unsqueeze(1);
  const at::Tensor target_logit =
      tensor_parallel_exit(l.gather(1, local).squeeze(1) * mine.to(at::kFloat), group);  // the owner's value
  const at::Tensor kept = keep.to(at::kFloat);
  at::Tensor loss = ((lse - target_logit) * kept).sum() * (1.0 - label_smoothing);
  if (label_smoothing > 0) {  // torch's: + eps * (log Z - mean over the vocabulary of the logits)
    const at::Tensor mean_logit = tensor_parallel_exit(l.sum(1), group) / static_cast<double>(vocab);
    loss = loss + label_smoothing * ((lse - mean_logit) * kept).sum();
  }
  if (z_loss != 0) loss = loss + z_loss * (lse.pow(2) * kept).sum();
  return loss;
}

at::Tensor sequence_scatter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group || group->size() == 1) return x;
  return sequence_op(x, group, SeqOp::kScatter);
}

at::Tensor sequence_gather(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group || group->size() == 1) return x;
  return sequence_op(x, group, SeqOp::kGather);
}

at::Tensor tensor_parallel_enter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group || group->size() == 1) return x;
  return EnterFunction::apply(x, group.get());
}

at::Tensor tensor_parallel_exit(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group || group->size() == 1) return x;
  return ExitFunction::apply(x, group.get());
}

at::Tensor sequence_reduce_scatter(const at::Tensor& x, const std::shared_ptr<TensorParallelGroup>& group) {
  if (!group || group->size() == 1) return x;
  return sequence_op(x, group, SeqOp::kReduceScatter);
}

}  // namespace tessera::dist
