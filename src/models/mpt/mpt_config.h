// MPT model options, in LLM Foundry's `model:` schema (name: mpt_causal_lm), with its defaults and validation; the
// parameter count and the FLOPs-per-token formula that LLM Foundry's throughput tables use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tessera/config/reader.h"
#include "tessera/config/registry.h"
#include "tessera/models/blocks/moe_options.h"
#include "tessera/models/blocks/norm_type.h"

namespace tessera::models {

enum class FfnType { kMLP, kGLU };  // LLM Foundry's mptmlp, mptglu

struct AttentionOptions {
  std::string attn_type = "multihead_attention";  // or multiquery_attention, grouped_query_attention
  std::string attn_impl = "flash";                // torch | flash: both run as scaled_dot_product_attention
  double attn_pdrop = 0.0;
  bool qk_ln = false;                   // LayerNorm over the full query / key vectors
  bool qk_gn = false;                   // LayerNorm per head
  std::optional<double> clip_qkv;       // clamp the Q, K and V projections to [-c, c]
  bool fused_qkv = true;                // one Wqkv projection, or LLM Foundry's separate Wq, Wk, Wv
  std::optional<double> softmax_scale;  // default 1/sqrt(head_dim)
  bool attn_uses_sequence_id = false;   // block-diagonal attention for packed documents
  int64_t sliding_window_size = -1;     // -1: unlimited
  bool alibi = false;
  double alibi_bias_max = 8.0;
  bool rope = false;
  double rope_theta = 10000.0;
  int64_t kv_n_heads = 0;  // resolved: n_heads (MHA), 1 (MQA), or as given (GQA)
};

// ffn_type torch_dmoe | mb_moe | mb_dmoe: a mixture of experts in every block, with LLM Foundry's and MegaBlocks'
// ffn_config keys (moe_num_experts, moe_top_k, ...). The three compute the same layer, except that mb_moe routes with a
// capacity factor (MegaBlocks' MoE) where the others are dropless, and that the load-balancing loss's weight
// defaults to MegaBlocks' 0.1 for mb_* and to 0 for torch_dmoe (LLM Foundry's torch_dmoe has none).
struct MoEFfnOptions {
  std::string ffn_type = "torch_dmoe";
  int64_t num_experts = 1;
  int64_t top_k = 1;
  bool glu = false;  // mlp_type
  std::optional<double> jitter_eps;
  std::optional<double> normalize_expert_weights;
  bool uniform_expert_assignment = false;
  double capacity_factor = 1.0;  // mb_moe only
  double loss_weight = 0.0;
  bool lbl_in_fp32 = false;
  double zloss_weight = 0.0;
  bool zloss_in_fp32 = false;
  bool memory_optimized_mlp = false;  // accepted: MegaBlocks' recomputation of the activation; the same function
  bool output_router_logits = false;  // DBRX: transformers adds its load-balancing loss only then
  int64_t world_size = 1;             // moe_world_size: the expert-parallel degree (MoEOptions::world_size)
};

struct FfnOptions {
  FfnType type = FfnType::kMLP;
  std::optional<MoEFfnOptions> moe;        // a mixture of experts instead of the dense MLP
  std::optional<int64_t> ffn_hidden_size;  // overrides d_model * expansion_ratio
  // The activation as transformers' ACT2FN names it: "gelu" (exact, erf), "gelu_pytorch_tanh" (recipes'
  // {name: gelu, approximate: tanh}), "gelu_new" (GPT-2's; the tanh GELU term by term), relu, silu, ....
  std::string ffn_act_fn = "gelu";
};

struct InitOptions {
  std::string name = "kaiming_normal_";  // default_, baseline_, kaiming_uniform_, kaiming_normal_,
                                         // neox_init_, small_init_, xavier_uniform_, xavier_normal_
  std::string fan_mode = "fan_in";
  std::string init_nonlinearity = "relu";
  double init_div_is_residual = 0.0;  // divisor for residual projections (true -> sqrt(2 L)); 0: sqrt(2 L), as true
  std::optional<double> emb_init_std;
  std::optional<double> emb_init_uniform_lim;
  std::optional<double> init_std;  // required by baseline_
  double init_gain = 0.0;
};

// Defaults are LLM Foundry's MPTConfig defaults.
struct MPTOptions {
  int64_t d_model = 2048;
  int64_t n_heads = 16;
  int64_t n_layers = 24;
  double expansion_ratio = 4.0;
  int64_t max_seq_len = 2048;
  int64_t vocab_size = 50368;
  double resid_pdrop = 0.0;
  double emb_pdrop = 0.0;
  bool learned_pos_emb = true;         // forced false with ALiBi or RoPE, as LLM Foundry does
  bool no_bias = false;                // no bias in any Linear or norm
  std::optional<bool> attention_bias;  // Wqkv bias; default: !no_bias
  NormType norm_type = NormType::kLowPrecisionLayerNorm;
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;    // unembedding reuses wte
  std::optional<double> logit_scale;  // "inv_sqrt_d_model" resolves to 1/sqrt(d_model)
  double embedding_fraction = 1.0;
  std::string init_device = "cpu";             // cpu | meta (deferred init, for sharding)
  std::string loss_fn = "fused_crossentropy";  // fused_crossentropy | torch_crossentropy (same math here)
  // "dbrx": the model was read from (and exports as) transformers' DbrxForCausalLM (mpt.h); empty: MPT's own.
  std::string hf_layout;
  double initializer_range = 0.02;  // DBRX's config, written back
  AttentionOptions attn;
  FfnOptions ffn;
  InitOptions init;

  int64_t head_dim() const { return d_model / n_heads; }
  int64_t ffn_hidden() const;
  // The MoE layer of every block (ffn.moe set), with its sizes and activation resolved.
  MoEOptions moe_layer() const;
  bool wqkv_bias() const { return attention_bias.value_or(!no_bias); }
  // LayerNorms carry a bias unless no_bias; RMSNorms never do.
  bool norm_has_bias() const {
    return !no_bias && (norm_type == NormType::kLayerNorm || norm_type == NormType::kLowPrecisionLayerNorm);
  }
};

// Reads and validates an `mpt_causal_lm` model section (the `name` key is read by the caller). Options Tessera does
// not implement (e.g. fc_type: te, ffn_type: mb_moe) are recorded as not supported yet.
MPTOptions parse_mpt_options(config::Section& s);

// Exact number of parameters of the model these options build (embeddings, tied or not, included).
int64_t mpt_param_count(const MPTOptions& o);
// The parameters one token uses (LLM Foundry's mpt_get_active_params, before its untied-embedding correction): all
// of them for a dense model; with experts, each block's router and top_k of its experts.
int64_t mpt_active_param_count(const MPTOptions& o);

// Training FLOPs per token as LLM Foundry counts them: 6 N + 12 L d S, where N is the active parameter count less
// the input embedding when it is untied (an untied wte is a lookup), and S the sequence length.
double mpt_flops_per_token(const MPTOptions& o, int64_t seq_len);

// init_config.init_div_is_residual as LLM Foundry resolves it: the value set, or sqrt(2 n_layers) (its default, true)
// when it is 0, MPTOptions' default for options built in code.
double init_div_is_residual(const MPTOptions& o);

// Parameters of the largest wrapped unit (embedding, one block, or head), for transient all-gather memory.
int64_t mpt_largest_unit_params(const MPTOptions& o);
// Parameters of one transformer block.
int64_t mpt_block_params(const MPTOptions& o);

// Activation memory of one forward+backward on a microbatch of `batch` sequences of `seq_len` tokens, in bytes, with
// activations stored in `bytes_per_value` (2 under amp_bf16/amp_fp16, 4 in fp32). Per block this is Korthikanti et
// al. (2022)'s count for attention through fused SDPA kernels (no S x S matrix is kept): (8 d + 2 F) values per token,
// F more for GLU, plus 1-byte dropout masks when dropout is on; with activation checkpointing a block keeps only its
// input (d values per token) and one block is recomputed at a time. The logits add B S V (bytes_per_value + 4) for the
// fp32 loss.
double mpt_activation_bytes(const MPTOptions& o, int64_t batch, int64_t seq_len, int bytes_per_value,
                            bool activation_checkpointing);

}  // namespace tessera::models
