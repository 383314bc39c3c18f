// The Falcon family: options and refusals, the published parameter count, module names of each variant, config.json
// round trips, KV-cache decoding, meta construction. Its function against transformers' FalconForCausalLM is checked in
// tests/compat/test_falcon_hf.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "models/falcon/falcon.h"
#include "tessera/config/value.h"
#include "tessera/models/generate.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace falcon_test {

FalconOptions parse(const std::string& yaml) {
  config::Origin origin;
  origin.file = "falcon.yaml";
  config::Value v = config::parse_yaml(yaml, origin);
  config::ParseContext ctx("falcon.yaml");
  config::Section s(&v, "model", ctx);
  FalconOptions o = falcon_keys().parse(s);
  s.finish();
  ctx.throw_if_unsupported();
  return o;
}

// The variants, small: Falcon 7B's multi-query block, 40B's new architecture, the RW models' ALiBi sequential block.
const std::vector<std::string>& variants() {
  static const std::vector<std::string> v = {
      "{hidden_size: 64, num_attention_heads: 4, num_hidden_layers: 2, vocab_size: 97, max_position_embeddings: 64}",
      "{hidden_size: 96, num_attention_heads: 6, num_kv_heads: 2, new_decoder_architecture: true, "
      "num_hidden_layers: 2, vocab_size: 97, max_position_embeddings: 64, ffn_hidden_size: 128}",
      "{hidden_size: 64, num_attention_heads: 4, num_hidden_layers: 2, vocab_size: 97, max_position_embeddings: 64, "
      "alibi: true, bias: true, multi_query: false, parallel_attn: false, tie_word_embeddings: false}",
  };
  return v;
}

FalconForCausalLM on_meta(FalconOptions o) {
  o.init_device = "meta";
  return FalconForCausalLM(o);
}

TEST(Falcon, DefaultsAreFalcon7bAndItsParameterCountIsThePublishedOne) {
  const FalconOptions o = parse("{}");
  EXPECT_EQ(o.kv_heads(), 1);
  EXPECT_EQ(o.ln_count(), 1);
  EXPECT_EQ(o.intermediate_size, 4 * 4544);
  EXPECT_EQ(on_meta(o)->num_params(), 6921720704);  // tiiuae/falcon-7b
}

TEST(Falcon, EachVariantNamesItsParametersAsTransformersDoes) {
  for (const auto& yaml : variants()) {
    const FalconOptions o = parse(yaml);
    const FalconForCausalLM m = on_meta(o);
    std::vector<std::string> names;
    for (const auto& p : m->named_parameters()) names.push_back(p.key());
    auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    EXPECT_TRUE(has("transformer.word_embeddings.weight"));
    EXPECT_TRUE(has("transformer.h.1.self_attention.query_key_value.weight"));
    EXPECT_TRUE(has("transformer.h.1.mlp.dense_4h_to_h.weight"));
    EXPECT_EQ(has("transformer.h.0.ln_attn.weight"), o.new_decoder_architecture) << yaml;
    EXPECT_EQ(has("transformer.h.0.post_attention_layernorm.bias"), !o.parallel_attn) << yaml;
    EXPECT_EQ(has("transformer.h.0.self_attention.dense.bias"), o.bias) << yaml;
    EXPECT_EQ(has("lm_head.weight"), !o.tie_word_embeddings) << yaml;
    for (const auto& n : names) {
      EXPECT_EQ(m->unit_of_parameter(n), n.rfind("transformer.h.1.", 0) == 0   ? 2
                                         : n.rfind("transformer.h.0.", 0) == 0 ? 1
                                                                               : 0)
          << n;
    }
  }
}

TEST(Falcon, ConfigJsonRoundTripsToTheSameOptions) {
  for (const auto& yaml : variants()) {
    const FalconOptions o = parse(yaml);
    const FalconOptions back = falcon_keys().from_hf(on_meta(o)->hf_config(at::kFloat), "config.json");
    EXPECT_EQ(on_meta(back)->hf_config(at::kFloat), on_meta(o)->hf_config(at::kFloat)) << yaml;
    EXPECT_EQ(on_meta(back)->num_params(), on_meta(o)->num_params());
  }
}

TEST(Falcon, WhatTransformersDoesNotComputeIsRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{new_decoder_architecture: true, parallel_attn: false, num_kv_heads: 71}", "model.parallel_attn"},
      {"{num_ln_in_parallel_attn: 2}", "model.num_ln_in_parallel_attn"},
      {"{num_ln_in_parallel_attn: 3, new_decoder_architecture: true, num_kv_heads: 71}",
       "model.num_ln_in_parallel_attn"},
      {"{multi_query: false, num_kv_heads: 2}", "model.num_kv_heads"},
      {"{new_decoder_architecture: true, num_kv_heads: 2}", "model.num_kv_heads"},
      {"{activation: gelu_fast}", "model.activation"},
      {"{rope_scaling: {rope_type: yarn, factor: 2.0}}", "model.rope_scaling.rope_type"},
      {"{hidden_size: 4545}", "model.num_attention_heads"},
      {"{hidden_size: 66, num_attention_heads: 2}", "model.num_attention_heads"},  // head_dim 33: no rotary
      {"{hidden_dropout: 1.0}", "model.hidden_dropout"},
      {"{n_layer: 2}", "model.n_layer"},  // not a FalconConfig key (transformers would ignore it)
  };
  for (const auto& [yaml, key] : cases) {
    try {
      parse(yaml);
      ADD_FAILURE() << yaml << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find(key), std::string::npos) << yaml << ": " << e.message();
    }
  }
  EXPECT_NO_THROW(parse("{hidden_size: 66, num_attention_heads: 2, alibi: true}"));  // ALiBi takes odd head_dim
  try {
    falcon_keys().from_hf(nlohmann::json{{"model_type", "falcon"}, {"activation", "gelu_fast"}}, "f/c.json");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("f/c.json"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("activation"), std::string::npos) << e.message();
  }
}

TEST(Falcon, AlibiSlopesAreTransformersBloomSlopes) {
  // build_alibi_tensor: 2^(-8k/n) for n = 4 (k = 1..4); for 6 heads, n = 4 and then 2^(-4(2j+1)/4), j = 0, 1.
  const at::Tensor four = falcon_alibi_slopes(4);
  const std::vector<double> want4 = {std::pow(2, -2.0), std::pow(2, -4.0), std::pow(2, -6.0), std::pow(2, -8.0)};
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(four[i].item<float>(), want4[i]);
  const at::Tensor six = falcon_alibi_slopes(6);
  EXPECT_EQ(six.size(0), 6);
  EXPECT_FLOAT_EQ(six[4].item<float>(), std::pow(2, -1.0));
  EXPECT_FLOAT_EQ(six[5].item<float>(), std::pow(2, -3.0));
}

class FalconDecoding : public ::testing::TestWithParam<int> {};

TEST_P(FalconDecoding, KVCacheGivesTheFullForwardLogits) {
  FalconForCausalLM m = build_initialised<FalconForCausalLM>(parse(variants()[GetParam()]), 3);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, 97, {2, 11}, at::kLong);
  const at::Tensor full = m->forward(ids);
  KVCache cache;
  ForwardOptions fo;
  fo.cache = &cache;
  at::Tensor step = m->forward(ids.narrow(1, 0, 6), fo);  // prefill 6, then 2, then one at a time
  EXPECT_TRUE(at::allclose(step, full.narrow(1, 0, 6), 1e-5, 1e-5));
  step = m->forward(ids.narrow(1, 6, 2), fo);
  EXPECT_TRUE(at::allclose(step, full.narrow(1, 6, 2), 1e-5, 1e-5));
  for (int64_t t = 8; t < 11; ++t) {
    step = m->forward(ids.narrow(1, t, 1), fo);
    EXPECT_TRUE(at::allclose(step.squeeze(1), full.select(1, t), 1e-5, 1e-5)) << t;
  }
  EXPECT_EQ(cache.length, 11);
}

TEST_P(FalconDecoding, LeftPaddedBatchGeneratesWhatEachPromptGeneratesAlone) {
  FalconForCausalLM m = build_initialised<FalconForCausalLM>(parse(variants()[GetParam()]), 5);
  GenerationOptions g;
  g.max_new_tokens = 6;
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 44, 7, 1}, {3, 8}, {60, 61, 62, 63}};
  const auto batched = models::generate(*m, prompts, g);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(batched[i], models::generate(*m, {prompts[i]}, g)[0]) << i;
}

INSTANTIATE_TEST_SUITE_P(Variants, FalconDecoding, ::testing::Values(0, 1, 2));

TEST(Falcon, InitIsTransformersAndTheSameUnitByUnit) {
  const FalconOptions o = parse(variants()[2]);
  FalconForCausalLM whole = build_initialised<FalconForCausalLM>(o, 11);
  FalconForCausalLM parts(o);
  for (int64_t unit = 0; unit < parts->num_units(); ++unit) {
    parts->init_weights(11, [&](const std::string& module) {
      const std::string prefix = "transformer.h.";
      if (module.rfind(prefix, 0) != 0) return unit == 0;
      return std::stoll(module.substr(prefix.size())) + 1 == unit;
    });
  }
  const auto a = whole->named_parameters(), b = parts->named_parameters();
  for (const auto& p : a) EXPECT_TRUE(at::equal(p.value(), b[p.key()])) << p.key();
  EXPECT_NEAR(a["transformer.h.0.mlp.dense_h_to_4h.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_TRUE(at::equal(a["transformer.h.0.mlp.dense_h_to_4h.bias"], at::zeros({256})));
  EXPECT_TRUE(at::equal(a["transformer.h.0.input_layernorm.weight"], at::ones({64})));
  EXPECT_TRUE(at::equal(a["transformer.h.0.input_layernorm.bias"], at::zeros({64})));
}

}  // namespace falcon_test
}  // namespace tessera::models
