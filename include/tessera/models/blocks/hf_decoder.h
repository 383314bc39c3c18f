// The transformers-style decoder causal LM most families are, once: a backbone module (`model`: the token embedding,
// any learned position table, the decoder layers, the final norm) and an untied head `lm_head`, under the family's
// names, with everything the model protocol asks of such a model derived from the family's options and key table: the
// config.json it writes, the tied head's name, transformers' initialisation, rebuild() on another device, FLOPs per
// token, describe(), the embedding, the causal masks and rotary tables of a forward, and a tensor-parallel plan built
// layer by layer. A family derives FooForCausalLMImpl from HfDecoderLM<FooForCausalLMImpl, FooOptions,
// FooDecoderLayerImpl>, calls build_backbone() in its constructor with a maker of its layer, sets the rotary tables
// (inv_freq_) and window it uses, and overrides only what differs (embedding or logit scaling, another layer's plan).
// The options must have vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
// max_position_embeddings, tie_word_embeddings, pad_token_id, initializer_range and init_device: transformers'
// canonical names, as its attribute_map gives them (GPT-2's n_embd is hidden_size; the key table maps the config's own
// key to the member); num_key_value_heads (or a kv_heads() function), head_dim (a member or a function) and model_type
// are read where they exist.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/modules/container/modulelist.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <concepts>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/parallel_plan.h"

namespace tessera::models {

// Where a family's backbone modules sit: <root>.<embed>, <root>.<positions>, <root>.<layers>.{i}, <root>.<norm>, and
// the untied head.
struct HfDecoderLayout {
  std::string root = "model";  // a path where the backbone is nested ("model.decoder": OPT)
  std::string embed = "embed_tokens";
  int64_t embed_dim = 0;        // the token embedding's (and an untied head's) width, where not hidden_size (OPT's)
  std::string positions{};      // a learned table of absolute positions (GPT-2's "wpe"); empty: none
  int64_t position_offset = 0;  // the table's row of position 0 (OPT's 2)
  std::string layers = "layers";
  std::string norm = "norm";
  std::string head = "lm_head";
  // transformers' nn.Embedding(vocab, hidden, padding_idx=pad_token_id): that row is zeroed and gets no gradient.
  bool padding_idx = true;

  // GPT-2's names (GPT-Neo, GPT-BigCode): transformer.wte, learned positions transformer.wpe, transformer.h.{i},
  // transformer.ln_f; an embedding without a padding row.
  static HfDecoderLayout gpt2() {
    return {
        .root = "transformer", .embed = "wte", .positions = "wpe", .layers = "h", .norm = "ln_f", .padding_idx = false};
  }
};

// The backbone, registered under the layout's names.
class HfBackboneImpl : public torch::nn::Module {
 public:
  Embedding embed_tokens{nullptr};
  Embedding positions{nullptr};  // learned absolute positions, when the layout has them
  torch::nn::ModuleList layers{nullptr};
  Norm norm{nullptr};  // null when the family has no final norm (OPT's post-LN models)
};
TORCH_MODULE(HfBackbone);

// The causal masks of `call` (windowed to `window` keys when positive) with rotary tables from `inv_freq` (float32,
// as transformers computes them), none when it is undefined; cos and sin times `table_scale` (YaRN's and longrope's
// attention factor).
inline AttentionInputs rotary_causal_inputs(const DecoderCall& call, const at::Tensor& inv_freq, int64_t window = 0,
                                            double table_scale = 1.0) {
  AttentionInputs in = causal_attention_inputs(call.ids, call.fo, call.past, call.key_mask, call.dtype, window);
  if (inv_freq.defined()) {
    set_rope_tables(in, call.positions, inv_freq);
    if (table_scale != 1.0) {
      in.rope_cos = in.rope_cos * table_scale;
      in.rope_sin = in.rope_sin * table_scale;
    }
  }
  return in;
}

template <class Derived, class Options, class Layer, class Inputs = AttentionInputs>
class HfDecoderLM : public DecoderLM<Layer, Inputs>, public TensorParallelModel {
 public:
  const Options& options() const { return o_; }

  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_seq_len() const override { return o_.max_position_embeddings; }
  // The model_type (the options' own where the family has several).
  std::string family() const override {
    if constexpr (requires(const Options& o) {
                    { o.model_type } -> std::convertible_to<std::string>;
                  }) {
      return o_.model_type;
    } else {
      return keys_->model_types().front();
    }
  }
  bool has_hf_format() const override { return true; }
  nlohmann::ordered_json hf_config(at::ScalarType dtype) const override {
    return keys_->hf_config(o_, family(), dtype);
  }
  std::optional<std::string> tied_embedding_name() const override {
    if (!o_.tie_word_embeddings) return std::nullopt;
    return layout_.root + "." + layout_.embed + ".weight";
  }
  // transformers' _init_weights: Linear and Embedding weights normal(0, initializer_range), biases 0, norms 1, the
  // padding row zeroed; each module from its own generator seeded from `seed` and its name.
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override {
    init_like_transformers(*this, seed, o_.initializer_range, select, std::nullopt);
  }
  std::shared_ptr<CausalLM> rebuild(const std::string& device, std::optional<uint64_t> seed) const override {
    Options o = o_;
    o.init_device = device;
    auto model = std::make_shared<Derived>(o);
    if (seed && device != "meta") model->init_weights(*seed);
    return model;
  }
  // 6 N (the parameters one token uses: a mixture of experts' active ones; less the lookups: an untied input
  // embedding, a position table) + 12 (heads x head_dim) x keys per layer (a windowed layer's: at most the window).
  double flops_per_token(int64_t seq_len) const override {
    int64_t n = active_params(*this);
    if (!o_.tie_word_embeddings) n -= model->embed_tokens->weight.numel();
    if (model->positions) n -= model->positions->weight.numel();
    double attention = 0;
    for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
      const int64_t keys = windowed(i) ? std::min(seq_len, window_) : seq_len;
      attention += 12.0 * static_cast<double>(o_.num_attention_heads * head_dim()) * static_cast<double>(keys);
    }
    return 6.0 * static_cast<double>(n) + attention;
  }
  std::string describe() const override {
    return fmt::format("{}: hidden {}, heads {} (kv {}, head_dim {}), layers {}, intermediate {}, vocab {}{}", family(),
                       o_.hidden_size, o_.num_attention_heads, kv_heads(), head_dim(), o_.num_hidden_layers,
                       o_.intermediate_size, o_.vocab_size, describe_more());
  }
  // The head (and a tied embedding) along the vocabulary where it divides; plan_layer() for each layer.
  TensorParallelPlan tensor_parallel_plan(int64_t degree) const override {
    check_tensor_parallel(degree);
    TensorParallelPlan plan;
    plan.vocabulary(o_.vocab_size, degree, lm_head ? layout_.head : "", layout_.root + "." + layout_.embed);
    for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
      plan_layer(plan, fmt::format("{}.{}.{}.", layout_.root, layout_.layers, i), i);
    }
    return plan;
  }

  HfBackbone model{nullptr};
  Linear lm_head{nullptr};  // only when tie_word_embeddings is false

 protected:
  HfDecoderLM(const Options& o, const FamilyKeys<Options>& keys, HfDecoderLayout layout = {})
      : DecoderLM<Layer, Inputs>(layout.root + "." + layout.layers + "."),
        o_(o),
        keys_(&keys),
        layout_(std::move(layout)) {}

  // Float32 on the options' init_device.
  at::TensorOptions tensor_options() const {
    return at::TensorOptions().dtype(at::kFloat).device(at::Device(o_.init_device));
  }
  // Registers the backbone (the token embedding, the position table, `layer(i)` for each of the num_hidden_layers
  // layers, `final_norm` unless null) and, unless the embedding is tied, the head.
  template <class MakeLayer>
  void build_backbone(MakeLayer layer, Norm final_norm) {
    const at::TensorOptions t = tensor_options();
    torch::nn::Module* parent = this;
    std::string name = layout_.root;
    for (size_t dot; (dot = name.find('.')) != std::string::npos; name = name.substr(dot + 1)) {
      parent = parent->register_module(name.substr(0, dot), std::make_shared<torch::nn::Module>()).get();
    }
    model = parent->register_module(name, HfBackbone());
    const int64_t width = layout_.embed_dim > 0 ? layout_.embed_dim : o_.hidden_size;
    model->embed_tokens = model->register_module(layout_.embed, Embedding(o_.vocab_size, width, t));
    if (layout_.padding_idx && o_.pad_token_id && *o_.pad_token_id >= 0 && *o_.pad_token_id < o_.vocab_size) {
      model->embed_tokens->padding_idx = *o_.pad_token_id;
    }
    if (!layout_.positions.empty()) {
      model->positions = model->register_module(
          layout_.positions, Embedding(o_.max_position_embeddings + layout_.position_offset, o_.hidden_size, t));
    }
    model->layers = model->register_module(layout_.layers, torch::nn::ModuleList());
    for (int64_t i = 0; i < o_.num_hidden_layers; ++i) model->layers->push_back(layer(i));
    if (!final_norm.is_empty()) model->norm = model->register_module(layout_.norm, std::move(final_norm));
    if (!o_.tie_word_embeddings) {
      lm_head = this->register_module(layout_.head, Linear(width, o_.vocab_size, false, t));
    }
  }

  const torch::nn::ModuleList& decoder_layers() const override { return model->layers; }
  EmbeddingImpl& token_embedding() override { return *model->embed_tokens; }
  // The tokens, plus their learned positions where the family has them.
  at::Tensor embed(const at::Tensor& ids, const DecoderCall& call) override {
    const at::Tensor x = model->embed_tokens(ids);
    return model->positions ? x + model->positions(call.positions + layout_.position_offset) : x;
  }
  at::Tensor head(const at::Tensor& h) override { return this->head_logits(model->norm ? model->norm(h) : h, lm_head); }
  // Causal masks with rotary tables from inv_freq_ (times rope_scale_), windowed to window_ keys when positive; with
  // global and local inputs, the local ones windowed (and rotated by local_inv_freq_ where it is set), the same as the
  // global ones when neither applies.
  Inputs attention_inputs(const DecoderCall& call) override {
    if constexpr (std::is_same_v<Inputs, GlobalLocalInputs>) {
      GlobalLocalInputs in;
      in.global = rotary_causal_inputs(call, inv_freq_, 0, rope_scale_);
      const bool differ = window_ > 0 || local_inv_freq_.defined();
      in.local = differ ? rotary_causal_inputs(call, local_inv_freq_.defined() ? local_inv_freq_ : inv_freq_, window_,
                                               rope_scale_)
                        : in.global;
      return in;
    } else if constexpr (std::is_same_v<Inputs, AttentionInputs>) {
      return rotary_causal_inputs(call, inv_freq_, window_, rope_scale_);
    } else {  // a family's own inputs, whose first member is the attention inputs (it overrides this to fill the rest)
      return Inputs{rotary_causal_inputs(call, inv_freq_, window_, rope_scale_)};
    }
  }

  // Refuses a degree the model cannot split over (refuse_tensor_parallel()). Default: the heads, key/value heads and
  // intermediate_size must divide.
  virtual void check_tensor_parallel(int64_t degree) const {
    check_tensor_parallel_split(degree, family(), o_.num_attention_heads, kv_heads(), o_.intermediate_size);
  }
  // One layer's plan (prefix `p`: "model.layers.{i}."). Default: Llama's layer (q/k/v and gate/up column-parallel,
  // o and down row-parallel, the two norms on sequence shards).
  virtual void plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t i) const {
    (void)i;
    plan.layer(p, {"input_layernorm", "post_attention_layernorm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"},
               {"self_attn.o_proj", "mlp.down_proj"});
  }
  // Whether layer `i` attends within window_ keys (with GlobalLocalInputs: reads the local inputs). Default: every
  // layer when there is a window.
  virtual bool windowed(int64_t i) const {
    (void)i;
    return window_ > 0;
  }
  // What describe() adds after the vocabulary (", <detail>").
  virtual std::string describe_more() const { return ""; }

  int64_t kv_heads() const {
    if constexpr (requires(const Options& o) { o.num_key_value_heads + 0; }) {
      return o_.num_key_value_heads;
    } else if constexpr (requires(const Options& o) { o.kv_heads() + 0; }) {
      return o_.kv_heads();
    } else {
      return o_.num_attention_heads;
    }
  }
  int64_t head_dim() const {
    if constexpr (requires(const Options& o) { o.head_dim + 0; }) {
      return o_.head_dim;
    } else if constexpr (requires(const Options& o) { o.head_dim(); }) {
      return o_.head_dim();
    } else {
      return o_.hidden_size / o_.num_attention_heads;
    }
  }

  Options o_;
  at::Tensor inv_freq_;        // the rotary tables' inverse frequencies (float32, on the CPU); undefined: no rotary
  at::Tensor local_inv_freq_;  // the local layers' (GlobalLocalInputs), when they differ
  int64_t window_ = 0;         // the sliding window of the (local) layers; 0: none
  double rope_scale_ = 1.0;    // the rotary tables' factor (YaRN's attention factor)

 private:
  const FamilyKeys<Options>* keys_;
  HfDecoderLayout layout_;
};

}  // namespace tessera::models
