// The Qwen3.5 family's pieces that its peer test (tests/compat/test_transformers5_qwen3_5.py, against transformers 5)
// does not isolate: the chunked gated delta rule equals the token-by-token recurrence on the same inputs, with and
// without an initial state and for lengths around the chunk; a prompt fed through the cache a few tokens at a time
// gives the whole forward's logits; the default layer pattern and the refusals of the options.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "models/qwen3_5/qwen3_5.h"
#include "tessera/config/value.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace qwen3_5_test {

Qwen35Options parse(const std::string& yaml) {
  config::Origin origin;
  origin.file = "qwen3_5.yaml";
  config::Value v = config::parse_yaml(yaml, origin);
  config::ParseContext ctx("qwen3_5.yaml");
  config::Section s(&v, "model", ctx);
  Qwen35Options o = qwen3_5_keys().parse(s);
  s.finish();
  ctx.throw_if_unsupported();
  return o;
}

const char* kSmall =
    "{hidden_size: 32, intermediate_size: 48, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, "
    "head_dim: 8, linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 8, "
    "linear_value_head_dim: 6, vocab_size: 97, max_position_embeddings: 128}";

TEST(Qwen35, ChunkedGatedDeltaRuleEqualsTheRecurrence) {
  at::manual_seed(0);
  for (int64_t s : {1, 7, 64, 65, 130}) {
    for (bool with_state : {false, true}) {
      const at::Tensor q = at::randn({2, s, 2, 8}), k = at::randn({2, s, 2, 8}), v = at::randn({2, s, 4, 6});
      const at::Tensor g = -at::rand({2, s, 4}), beta = at::rand({2, s, 4});
      at::Tensor a = with_state ? at::randn({2, 4, 8, 6}) : at::Tensor(), b = a.defined() ? a.clone() : a;
      const at::Tensor chunked = chunk_gated_delta_rule(q, k, v, g, beta, a, 16);
      const at::Tensor stepped = recurrent_gated_delta_rule(q, k, v, g, beta, b);
      EXPECT_TRUE(at::allclose(chunked, stepped, 1e-4, 1e-5)) << s << " " << with_state;
      EXPECT_TRUE(at::allclose(a, b, 1e-4, 1e-5)) << s << " " << with_state;
    }
  }
}

TEST(Qwen35, TheCacheGivesTheWholeForwardsLogits) {
  Qwen35Options o = parse(kSmall);
  Qwen35ForCausalLM m(o);
  m->init_weights(3);
  m->eval();
  at::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(0, 97, {2, 75}, at::kLong);
  const at::Tensor full = m->forward(ids);
  KVCache cache;
  ForwardOptions fo;
  fo.cache = &cache;
  int64_t at_pos = 0;
  for (int64_t n : {70, 2, 1, 1, 1}) {  // a prefill past one chunk, a two-token step, then single tokens
    const at::Tensor step = m->forward(ids.narrow(1, at_pos, n), fo);
    EXPECT_TRUE(at::allclose(step, full.narrow(1, at_pos, n), 1e-4, 1e-5)) << at_pos;
    at_pos += n;
  }
  EXPECT_EQ(cache.length, 75);
  EXPECT_TRUE(cache.layers[0].recurrent_state.defined() && cache.layers[0].conv_state.defined());
  EXPECT_TRUE(cache.layers[3].key.defined() && !cache.layers[3].recurrent_state.defined());
}

TEST(Qwen35, DefaultsFollowTransformersAndBadValuesAreRefusedByKey) {
  const Qwen35Options d = parse("{}");
  EXPECT_EQ(d.layer_types.size(), 32u);
  EXPECT_EQ(d.layer_types[2], "linear_attention");
  EXPECT_EQ(d.layer_types[3], "full_attention");
  EXPECT_EQ(d.rotary_dims(), 64);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{linear_num_key_heads: 3, linear_num_value_heads: 4}", "model.linear_num_key_heads"},
      {"{num_hidden_layers: 2, layer_types: [linear_attention, sliding_attention]}", "model.layer_types"},
      {"{num_hidden_layers: 2, layer_types: [linear_attention]}", "model.layer_types"},
      {"{partial_rotary_factor: 1.5}", "model.partial_rotary_factor"},
  };
  for (const auto& [yaml, key] : cases) {
    try {
      parse(yaml);
      ADD_FAILURE() << yaml << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(e.message().find(key), std::string::npos) << yaml << ": " << e.message();
    }
  }
}

// Qwen3.5-MoE through the shared decoder's FLOPs: 6 times the parameters a token uses (each layer's router, top-k of
// its experts and the shared expert; not the untied input embedding) plus the full-attention layers' 12 (heads x
// head_dim) x S; the linear layers add no attention term.
TEST(Qwen35, MoeFlopsFollowTheActiveParameters) {
  const Qwen35Options o = parse(
      "{model_type: qwen3_5_moe_text, hidden_size: 32, num_hidden_layers: 4, num_attention_heads: 4, "
      "num_key_value_heads: 2, head_dim: 8, linear_num_key_heads: 2, linear_num_value_heads: 4, "
      "linear_key_head_dim: 8, linear_value_head_dim: 6, num_experts: 6, num_experts_per_tok: 2, "
      "moe_intermediate_size: 16, shared_expert_intermediate_size: 24, vocab_size: 97, max_position_embeddings: 128, "
      "init_device: meta}");
  Qwen35ForCausalLM model(o);
  const int64_t unused = 4 * (6 - 2) * 3 * 32 * 16;  // per layer, the 4 experts a token skips (gate, up, down)
  EXPECT_EQ(model->num_active_params(), model->num_params() - unused);
  const int64_t full_layers = 1;  // every fourth layer
  EXPECT_DOUBLE_EQ(model->flops_per_token(64),
                   6.0 * static_cast<double>(model->num_active_params() - 97 * 32) + 12.0 * full_layers * 4 * 8 * 64);
}

}  // namespace qwen3_5_test
}  // namespace tessera::models
