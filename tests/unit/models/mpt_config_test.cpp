// MPT options: parameter counts for architecture variants and validation of the model block.
#include <gtest/gtest.h>

#include "models/mpt/mpt_config.h"
#include "tessera/config/value.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

MPTOptions parse(const std::string& yaml) {
  config::Origin origin;
  origin.file = "model.yaml";
  config::Value v = config::parse_yaml(yaml, origin);
  config::ParseContext ctx("model.yaml");
  config::Section s(&v, "model", ctx);
  MPTOptions o = parse_mpt_options(s);
  ctx.throw_if_unsupported();
  return o;
}

TEST(MPTConfig, SevenBWithAlibiAndNoBiasMatchesTheReleasedModel) {
  // LLM Foundry's spec: the no_bias + ALiBi variant of MPT-7B (the released mosaicml/mpt-7b) has 6,649,024,512.
  const MPTOptions o = parse("d_model: 4096\nn_heads: 32\nn_layers: 32\nno_bias: true\nattn_config: {alibi: true}\n");
  EXPECT_FALSE(o.learned_pos_emb) << "ALiBi turns learned positions off, as LLM Foundry does";
  EXPECT_EQ(mpt_param_count(o), 6649024512);
}

TEST(MPTConfig, CountsFollowEachArchitectureOption) {
  // d=64, H=4, hd=16, L=2, V=100, S=32, F=256: hand-counted per tensor.
  const std::string base = "d_model: 64\nn_heads: 4\nn_layers: 2\nvocab_size: 100\nmax_seq_len: 32\n";
  const int64_t wte = 100 * 64, wpe = 32 * 64, norm = 2 * 64;
  const int64_t block = norm + (64 * 192 + 192) + (64 * 64 + 64) + norm + (64 * 256 + 256) + (256 * 64 + 64);
  EXPECT_EQ(mpt_param_count(parse(base)), wte + wpe + 2 * block + norm);
  // untied head adds V*d
  EXPECT_EQ(mpt_param_count(parse(base + "tie_word_embeddings: false\n")), wte + wpe + 2 * block + norm + wte);
  // GQA with 2 kv heads: Wqkv has (4 + 2*2) * 16 = 128 rows
  const int64_t gqa_block = block - (64 * 192 + 192) + (64 * 128 + 128);
  EXPECT_EQ(mpt_param_count(parse(base + "attn_config: {attn_type: grouped_query_attention, kv_n_heads: 2}\n")),
            wte + wpe + 2 * gqa_block + norm);
  // GLU adds gate_proj; rope drops wpe; qk_ln adds q_ln (64) and k_ln (64), weight and bias
  const int64_t glu_block = block + 64 * 256 + 256;
  EXPECT_EQ(mpt_param_count(parse(base + "ffn_config: {ffn_type: mptglu}\nattn_config: {rope: true}\n")),
            wte + 2 * glu_block + norm);
  EXPECT_EQ(mpt_param_count(parse(base + "attn_config: {qk_ln: true}\n")), wte + wpe + 2 * (block + 4 * 64) + norm);
  // attention_bias wins over no_bias for Wqkv only
  const int64_t nobias_block = 64 + 64 * 192 + 64 * 64 + 64 + 64 * 256 + 256 * 64;
  EXPECT_EQ(mpt_param_count(parse(base + "no_bias: true\n")), wte + wpe + 2 * nobias_block + 64);
  EXPECT_EQ(mpt_param_count(parse(base + "no_bias: true\nattention_bias: true\n")),
            wte + wpe + 2 * (nobias_block + 192) + 64);
}

TEST(MPTConfig, UntiedEmbeddingsLeaveTheLookupOutOfFlops) {
  const std::string base = "d_model: 64\nn_heads: 4\nn_layers: 2\nvocab_size: 100\nmax_seq_len: 32\n";
  const MPTOptions tied = parse(base), untied = parse(base + "tie_word_embeddings: false\n");
  EXPECT_DOUBLE_EQ(mpt_flops_per_token(tied, 32), 6.0 * mpt_param_count(tied) + 12.0 * 2 * 64 * 32);
  EXPECT_DOUBLE_EQ(mpt_flops_per_token(untied, 32), 6.0 * (mpt_param_count(untied) - 100 * 64) + 12.0 * 2 * 64 * 32);
}

TEST(MPTConfig, InvalidArchitecturesAreErrors) {
  auto message = [](const std::string& yaml) -> std::string {
    try {
      parse(yaml);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(message("d_model: 768\nn_heads: 7\n"), "[recipe] model.yaml:2: model.n_heads: must divide d_model (768)");
  EXPECT_EQ(message("d_model: 10\nn_heads: 2\nexpansion_ratio: 1.25\n"),
            "[recipe] model.yaml:3: model.expansion_ratio: d_model * expansion_ratio must be a whole number, got 12.5");
  EXPECT_NE(message("attn_config: {attn_type: grouped_query_attention, kv_n_heads: 3}\n").find("must divide n_heads"),
            std::string::npos);
  EXPECT_NE(message("attn_config: {alibi: true, rope: true}\n").find("mutually exclusive"), std::string::npos);
  EXPECT_NE(message("attn_config: {attn_impl: triton}\n").find("not supported yet"), std::string::npos);
  EXPECT_NE(message("ffn_config: {ffn_type: te_ln_mlp}\n").find("not supported yet: model.ffn_config.ffn_type"),
            std::string::npos);
  EXPECT_NE(message("norm_type: batchnorm\n").find("\"batchnorm\" is not one of"), std::string::npos);
  EXPECT_NE(message("resid_pdrop: 1.5\n").find("must lie in [0, 1]"), std::string::npos);
  EXPECT_NE(message("attn_config: {alibii: true}\n").find("unknown key (did you mean 'alibi'?)"), std::string::npos);
  EXPECT_NE(message("init_config: {name: baseline_}\n").find("baseline_ init needs init_std"), std::string::npos);
}

}  // namespace
}  // namespace tessera::models
