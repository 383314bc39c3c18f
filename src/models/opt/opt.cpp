// The OPT family: options (recipe and config.json), modules, learned positions with transformers' offset of 2,
// initialisation.
#include "models/opt/opt.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "tessera/config/value.h"
#include "tessera/models/family_keys.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

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
          .field("ffn_dim", &O::ffn_dim, positive())
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
          .field("init_std", &O::init_std)
          .field("enable_bias", &O::enable_bias)
          .fixed("layer_norm_elementwise_affine", true,
                 "LayerNorms without weight and bias are not computed by Tessera's OPT")
          .field("tie_word_embeddings", &O::tie_word_embeddings)
          .token_ids()
          .pad_token_below_vocab();
  return keys;
}

OPTOptions parse_opt_options(config::Section& s) {
  OPTOptions o;
  opt_keys().read(s, o);
  return o;
}

OPTOptions opt_options_from_hf_config(const nlohmann::json& raw, const std::string& where) {
  return opt_keys().from_hf(raw, where, &parse_opt_options, {"activation_dropout"});
}

nlohmann::ordered_json opt_hf_config(const OPTOptions& o, at::ScalarType dtype) {
  return opt_keys().hf_config(o, "opt", dtype);
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
  fc1 = register_module("fc1", Linear(o.hidden_size, o.ffn_dim, o.enable_bias, t));
  fc2 = register_module("fc2", Linear(o.ffn_dim, o.hidden_size, o.enable_bias, t));
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

OPTDecoderImpl::OPTDecoderImpl(const OPTOptions& o, const at::TensorOptions& t) {
  embed_tokens = register_module("embed_tokens", Embedding(o.vocab_size, o.word_embed_proj_dim, t));
  if (o.pad_token_id) embed_tokens->padding_idx = *o.pad_token_id;  // nn.Embedding(..., padding_idx)
  embed_positions =
      register_module("embed_positions", Embedding(o.max_position_embeddings + kOptPositionOffset, o.hidden_size, t));
  if (o.projects()) {
    project_out = register_module("project_out", Linear(o.hidden_size, o.word_embed_proj_dim, false, t));
    project_in = register_module("project_in", Linear(o.word_embed_proj_dim, o.hidden_size, false, t));
  }
  if (o.final_norm()) {
    final_layer_norm =
        register_module("final_layer_norm", Norm(o.hidden_size, NormType::kLayerNorm, kOptNormEps, true, t));
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) layers->push_back(OPTDecoderLayer(o, t));
}

OPTModelImpl::OPTModelImpl(const OPTOptions& o, const at::TensorOptions& t) {
  decoder = register_module("decoder", OPTDecoder(o, t));
}

OPTForCausalLMImpl::OPTForCausalLMImpl(const OPTOptions& o) : DecoderLM("model.decoder.layers."), o_(o) {
  const at::TensorOptions t = at::TensorOptions().dtype(at::kFloat).device(at::Device(o.init_device));
  model = register_module("model", OPTModel(o, t));
  if (!o.tie_word_embeddings)
    lm_head = register_module("lm_head", Linear(o.word_embed_proj_dim, o.vocab_size, false, t));
}

at::Tensor OPTForCausalLMImpl::embed(const at::Tensor& ids, const DecoderCall& call) {
  // transformers counts each row's real tokens (cumsum of the mask) and offsets by 2; padding positions, whose
  // outputs nothing reads, differ.
  OPTDecoderImpl& d = *model->decoder;
  at::Tensor x = d.embed_tokens(ids);
  if (d.project_in) x = d.project_in(x);
  return x + d.embed_positions(call.positions + kOptPositionOffset);
}

at::Tensor OPTForCausalLMImpl::head(const at::Tensor& h) {
  OPTDecoderImpl& d = *model->decoder;
  at::Tensor y = d.final_layer_norm ? d.final_layer_norm(h) : h;
  if (d.project_out) y = d.project_out(y);
  return head_logits(y, lm_head);
}

double OPTForCausalLMImpl::flops_per_token(int64_t seq_len) const {
  // Embedding lookups (tokens and positions) cost no matmul FLOPs; a tied head's matmul is counted once.
  int64_t n = num_params() - (o_.max_position_embeddings + kOptPositionOffset) * o_.hidden_size;
  if (!o_.tie_word_embeddings) n -= o_.vocab_size * o_.word_embed_proj_dim;
  return 6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o_.num_hidden_layers) *
                                            static_cast<double>(o_.hidden_size) * static_cast<double>(seq_len);
}

void OPTForCausalLMImpl::init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select) {
  init_like_transformers(*this, seed, o_.init_std, select, std::nullopt);  // embed_tokens zeroes its padding_idx row
}

std::shared_ptr<CausalLM> OPTForCausalLMImpl::rebuild(const std::string& device, std::optional<uint64_t> seed) const {
  OPTOptions o = o_;
  o.init_device = device;
  return seed ? build_opt(o, *seed).ptr() : OPTForCausalLM(o).ptr();
}

std::string OPTForCausalLMImpl::describe() const {
  return fmt::format("opt: hidden {}, heads {} (head_dim {}), layers {}, ffn {}, vocab {}{}, {}, {}", o_.hidden_size,
                     o_.num_attention_heads, o_.head_dim(), o_.num_hidden_layers, o_.ffn_dim, o_.vocab_size,
                     o_.projects() ? fmt::format(" (embeddings of {})", o_.word_embed_proj_dim) : "",
                     o_.do_layer_norm_before ? "pre-LN" : "post-LN", o_.activation_function);
}

std::optional<std::string> OPTForCausalLMImpl::tied_embedding_name() const {
  if (!o_.tie_word_embeddings) return std::nullopt;
  return "model.decoder.embed_tokens.weight";
}

OPTForCausalLM build_opt(const OPTOptions& options, uint64_t seed) {
  return build_initialised<OPTForCausalLM>(options, seed);
}

TensorParallelPlan OPTForCausalLMImpl::tensor_parallel_plan(int64_t degree) const {
  check_tensor_parallel_split(degree, "OPT", o_.num_attention_heads, o_.num_attention_heads, o_.ffn_dim);
  TensorParallelPlan plan;
  plan.vocabulary(o_.vocab_size, degree, lm_head ? "lm_head" : "", "model.decoder.embed_tokens");
  for (int64_t i = 0; i < o_.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.decoder.layers.{}.", i);
    plan.layer(p, {"self_attn_layer_norm", "final_layer_norm"},
               {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "fc1"}, {"self_attn.out_proj", "fc2"});
  }
  return plan;
}

}  // namespace tessera::models
