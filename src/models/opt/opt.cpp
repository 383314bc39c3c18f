// The OPT family: options (recipe and config.json), the decoder layer, learned positions with transformers' offset of
// 2, the projections of OPT-350M.
#include "models/opt/opt.h"

#include <fmt/format.h>

#include "tessera/config/value.h"
#include "tessera/models/family_support.h"

namespace tessera::models {
namespace {

constexpr int64_t kOptPositionOffset = 2;  // OPTLearnedPositionalEmbedding.offset
constexpr double kOptNormEps = 1e-5;       // nn.LayerNorm's default: OPT has no eps key

}  // namespace

// ---- Options --------------------------------------------------------------------------------------------------------

// OPTConfig's keys. The published configs also carry activation_dropout, which transformers' OPT classes do not read.
const FamilyKeys<OPTOptions>& opt_keys() {
  using O = OPTOptions;
  static const FamilyKeys<O> keys =
      FamilyKeys<O>({"opt"}, [](const std::string&) { return "OPTForCausalLM"; })
          .field("vocab_size", &O::vocab_size, positive())
          .field("hidden_size", &O::hidden_size, positive())
          .field("num_hidden_layers", &O::num_hidden_layers, positive())
          .field("ffn_dim", &O::intermediate_size, positive())
          .field("max_position_embeddings", &O::max_position_embeddings, positive())
          .field("do_layer_norm_before", &O::do_layer_norm_before)
          .field("_remove_final_layer_norm", &O::remove_final_layer_norm)
          .resolved(
              "word_embed_proj_dim", &O::word_embed_proj_dim, [](const O& o) { return o.hidden_size; }, positive())
          .field("dropout", &O::dropout, probability())
          .field("attention_dropout", &O::attention_dropout, probability())
          .field("num_attention_heads", &O::num_attention_heads, positive())
          .divides("num_attention_heads", &O::num_attention_heads, "hidden_size", &O::hidden_size)
          .field("activation_function", &O::activation_function, hf_activation_check())
          .fixed("layerdrop", 0.0, "Tessera's OPT does not drop layers at random (LayerDrop); set 0")
          .field("init_std", &O::initializer_range)
          .field("enable_bias", &O::enable_bias)
          .fixed("layer_norm_elementwise_affine", true,
                 "LayerNorms without weight and bias are not computed by Tessera's OPT")
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .token_ids()
          .pad_token_below_vocab()
          .hf_accepts({"activation_dropout"});
  return keys;
}

// ---- Modules --------------------------------------------------------------------------------------------------------

OPTDecoderLayerImpl::OPTDecoderLayerImpl(const OPTOptions& o, const at::TensorOptions& t) : o_(o) {
  self_attn = register_module("self_attn", SelfAttention(SelfAttentionOptions{.hidden_size = o.hidden_size,
                                                                              .heads = o.num_attention_heads,
                                                                              .qkv_bias = o.enable_bias,
                                                                              .out_bias = o.enable_bias,
                                                                              .out_name = "out_proj",
                                                                              .kv_first = true,
                                                                              .dropout = o.attention_dropout},
                                                         t));
  self_attn_layer_norm =
      register_module("self_attn_layer_norm", Norm(o.hidden_size, NormType::kLayerNorm, kOptNormEps, true, t));
  fc1 = register_module("fc1", Linear(o.hidden_size, o.intermediate_size, o.enable_bias, t));
  fc2 = register_module("fc2", Linear(o.intermediate_size, o.hidden_size, o.enable_bias, t));
  final_layer_norm =
      register_module("final_layer_norm", Norm(o.hidden_size, NormType::kLayerNorm, kOptNormEps, true, t));
}

at::Tensor OPTDecoderLayerImpl::forward(const at::Tensor& x, const AttentionInputs& in, LayerCache* cache) {
  const bool training = is_training(), pre = o_.do_layer_norm_before;
  at::Tensor h = x + at::dropout(self_attn(pre ? self_attn_layer_norm(x) : x, in, cache), o_.dropout, training);
  if (!pre) h = self_attn_layer_norm(h);
  const at::Tensor mlp = fc2(hf_activation(o_.activation_function, fc1(pre ? final_layer_norm(h) : h)));
  h = h + at::dropout(mlp, o_.dropout, training);
  return pre ? h : final_layer_norm(h);
}

OPTForCausalLMImpl::OPTForCausalLMImpl(const OPTOptions& o)
    : HfDecoderLM(o, opt_keys(),
                  {.root = "model.decoder",
                   .embed_dim = o.word_embed_proj_dim,
                   .positions = "embed_positions",
                   .position_offset = kOptPositionOffset,
                   .norm = "final_layer_norm"}) {
  const at::TensorOptions t = tensor_options();
  build_backbone([&](int64_t) { return OPTDecoderLayer(o, t); },
                 o.final_norm() ? Norm(o.hidden_size, NormType::kLayerNorm, kOptNormEps, true, t) : Norm(nullptr));
  if (o.projects()) {
    project_out = model->register_module("project_out", Linear(o.hidden_size, o.word_embed_proj_dim, false, t));
    project_in = model->register_module("project_in", Linear(o.word_embed_proj_dim, o.hidden_size, false, t));
  }
}

at::Tensor OPTForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  // transformers counts each row's real tokens (cumsum of the mask); padding positions, whose outputs nothing reads,
  // differ.
  const at::Tensor x = model->embed_tokens(ids);
  return (project_in ? project_in(x) : x) + model->positions(call.positions + kOptPositionOffset);
}

at::Tensor OPTForCausalLMImpl::head(const at::Tensor& h) {
  const at::Tensor y = model->norm ? model->norm(h) : h;
  return head_logits(project_out ? project_out(y) : y, lm_head);
}

void OPTForCausalLMImpl::plan_layer(TensorParallelPlan& plan, const std::string& p, int64_t /*i*/) const {
  plan.layer(p, {"self_attn_layer_norm", "final_layer_norm"},
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "fc1"}, {"self_attn.out_proj", "fc2"});
}

std::string OPTForCausalLMImpl::describe_more() const {
  return fmt::format("{}, {}, {}", o_.projects() ? fmt::format(", embeddings of {}", o_.word_embed_proj_dim) : "",
                     o_.do_layer_norm_before ? "pre-LN" : "post-LN", o_.activation_function);
}

}  // namespace tessera::models
