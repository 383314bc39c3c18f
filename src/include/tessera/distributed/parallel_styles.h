// Tensor and sequence parallelism applied from outside the model, as torchtitan's parallelize_module applies a plan:
// the styles that run a family's planned modules on this rank's slices (models/parallel_plan.h), the parameter
// splits a plan makes, and the state the styles share with the engine's unit runner. Internal to the engine and the
// planner.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tessera/distributed/parallel_ops.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::dist {

// What a model's styles share with the sharding engine, which sets the per-call flags.
struct TensorParallelState {
  std::shared_ptr<dist::TensorParallelGroup> group;
  bool sequence_parallel = false;  // parallelism.sequence_parallel
  // The decoder layer running now holds this rank's share of the positions (the engine scatters the sequence before
  // the first layer and gathers it after the last, where it divides by the group's size).
  bool sharded = false;
  // A training forward whose loss is computed from each rank's share of the vocabulary's logits (loss parallel): the
  // head returns that share instead of gathering the logits.
  bool local_logits = false;
  // The plan splits the head (and a tied table) along the vocabulary of this many rows; 0: it stays whole.
  int64_t vocab = 0;
};

// The family's plan for `degree` ranks (models::TensorParallelModel); ConfigError naming `key` for a model without one.
models::TensorParallelPlan tensor_parallel_plan_of(const models::CausalLM& model, int64_t degree,
                                                   const std::string& key);

// The parameter splits `plan` makes on `model`, by parameter name. Throws naming `key` and the module for an entry that
// names no module or one of another kind than its style takes (Error), a split that does not divide by `degree`
// (ConfigError), and a Linear or Norm inside a decoder layer (a unit other than the root) that the plan leaves out
// (ConfigError: it would run whole on split or sharded activations and get a partial gradient).
std::map<std::string, dist::TensorParallelSplit> tensor_parallel_splits(const models::CausalLM& model,
                                                                        const models::TensorParallelPlan& plan,
                                                                        int64_t degree, const std::string& key);

// Installs on each module of `plan` the style that runs it over `state` (after the engine left this rank's slices in
// the split weights). Sets state->vocab when the plan splits the vocabulary.
void install_tensor_parallel_styles(models::CausalLM& model, const models::TensorParallelPlan& plan,
                                    const std::shared_ptr<TensorParallelState>& state);

}  // namespace tessera::dist
