// The gpt-oss family (OpenAI's gpt-oss-20b and gpt-oss-120b: `model_type: gpt_oss`) as LibTorch modules with
// transformers' module names, so named_parameters() gives the keys of GptOssForCausalLM folders:
// model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}, ....self_attn.sinks,
// ....mlp.router.{weight,bias}, ....mlp.experts.{gate_up_proj,gate_up_proj_bias,down_proj,down_proj_bias},
// ....{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight (untied only). The function is
// transformers' GptOssForCausalLM (4.57): grouped-query attention with biases and a learned sink logit per head in
// every softmax, sliding-window and full layers by layer_types, YaRN rotary (whose attention factor scales the
// tables), and in every layer a mixture of experts: a router with a bias, the softmax over each token's top-k logits,
// experts stored stacked (x @ W) with biases, whose gate and up projections interleave (gate = even columns, up = odd)
// and compute (clamp(up, ±7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7) (swiglu_limit, swiglu_alpha). With
// output_router_logits, transformers' load-balancing loss. GptOssForCausalLM implements the model protocol
// (causal_lm.h); `model.name: gpt_oss`. The published folders hold MXFP4-quantized experts (quantization_config), which
// are refused: Tessera reads bf16/fp32 folders (transformers' dequantized save). Not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/hf_decoder.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/blocks/moe.h"
#include "tessera/models/blocks/self_attention.h"
#include "tessera/models/capabilities.h"
#include "tessera/models/family_keys.h"

namespace tessera::models {

// transformers' GptOssConfig keys and defaults (gpt-oss-120b's shape).
struct GptOssOptions {
  int64_t vocab_size = 201088;
  int64_t hidden_size = 2880;
  int64_t intermediate_size = 2880;  // each expert's
  int64_t num_hidden_layers = 36;
  int64_t num_attention_heads = 64;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 64;
  int64_t num_local_experts = 128;
  int64_t num_experts_per_tok = 4;
  int64_t sliding_window = 128;
  std::vector<std::string> layer_types;  // resolved: sliding_attention for even layers, full_attention for odd
  double rope_theta = 150000.0;
  std::optional<YarnRope> yarn = YarnRope{.factor = 32.0,
                                          .original_max_position_embeddings = 4096,
                                          .beta_fast = 32.0,
                                          .beta_slow = 1.0,
                                          .truncate = false};  // rope_scaling; none: default rotary
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";  // transformers' experts do not read it
  double initializer_range = 0.02;
  int64_t max_position_embeddings = 131072;
  double rms_norm_eps = 1e-5;
  double attention_dropout = 0.0;
  bool attention_bias = true;
  double router_aux_loss_coef = 0.9;
  bool output_router_logits = false;
  // The experts' (clamp(up, ±limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit): transformers 5's keys (4.57
  // fixes them at these values).
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  std::string init_device = "cpu";  // cpu | cuda | meta

  bool sliding(int64_t layer) const { return layer_types[static_cast<size_t>(layer)] == "sliding_attention"; }
};

// GptOssConfig's keys: the recipe reader, the config.json reader and writer.
const FamilyKeys<GptOssOptions>& gpt_oss_keys();

// The stacked experts (GptOssExperts): gate_up_proj (E, d, 2F), gate_up_proj_bias (E, 2F), down_proj (E, F, d),
// down_proj_bias (E, d); under expert parallelism this rank's E / P of each.
class GptOssExpertsImpl : public torch::nn::Module {
 public:
  GptOssExpertsImpl(const GptOssOptions& o, const at::TensorOptions& t);
  // rows grouped by local expert, `n` rows each ((local,) int64, `offsets` their cumulative ends) -> (rows, d).
  at::Tensor forward(const at::Tensor& rows, const at::Tensor& n, const at::Tensor& offsets);

  at::Tensor gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias;

 private:
  double limit_, alpha_;
};
TORCH_MODULE(GptOssExperts);

// The layer's mixture of experts (GptOssMLP: router and experts), every expert-parallel degree through the capability.
class GptOssMLPImpl : public torch::nn::Module, public ExpertParallelLayer {
 public:
  GptOssMLPImpl(const GptOssOptions& o, const at::TensorOptions& t, std::shared_ptr<HfRouterLoss> loss,
                std::shared_ptr<AuxLossScale> scale);
  // x: (B, S, d) -> (B, S, d). In training, records the tokens per expert and adds transformers' load-balancing loss
  // (over the softmax of the router's scores) when the model asks for it.
  at::Tensor forward(const at::Tensor& x);
  int64_t num_experts() const override { return experts_; }
  int64_t experts_per_token() const override { return top_k_; }
  int64_t token_width() const override { return hidden_; }
  std::vector<std::string> expert_weight_names() const override {
    return {"experts.gate_up_proj", "experts.gate_up_proj_bias", "experts.down_proj", "experts.down_proj_bias"};
  }
  void set_expert_exchange(std::shared_ptr<ExpertExchange> exchange) override { exchange_ = std::move(exchange); }

  Linear router{nullptr};
  GptOssExperts experts{nullptr};
  std::vector<at::Tensor> records;  // tokens per expert (E,) int64 of each training forward since the last clear

 private:
  int64_t experts_, top_k_, hidden_;
  std::shared_ptr<HfRouterLoss> loss_;
  std::shared_ptr<AuxLossScale> scale_;
  std::shared_ptr<ExpertExchange> exchange_;
};
TORCH_MODULE(GptOssMLP);

class GptOssDecoderLayerImpl : public torch::nn::Module {
 public:
  GptOssDecoderLayerImpl(const GptOssOptions& o, const at::TensorOptions& t, int64_t index,
                         std::shared_ptr<HfRouterLoss> loss, std::shared_ptr<AuxLossScale> scale);
  at::Tensor forward(const at::Tensor& x, const GlobalLocalInputs& in, LayerCache* cache = nullptr);

  SelfAttention self_attn{nullptr};
  GptOssMLP mlp{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  bool sliding_;
};
TORCH_MODULE(GptOssDecoderLayer);

// Units: 0 = the root (embedding, final norm and head), 1..num_hidden_layers = the decoder layers. Tensor parallelism
// is refused (the experts do not split); expert parallelism applies, and context parallelism without the
// load-balancing loss.
class GptOssForCausalLMImpl
    : public HfDecoderLM<GptOssForCausalLMImpl, GptOssOptions, GptOssDecoderLayerImpl, GlobalLocalInputs>,
      public MixtureOfExpertsModel {
 public:
  explicit GptOssForCausalLMImpl(const GptOssOptions& o);

  // transformers' scheme, with the sinks, the stacked experts and the routers' biases drawn as transformers does.
  void init_weights(uint64_t seed, const std::function<bool(const std::string&)>& select = nullptr) override;
  std::map<std::string, at::Tensor> auxiliary_losses() const override { return routing_.auxiliary_losses(); }
  void set_auxiliary_loss_scale(double scale) override { routing_.scale->set(scale); }
  std::vector<std::pair<std::string, at::Tensor>> expert_token_counts() const override;
  int64_t num_active_params() const override;
  // The load-balancing loss counts each rank's tokens as the batch.
  bool supports_context_parallel() const override { return !o_.output_router_logits; }

 protected:
  bool windowed(int64_t i) const override { return o_.sliding(i); }
  void begin_forward(const DecoderCall& call) override;
  void end_forward() override { routing_.end(); }
  void check_tensor_parallel(int64_t degree) const override;
  std::string describe_more() const override;

 private:
  HfMoeRouting routing_;
};
TORCH_MODULE(GptOssForCausalLM);

}  // namespace tessera::models
