// The sharding engine in one process: its units give the plain model's logits and gradients, and a meta model is
// materialised unit by unit as a whole-model init.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "models/llama/llama.h"
#include "models/mpt/mpt.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/data/tokenizer.h"
#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/launcher.h"
#include "tessera/distributed/sharding.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/preemption.h"
#include "test_util.h"
#include "tiny_data.h"

namespace fs = std::filesystem;
using namespace tessera;

// ---- The engine in one process
// ----------------------------------------------------------------------------------------

namespace {
models::MPTForCausalLM small_mpt() {
  models::MPTOptions o;
  o.d_model = 32;
  o.n_heads = 4;
  o.n_layers = 3;
  o.expansion_ratio = 2;
  o.max_seq_len = 16;
  o.vocab_size = 50;
  o.attn.kv_n_heads = 4;
  o.init.init_div_is_residual = std::sqrt(2.0 * o.n_layers);
  o.resid_pdrop = 0.1;  // dropout: activation checkpointing must replay the same masks
  return models::build_mpt(o, 5);
}

// Each unit's flat gradient (parallel->parameters()[u], padding aside) equals the plain model's gradients of that
// unit's parameters, concatenated in named_parameters() order.
void expect_unit_gradients(const models::CausalLM& plain, dist::ParallelModel& parallel, const std::string& what) {
  std::vector<std::vector<at::Tensor>> per_unit(static_cast<size_t>(plain.num_units()));
  for (const auto& item : plain.named_parameters()) {
    per_unit[static_cast<size_t>(plain.unit_of_parameter(item.key()))].push_back(item.value().grad().reshape({-1}));
  }
  for (size_t u = 0; u < per_unit.size(); ++u) {
    const at::Tensor want = at::cat(per_unit[u]);
    const at::Tensor got = parallel.parameters()[u].grad().narrow(0, 0, want.numel());
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6))
        << what << " unit " << u << ": " << (got - want).abs().max().item<double>();
  }
}
}  // namespace

TEST(Fsdp, UnitsOnAWorldOfOneGiveThePlainModelsLogitsAndGradients) {
  for (const bool checkpointing : {false, true}) {
    models::MPTForCausalLM plain = small_mpt(), sharded = small_mpt();
    dist::ParallelOptions po;
    po.sharding.strategy = dist::ShardingStrategy::kFullShard;
    po.sharding.activation_checkpointing = checkpointing;
    auto parallel = dist::parallelize(*sharded, po, dist::Communicator::single());
    ASSERT_EQ(parallel->parameters().size(), 4u);  // root + 3 blocks
    const at::Tensor ids = at::randint(50, {2, 16}, at::kLong);

    at::manual_seed(9);
    const at::Tensor ref_logits = plain->forward(ids);
    models::causal_lm_loss(ref_logits, ids).backward();
    at::manual_seed(9);
    parallel->prepare_backward(true);
    const at::Tensor logits = sharded->forward(ids);
    // FULL_SHARD: a block's gathered parameters are freed once its forward is done.
    EXPECT_EQ(sharded->transformer->blocks[1]->parameters()[0].storage().nbytes(), 0u);
    models::causal_lm_loss(logits, ids).backward();
    parallel->finish_backward();
    EXPECT_TRUE(at::allclose(logits, ref_logits, 1e-6, 1e-6));

    // Unit 0 (root) then blocks, each flattened in named_parameters() order.
    expect_unit_gradients(*plain, *parallel, fmt::format("checkpointing {}", checkpointing));
    // Evaluation without gradients goes through the same units.
    at::NoGradGuard no_grad;
    plain->eval();
    sharded->eval();
    EXPECT_TRUE(at::allclose(sharded->forward(ids), plain->forward(ids), 1e-6, 1e-6));
    const auto full = parallel->full_state_dict();
    EXPECT_EQ(full.size(), plain->named_parameters().size());
  }
}

TEST(Fsdp, MixtureOfExpertsAuxiliaryLossesReachTheGradientsThroughTheUnits) {
  // MegaBlocks' dMoE in every block, with its load-balancing loss, z-loss and router jitter: the auxiliary losses'
  // gradients come through each unit's own graph (and its re-run under activation checkpointing, the jitter replayed).
  models::MPTOptions o = small_mpt()->options();
  o.no_bias = false;
  models::MoEFfnOptions m;
  m.ffn_type = "mb_dmoe";
  m.num_experts = 4;
  m.top_k = 2;
  m.glu = true;
  m.jitter_eps = 0.1;
  m.loss_weight = 0.1;
  m.zloss_weight = 0.01;
  o.ffn.moe = m;
  for (const bool checkpointing : {false, true}) {
    models::MPTForCausalLM plain = models::build_mpt(o, 5), sharded = models::build_mpt(o, 5);
    dist::ParallelOptions po;
    po.sharding.strategy = dist::ShardingStrategy::kFullShard;
    po.sharding.activation_checkpointing = checkpointing;
    auto parallel = dist::parallelize(*sharded, po, dist::Communicator::single());
    const at::Tensor ids = at::randint(50, {2, 16}, at::kLong);
    auto total = [&](models::MPTForCausalLMImpl& model, const at::Tensor& logits) {
      at::Tensor loss = models::causal_lm_loss(logits, ids);
      for (const auto& [name, value] : model.auxiliary_losses()) loss = loss + value;  // values: detached
      return loss;
    };
    at::manual_seed(9);
    const at::Tensor ref_logits = plain->forward(ids);
    const auto ref_aux = plain->auxiliary_losses();
    ASSERT_EQ(ref_aux.size(), 2u);
    total(*plain, ref_logits).backward();
    at::manual_seed(9);
    parallel->prepare_backward(true);
    const at::Tensor logits = sharded->forward(ids);
    const auto aux = sharded->auxiliary_losses();
    total(*sharded, logits).backward();
    parallel->finish_backward();
    EXPECT_TRUE(at::allclose(logits, ref_logits, 1e-6, 1e-6));
    for (const auto& [name, value] : ref_aux) {
      EXPECT_NEAR(aux.at(name).item<double>(), value.item<double>(), 1e-7) << name;
    }
    expect_unit_gradients(*plain, *parallel, fmt::format("MoE, checkpointing {}", checkpointing));
    // The router's gradient holds the auxiliary losses': with them scaled to 0 it is another.
    const at::Tensor with_aux =
        plain->transformer->blocks[0]->as<models::MPTBlockImpl>()->moe->router->layer->weight.grad().clone();
    plain->zero_grad();
    plain->set_auxiliary_loss_scale(0.0);
    at::manual_seed(9);
    models::causal_lm_loss(plain->forward(ids), ids).backward();
    EXPECT_FALSE(at::allclose(
        with_aux, plain->transformer->blocks[0]->as<models::MPTBlockImpl>()->moe->router->layer->weight.grad(), 1e-4,
        1e-6));
  }
}

TEST(Fsdp, AMetaModelIsMaterialisedUnitByUnitAsAWholeModelInit) {
  models::MPTForCausalLM whole = small_mpt();
  models::MPTOptions o = whole->options();
  o.init_device = "meta";
  models::MPTForCausalLM meta = models::build_mpt(o, 5);
  ASSERT_TRUE(meta->parameters()[0].is_meta());
  dist::ParallelOptions po;
  po.sharding.strategy = dist::ShardingStrategy::kFullShard;
  po.init_seed = 5;
  auto parallel = dist::parallelize(*meta, po, dist::Communicator::single());
  std::map<std::string, at::Tensor> expected;
  for (const auto& item : whole->named_parameters()) expected[item.key()] = item.value();
  for (const auto& [name, t] : parallel->full_state_dict()) {
    EXPECT_TRUE(at::equal(t, expected.at(name))) << name;
  }
  const at::Tensor ids = at::randint(50, {2, 16}, at::kLong);
  at::NoGradGuard no_grad;
  whole->eval();
  meta->eval();
  EXPECT_TRUE(at::allclose(meta->forward(ids), whole->forward(ids), 1e-6, 1e-6));
}

TEST(Fsdp, LlamaUnitsGiveThePlainModelsNumbersAndAMetaBuildTheWholeModelsInit) {
  models::LlamaOptions o;
  o.vocab_size = 50;
  o.hidden_size = 32;
  o.intermediate_size = 48;
  o.num_hidden_layers = 3;
  o.num_attention_heads = 4;
  o.num_key_value_heads = 2;
  o.head_dim = 8;
  o.max_position_embeddings = 16;
  o.tie_word_embeddings = true;
  models::LlamaForCausalLM plain = models::build_llama(o, 5);
  o.init_device = "meta";
  models::LlamaForCausalLM sharded = models::build_llama(o, 5);
  dist::ParallelOptions po;
  po.sharding.strategy = dist::ShardingStrategy::kFullShard;
  po.sharding.activation_checkpointing = true;
  po.init_seed = 5;
  auto parallel = dist::parallelize(*sharded, po, dist::Communicator::single());
  ASSERT_EQ(parallel->parameters().size(), 4u);  // root + 3 decoder layers
  std::map<std::string, at::Tensor> expected;
  for (const auto& item : plain->named_parameters()) expected[item.key()] = item.value();
  for (const auto& [name, t] : parallel->full_state_dict()) EXPECT_TRUE(at::equal(t, expected.at(name))) << name;

  const at::Tensor ids = at::randint(50, {2, 16}, at::kLong);
  const at::Tensor ref_logits = plain->forward(ids);
  models::causal_lm_loss(ref_logits, ids).backward();
  parallel->prepare_backward(true);
  const at::Tensor logits = sharded->forward(ids);
  models::causal_lm_loss(logits, ids).backward();
  parallel->finish_backward();
  EXPECT_TRUE(at::allclose(logits, ref_logits, 1e-6, 1e-6));
  expect_unit_gradients(*plain, *parallel, "llama");
}
