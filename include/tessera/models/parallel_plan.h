// A family's tensor-parallel plan, as data: which of its modules split over a tensor-parallel group of T ranks and
// how. The family declares it (TensorParallelModel below); the sharding engine applies it from outside the model
// (distributed/parallel_styles.h, as torchtitan's parallelize_module does): it keeps this rank's slice of each split
// weight and installs on each listed module a style that runs it on its slice with the group's collectives. Model
// code stays as it is for one process, with no collective in it: it reads head counts and sequence lengths from the
// tensors its modules return, not from its options.
//
// What each style means (Megatron-LM's scheme):
//   - kColumn (a Linear): the weight's rows (and the bias) split, in `blocks` (a fused query/key/value weight: the
//     query, key and value blocks, each cut in T so that a rank holds whole heads of each); the input is whole.
//   - kRow (a Linear): the weight's columns split; the partial outputs are summed over the group, the bias added once.
//   - kSequenceNorm (a Norm on the residual stream): under sequence parallelism it runs on this rank's share of the
//     positions, and its weights' gradients are summed over the group.
//   - kHeadNorm (a Norm over each head's features, after a column-parallel projection: Qwen3's and Gemma 3's q/k
//     norms): it sees this rank's heads only, so its weights' gradients are summed over the group.
//   - kFeatureNorm (an RMSNorm over all the heads' features of a column-parallel projection: OLMo 2's q/k norms): its
//     weight split with the projection's rows; the mean of squares taken over the whole width (each rank's sum of
//     squares gathered over the group).
//   - kVocabEmbedding (an Embedding tied to the head): the table's rows split along the vocabulary; its lookup sums
//     the ranks' rows, and its attend() (the tied head) yields this rank's share of the logits.
//   - kVocabHead (an untied head's Linear): the rows split along the vocabulary.
// Where the vocabulary does not divide by T the head and table stay whole (omit them from the plan).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace tessera::models {

enum class ParallelStyle { kColumn, kRow, kSequenceNorm, kHeadNorm, kFeatureNorm, kVocabEmbedding, kVocabHead };

struct ParallelPlanEntry {
  std::string module;  // a named_modules() key ("model.layers.0.self_attn.q_proj")
  ParallelStyle style = ParallelStyle::kColumn;
  std::vector<int64_t> blocks;  // kColumn: the row blocks of a fused weight (empty: one block)
};

struct TensorParallelPlan {
  std::vector<ParallelPlanEntry> entries;
  void column(const std::string& module, std::vector<int64_t> blocks = {}) {
    entries.push_back({module, ParallelStyle::kColumn, std::move(blocks)});
  }
  void row(const std::string& module) { entries.push_back({module, ParallelStyle::kRow, {}}); }
  void sequence_norm(const std::string& module) { entries.push_back({module, ParallelStyle::kSequenceNorm, {}}); }
  void head_norm(const std::string& module) { entries.push_back({module, ParallelStyle::kHeadNorm, {}}); }
  void feature_norm(const std::string& module) { entries.push_back({module, ParallelStyle::kFeatureNorm, {}}); }
  void vocab_embedding(const std::string& module) { entries.push_back({module, ParallelStyle::kVocabEmbedding, {}}); }
  void vocab_head(const std::string& module) { entries.push_back({module, ParallelStyle::kVocabHead, {}}); }
  // The usual entries of one decoder layer whose modules are named `prefix`…: `norms` on sequence shards, `columns`
  // column-parallel (projections that hold whole heads or hidden units, one block each), `rows` row-parallel.
  void layer(const std::string& prefix, std::initializer_list<const char*> norms,
             std::initializer_list<const char*> columns, std::initializer_list<const char*> rows) {
    for (const char* n : norms) sequence_norm(prefix + n);
    for (const char* c : columns) column(prefix + c);
    for (const char* r : rows) row(prefix + r);
  }
  // The head along a vocabulary of `vocab` rows where it divides by `degree` (else it stays whole): the untied `head`
  // Linear, or, when `head` is empty, the `embedding` table it is tied to.
  void vocabulary(int64_t vocab, int64_t degree, const std::string& head, const std::string& embedding) {
    if (vocab % degree != 0) return;
    if (head.empty()) {
      vocab_embedding(embedding);
    } else {
      vocab_head(head);
    }
  }
};

// The capability a family implements to get tensor (and sequence) parallelism: its plan for a group of `degree`
// ranks. Throws ConfigError naming what does not divide (heads, hidden units) or which option forbids it. Every Linear
// and Norm inside the decoder layers must be in the plan (the engine refuses a plan that leaves one out, since it
// would compute a partial gradient unnoticed).
class TensorParallelModel {
 public:
  virtual ~TensorParallelModel() = default;
  virtual TensorParallelPlan tensor_parallel_plan(int64_t degree) const = 0;
};

// Whole heads of `count` (the model's query or key/value heads) in `width` features of a projection's output whose
// whole width would be `whole_width`: count * width / whole_width (the heads this rank holds under a column split).
inline int64_t heads_in(int64_t count, int64_t width, int64_t whole_width) {
  return count * width / whole_width;
}

}  // namespace tessera::models
