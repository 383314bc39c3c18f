// The styles of tensor and sequence parallelism, and a plan's splits (see parallel_styles.h).
#include "tessera/distributed/parallel_styles.h"

#include <fmt/format.h>

#include <set>
#include <utility>

#include "tessera/models/blocks/layers.h"
#include "tessera/util/error.h"

namespace tessera::dist {
namespace {

using models::ParallelStyle;

// A column-parallel Linear: the whole input (all-gathered along the sequence when the layer runs on shards, its
// gradient reduce-scattered back; else entered, its gradient summed over the group) times this rank's rows.
class ColumnStyle : public models::LinearStyle {
 public:
  explicit ColumnStyle(std::shared_ptr<TensorParallelState> state) : state_(std::move(state)) {}
  at::Tensor forward(models::LinearImpl& layer, const at::Tensor& x) override {
    const at::Tensor in = state_->sharded ? dist::gather_along(x, 1, state_->group, /*sum_gradient=*/true)
                                          : dist::tensor_parallel_enter(x, state_->group);
    return at::linear(in, layer.weight, layer.bias);
  }

 private:
  std::shared_ptr<TensorParallelState> state_;
};

// A row-parallel Linear: this rank's share of the inputs times its columns, summed over the group (reduce-scattered
// along the sequence when the layer runs on shards); the bias, whole, added once (its gradient summed over the group
// when it meets this rank's positions only).
class RowStyle : public models::LinearStyle {
 public:
  explicit RowStyle(std::shared_ptr<TensorParallelState> state) : state_(std::move(state)) {}
  at::Tensor forward(models::LinearImpl& layer, const at::Tensor& x) override {
    const at::Tensor partial = at::linear(x, layer.weight);
    if (!state_->sharded) {
      const at::Tensor y = dist::tensor_parallel_exit(partial, state_->group);
      return layer.bias.defined() ? y + layer.bias : y;
    }
    const at::Tensor y = dist::sequence_reduce_scatter(partial, state_->group);
    return layer.bias.defined() ? y + dist::tensor_parallel_enter(layer.bias, state_->group) : y;
  }

 private:
  std::shared_ptr<TensorParallelState> state_;
};

// A norm whose weights meet part of the activations on each rank: this rank's positions (kSequenceNorm, when the layer
// runs on shards) or its heads (kHeadNorm, always); their gradients are summed over the group.
class SummedNormStyle : public models::NormStyle {
 public:
  SummedNormStyle(std::shared_ptr<TensorParallelState> state, bool always)
      : state_(std::move(state)), always_(always) {}
  at::Tensor forward(models::NormImpl& norm, const at::Tensor& x) override {
    if (!always_ && !state_->sharded) return norm.forward_with(x, norm.weight, norm.bias);
    const auto& g = state_->group;
    const at::Tensor bias = norm.bias.defined() ? dist::tensor_parallel_enter(norm.bias, g) : at::Tensor();
    return norm.forward_with(x, dist::tensor_parallel_enter(norm.weight, g), bias);
  }

 private:
  std::shared_ptr<TensorParallelState> state_;
  bool always_;
};

// An RMSNorm over features split across the group (kFeatureNorm): this rank's features and its slice of the weight,
// normalised by the mean of squares over every rank's features. Each rank's sum of squares is gathered and summed;
// the gather's backward sums each rank's gradient of the total, since every rank's output depends on it.
class FeatureNormStyle : public models::NormStyle {
 public:
  explicit FeatureNormStyle(std::shared_ptr<TensorParallelState> state) : state_(std::move(state)) {}
  at::Tensor forward(models::NormImpl& norm, const at::Tensor& x) override {
    const at::Tensor f = x.to(at::kFloat);
    const int64_t last = f.dim() - 1;
    const at::Tensor squares = dist::gather_along(f.pow(2).sum(last, /*keepdim=*/true), last, state_->group,
                                                  /*sum_gradient=*/true)
                                   .sum(last, /*keepdim=*/true);
    const double width = static_cast<double>(x.size(last) * state_->group->size());
    return (f * at::rsqrt(squares / width + norm.eps)).to(x.scalar_type()) * norm.weight;
  }

 private:
  std::shared_ptr<TensorParallelState> state_;
};

// A head holding this rank's rows of the vocabulary: its share of the logits, gathered unless the loss takes shares.
at::Tensor vocab_head(const TensorParallelState& state, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor logits = at::linear(dist::tensor_parallel_enter(x, state.group), w, b);
  return state.local_logits ? logits : dist::vocab_gather(logits, state.group);
}

class VocabHeadStyle : public models::LinearStyle {
 public:
  explicit VocabHeadStyle(std::shared_ptr<TensorParallelState> state) : state_(std::move(state)) {}
  at::Tensor forward(models::LinearImpl& layer, const at::Tensor& x) override {
    return vocab_head(*state_, x, layer.weight, layer.bias);
  }

 private:
  std::shared_ptr<TensorParallelState> state_;
};

// An embedding table tied to the head, split along the vocabulary.
class VocabEmbeddingStyle : public models::EmbeddingStyle {
 public:
  explicit VocabEmbeddingStyle(std::shared_ptr<TensorParallelState> state) : state_(std::move(state)) {}
  at::Tensor forward(models::EmbeddingImpl& e, const at::Tensor& ids) override {
    return dist::vocab_parallel_embedding(e.weight, ids, state_->vocab, e.padding_idx, state_->group);
  }
  at::Tensor attend(models::EmbeddingImpl& e, const at::Tensor& x) override {
    return vocab_head(*state_, x, e.weight, at::Tensor());
  }

 private:
  std::shared_ptr<TensorParallelState> state_;
};

const char* style_name(ParallelStyle s) {
  switch (s) {
    case ParallelStyle::kColumn:
      return "column-parallel";
    case ParallelStyle::kRow:
      return "row-parallel";
    case ParallelStyle::kSequenceNorm:
      return "sequence-parallel norm";
    case ParallelStyle::kHeadNorm:
      return "head norm";
    case ParallelStyle::kFeatureNorm:
      return "feature-split RMSNorm";
    case ParallelStyle::kVocabEmbedding:
      return "vocabulary-parallel embedding";
    case ParallelStyle::kVocabHead:
      return "vocabulary-parallel head";
  }
  return "?";
}

// The module `entry` names, checked to be of the kind its style takes.
std::shared_ptr<torch::nn::Module> planned_module(const std::map<std::string, std::shared_ptr<torch::nn::Module>>& all,
                                                  const models::ParallelPlanEntry& entry, const std::string& key) {
  const auto it = all.find(entry.module);
  if (it == all.end()) {
    throw Error("dist",
                fmt::format("{}: the model's plan names {}, which is not one of its modules", key, entry.module));
  }
  bool fits = false;
  switch (entry.style) {
    case ParallelStyle::kColumn:
    case ParallelStyle::kRow:
    case ParallelStyle::kVocabHead:
      fits = it->second->as<models::LinearImpl>() != nullptr;
      break;
    case ParallelStyle::kSequenceNorm:
    case ParallelStyle::kHeadNorm:
      fits = it->second->as<models::NormImpl>() != nullptr;
      break;
    case ParallelStyle::kFeatureNorm: {
      const auto* n = it->second->as<models::NormImpl>();
      fits = n != nullptr && n->type == models::NormType::kRMSNorm;
      break;
    }
    case ParallelStyle::kVocabEmbedding:
      fits = it->second->as<models::EmbeddingImpl>() != nullptr;
      break;
  }
  if (!fits) {
    throw Error("dist", fmt::format("{}: the model's plan makes {} a {}, which it is not (a Linear, Norm or Embedding "
                                    "of Tessera's blocks)",
                                    key, entry.module, style_name(entry.style)));
  }
  return it->second;
}

std::map<std::string, std::shared_ptr<torch::nn::Module>> modules_of(const models::CausalLM& model) {
  std::map<std::string, std::shared_ptr<torch::nn::Module>> out;
  for (const auto& m : model.named_modules()) out[m.key()] = m.value();
  return out;
}

}  // namespace

models::TensorParallelPlan tensor_parallel_plan_of(const models::CausalLM& model, int64_t degree,
                                                   const std::string& key) {
  const auto* planner = dynamic_cast<const models::TensorParallelModel*>(&model);
  if (planner == nullptr) {
    throw ConfigError("dist", fmt::format("{}: model family \"{}\" declares no tensor-parallel plan "
                                          "(models::TensorParallelModel, models/parallel_plan.h)",
                                          key, model.family()));
  }
  return planner->tensor_parallel_plan(degree);
}

std::map<std::string, dist::TensorParallelSplit> tensor_parallel_splits(const models::CausalLM& model,
                                                                        const models::TensorParallelPlan& plan,
                                                                        int64_t degree, const std::string& key) {
  const auto modules = modules_of(model);
  std::map<std::string, dist::TensorParallelSplit> out;
  std::set<std::string> planned;
  auto add = [&](const std::string& param, int64_t dim, std::vector<int64_t> blocks) {
    out[param] = dist::TensorParallelSplit{param, dim, std::move(blocks)};
  };
  for (const models::ParallelPlanEntry& e : plan.entries) {
    const auto m = planned_module(modules, e, key);
    planned.insert(e.module);
    const std::string p = e.module.empty() ? "" : e.module + ".";
    switch (e.style) {
      case ParallelStyle::kColumn:
      case ParallelStyle::kVocabHead: {
        const auto* l = m->as<models::LinearImpl>();
        add(p + "weight", 0, e.blocks);
        if (l->bias.defined()) add(p + "bias", 0, e.blocks);
        break;
      }
      case ParallelStyle::kRow:
        add(p + "weight", 1, {});
        break;
      case ParallelStyle::kVocabEmbedding:
      case ParallelStyle::kFeatureNorm:
        add(p + "weight", 0, {});
        break;
      case ParallelStyle::kSequenceNorm:
      case ParallelStyle::kHeadNorm:
        break;
    }
  }
  // Every split must divide: each block of its dimension into `degree` equal parts.
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  for (const auto& [name, s] : out) {
    const std::vector<int64_t>& shape = shapes.at(name);
    const int64_t size = shape.at(static_cast<size_t>(s.dim));
    int64_t total = 0;
    for (int64_t b : s.blocks.empty() ? std::vector<int64_t>{size} : s.blocks) {
      if (b % degree != 0) {
        throw ConfigError("dist", fmt::format("{}: {} has a block of {} along dimension {}, not a multiple of it", key,
                                              name, b, s.dim));
      }
      total += b;
    }
    if (total != size) {
      throw Error("dist", fmt::format("{}: the model's plan cuts {} into blocks of {} elements in all, but its "
                                      "dimension {} has {}",
                                      key, name, total, s.dim, size));
    }
  }
  // Inside the decoder layers, every Linear and Norm must be planned.
  for (const auto& [name, m] : modules) {
    if (m->as<models::LinearImpl>() == nullptr && m->as<models::NormImpl>() == nullptr) continue;
    if (planned.count(name) || name.empty() || model.unit_of_parameter(name + ".weight") == 0) continue;
    throw ConfigError("dist", fmt::format("{}: the {} family's plan does not say how {} runs over a tensor-parallel "
                                          "group (models/parallel_plan.h)",
                                          key, model.family(), name));
  }
  return out;
}

void install_tensor_parallel_styles(models::CausalLM& model, const models::TensorParallelPlan& plan,
                                    const std::shared_ptr<TensorParallelState>& state) {
  const auto modules = modules_of(model);
  for (const models::ParallelPlanEntry& e : plan.entries) {
    const auto m = planned_module(modules, e, "parallelism.tensor_parallel_degree");
    switch (e.style) {
      case ParallelStyle::kColumn:
        m->as<models::LinearImpl>()->style = std::make_shared<ColumnStyle>(state);
        break;
      case ParallelStyle::kRow:
        m->as<models::LinearImpl>()->style = std::make_shared<RowStyle>(state);
        break;
      case ParallelStyle::kVocabHead:
        m->as<models::LinearImpl>()->style = std::make_shared<VocabHeadStyle>(state);
        state->vocab = model.vocab_size();
        break;
      case ParallelStyle::kSequenceNorm:
      case ParallelStyle::kHeadNorm:
        m->as<models::NormImpl>()->style =
            std::make_shared<SummedNormStyle>(state, e.style == ParallelStyle::kHeadNorm);
        break;
      case ParallelStyle::kFeatureNorm:
        m->as<models::NormImpl>()->style = std::make_shared<FeatureNormStyle>(state);
        break;
      case ParallelStyle::kVocabEmbedding:
        m->as<models::EmbeddingImpl>()->style = std::make_shared<VocabEmbeddingStyle>(state);
        state->vocab = model.vocab_size();
        break;
    }
  }
}

}  // namespace tessera::dist
