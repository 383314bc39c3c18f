// Multi-process tests of the communicator and the rendezvous, on CPU with Gloo: the ranks are copies of this test
// binary running a worker test (DistWorker.*), spawned through dist::launch.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

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

#include "dist_test_util.h"
#include "models/llama/llama.h"
#include "models/mpt/mpt.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/data/tokenizer.h"
#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/launcher.h"
#include "tessera/distributed/parallel_ops.h"
#include "tessera/distributed/sharding.h"
#include "tessera/models/context_parallel.h"
#include "tessera/models/loss.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/preemption.h"
#include "test_util.h"
#include "tiny_data.h"

namespace fs = std::filesystem;
using namespace tessera;
using tessera::testing::free_port;
using tessera::testing::is_worker;
using tessera::testing::launch_workers;
using tessera::testing::read_dist_log;

// ---- Collectives ----------------------------------------------------------------------------------------------------

// Runs in each of the 4 processes that DistCollectives.FourRanksOverGloo launches.
TEST(DistWorker, Collectives) {
  if (!is_worker()) GTEST_SKIP() << "a worker of DistCollectives.FourRanksOverGloo";
  const dist::Rendezvous rv = dist::rendezvous_from_env();
  auto comm = dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(60));
  const int r = comm->rank(), n = comm->size();
  ASSERT_EQ(n, 4);
  EXPECT_EQ(comm->backend_name(), "gloo");

  at::Tensor t = at::arange(5, at::kFloat) + r;
  comm->all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t, at::arange(5, at::kFloat) * n + n * (n - 1) / 2));
  EXPECT_DOUBLE_EQ(comm->stats().all_reduce_bytes, 2.0 * (n - 1) / n * 20);

  at::Tensor m = at::full({3}, static_cast<double>(r * r), at::kDouble);
  comm->all_reduce(m, dist::ReduceOp::kMax).wait();
  EXPECT_TRUE(at::equal(m, at::full({3}, 9.0, at::kDouble)));

  // reduce_scatter: rank r's input is arange(4n) * (r + 1); chunk k sums to arange chunk k * n(n+1)/2.
  at::Tensor in = at::arange(3 * n, at::kFloat) * (r + 1);
  at::Tensor out = at::empty({3}, at::kFloat);
  comm->reduce_scatter(out, in).wait();
  EXPECT_TRUE(at::equal(out, at::arange(3 * r, 3 * r + 3, at::kFloat) * (n * (n + 1) / 2)));

  at::Tensor mine = at::full({2}, static_cast<int64_t>(r), at::kLong);
  at::Tensor all = at::empty({2 * n}, at::kLong);
  comm->all_gather(all, mine).wait();
  EXPECT_TRUE(at::equal(all, at::arange(n, at::kLong).repeat_interleave(2)));

  at::Tensor b = at::full({4}, static_cast<float>(r), at::kFloat);
  comm->broadcast(b, n - 1).wait();
  EXPECT_TRUE(at::equal(b, at::full({4}, static_cast<float>(n - 1), at::kFloat)));

  // all_to_all with uneven rows, some zero, and rank 0 sending none at all: rank r sends rank q rows_of(r, q) rows
  // of 2 values, (100 r + q, i) for the i-th.
  auto rows_of = [](int from, int to) -> int64_t { return from == 0 ? 0 : (from + to) % 3; };
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  std::vector<at::Tensor> parts;
  for (int q = 0; q < n; ++q) {
    send[static_cast<size_t>(q)] = rows_of(r, q);
    recv[static_cast<size_t>(q)] = rows_of(q, r);
    const at::Tensor i = at::arange(rows_of(r, q), at::kFloat);
    parts.push_back(at::stack({at::full_like(i, 100.0f * static_cast<float>(r) + static_cast<float>(q)), i}, 1));
  }
  at::Tensor a2a_in = at::cat(parts);
  int64_t received = 0;
  for (int64_t k : recv) received += k;
  at::Tensor a2a_out = at::empty({received, 2}, at::kFloat);
  comm->all_to_all(a2a_out, a2a_in, recv, send).wait();
  std::vector<at::Tensor> expected;
  for (int q = 0; q < n; ++q) {
    const at::Tensor i = at::arange(rows_of(q, r), at::kFloat);
    expected.push_back(at::stack({at::full_like(i, 100.0f * static_cast<float>(q) + static_cast<float>(r)), i}, 1));
  }
  EXPECT_TRUE(at::equal(a2a_out, at::cat(expected))) << "rank " << r;

  // Two asynchronous collectives in flight at once, completed in order.
  at::Tensor a1 = at::ones({1000}), a2 = at::full({1000}, 2.0f);
  dist::Work w1 = comm->all_reduce(a1), w2 = comm->all_reduce(a2);
  w2.wait();
  w1.wait();
  EXPECT_EQ(a1[0].item<float>(), n);
  EXPECT_EQ(a2[999].item<float>(), 2 * n);

  // Groups: {0, 2} and {1, 3}; every rank calls new_group for both.
  auto even = comm->new_group({0, 2});
  auto odd = comm->new_group({1, 3});
  auto mine_group = r % 2 == 0 ? even : odd;
  ASSERT_TRUE(mine_group);
  EXPECT_FALSE(r % 2 == 0 ? odd : even);
  EXPECT_EQ(mine_group->size(), 2);
  at::Tensor g = at::full({1}, static_cast<float>(r), at::kFloat);
  mine_group->all_reduce(g).wait();
  EXPECT_EQ(g.item<float>(), r % 2 == 0 ? 2.0f : 4.0f);

  // Point to point: around a ring, two tags received in the opposite order of their sends.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  at::Tensor out1 = at::arange(3, at::kFloat) + 10 * r, out2 = at::full({2}, 100.0f + static_cast<float>(r));
  dist::Work s1 = comm->send(out1, next, /*tag=*/1);
  dist::Work s2 = comm->send(out2, next, /*tag=*/2);
  at::Tensor in1 = at::empty({3}), in2 = at::empty({2});
  comm->recv(in2, prev, 2).wait();
  comm->recv(in1, prev, 1).wait();
  s1.wait();
  s2.wait();
  EXPECT_TRUE(at::equal(in1, at::arange(3, at::kFloat) + 10 * prev));
  EXPECT_TRUE(at::equal(in2, at::full({2}, 100.0f + static_cast<float>(prev))));
  EXPECT_EQ(comm->stats().send_bytes, 5.0 * sizeof(float));
  // Within a group, peers are group ranks; messages name their ranks in the job.
  at::Tensor p = at::full({1}, static_cast<float>(r));
  if (mine_group->rank() == 0) {
    mine_group->send(p, 1).wait();
  } else {
    mine_group->recv(p, 0).wait();
    EXPECT_EQ(p.item<float>(), static_cast<float>(r - 2));
  }
  EXPECT_EQ(mine_group->global_rank_of(1), r % 2 == 0 ? 2 : 3);
  try {
    comm->send(out1, r);
    ADD_FAILURE() << "a send to itself";
  } catch (const dist::CommError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {} is not another rank of a group of 4", r)),
              std::string::npos)
        << e.what();
  }
  comm->barrier();
}

TEST(DistCollectives, FourRanksOverGloo) {
  if (is_worker()) GTEST_SKIP() << "launcher side";
  EXPECT_EQ(launch_workers("Collectives", 4), 0);
}

// ---- Context parallelism: a model's forward and backward on shards of the sequence ---------------------------------

namespace {

// Next-token cross-entropy summed over `targets` (B * s) of `logits` (B, s, V).
at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}), {}, at::Reduction::Sum,
                                data::kIgnoreLabel);
}

// `model`'s forward and backward on the whole sequence, then on this rank's shard over `group`: the shard's logits
// are the whole sequence's at its positions, and the group's losses and gradients, summed, are the whole sequence's.
// (The losses are sums over tokens, so the gradients are large: their tolerance is relative to their largest element.)
void expect_shards_match(models::CausalLM& model, const data::TokenBatch& batch,
                         const std::shared_ptr<dist::Communicator>& comm, const std::string& what) {
  const std::shared_ptr<dist::TensorParallelGroup> group = dist::group_collectives(comm);
  SCOPED_TRACE(what + ", a group of " + std::to_string(group->size()));
  model.train();
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model.parameters()) params.push_back(p);
  models::ForwardOptions fo;
  if (batch.attention_mask.defined()) fo.attention_mask = batch.attention_mask;
  if (batch.sequence_id.defined()) fo.sequence_id = batch.sequence_id;
  const at::Tensor whole = model.forward(batch.input_ids, fo);
  const at::Tensor whole_loss = summed_loss(whole, models::next_token_targets(batch.labels));
  const std::vector<at::Tensor> whole_grads = torch::autograd::grad({whole_loss}, params);

  fo.context = models::make_context_shard(dist::context_exchange(comm), batch.input_ids.size(1), at::kCPU);
  const data::TokenBatch shard = models::context_shard_batch(batch, *fo.context);
  const at::Tensor local = model.forward(batch.input_ids, fo);
  ASSERT_EQ(local.size(1), batch.input_ids.size(1) / group->size());
  EXPECT_TRUE(at::allclose(local, whole.detach().index_select(1, fo.context->positions), 1e-5, 1e-5));
  at::Tensor loss = summed_loss(local, models::next_token_targets(shard));
  std::vector<at::Tensor> grads = torch::autograd::grad({loss}, params);
  at::Tensor total = loss.detach().clone();
  group->all_reduce(total);
  EXPECT_NEAR(total.item<double>(), whole_loss.item<double>(), 1e-5 * whole_loss.item<double>());
  for (size_t i = 0; i < grads.size(); ++i) {
    at::Tensor g = grads[i].defined() ? grads[i].contiguous() : at::zeros_like(params[i]);
    group->all_reduce(g);
    // Within 1e-5 of the gradient's largest element (the summation order differs, and elements near 0 see the
    // absolute rounding of the largest).
    const double scale = whole_grads[i].abs().max().item<double>();
    EXPECT_LE((g - whole_grads[i]).abs().max().item<double>(), 1e-5 * scale + 1e-7) << "gradient " << i;
  }
}

// A worker's communicators over the whole world (4 ranks) and over its pair (ranks 0-1 or 2-3).
std::vector<std::shared_ptr<dist::Communicator>> world_and_pair() {
  std::shared_ptr<dist::Communicator> comm =
      dist::Communicator::connect(dist::rendezvous_from_env(), at::kCPU, std::chrono::seconds(60));
  std::shared_ptr<dist::Communicator> pair;
  for (int g = 0; g < comm->size() / 2; ++g) {
    if (auto c = comm->new_group({2 * g, 2 * g + 1})) pair = c;
  }
  return {comm, pair};
}

// Their collectives, as the engine's styles use them.
std::vector<std::shared_ptr<dist::TensorParallelGroup>> whole_world_and_pairs() {
  std::vector<std::shared_ptr<dist::TensorParallelGroup>> out;
  for (const auto& comm : world_and_pair()) out.push_back(dist::group_collectives(comm));
  return out;
}

}  // namespace

// Runs in each of the 4 processes that DistContextParallel.ShardsMatchTheWholeSequence launches.
TEST(DistWorker, ContextParallel) {
  if (!is_worker()) GTEST_SKIP() << "a worker of DistContextParallel.ShardsMatchTheWholeSequence";
  const std::vector<std::shared_ptr<dist::Communicator>> groups = world_and_pair();
  ASSERT_EQ(groups[0]->size(), 4);
  // Two rows of 32 tokens (the same on every rank): packed documents whose boundaries fall inside chunks, and a row
  // with left padding.
  const int64_t s = 32;
  at::manual_seed(11);
  data::TokenBatch packed;
  packed.input_ids = at::randint(0, 50, {2, s}, at::kLong);
  packed.labels = packed.input_ids.clone();
  packed.sequence_id = at::cat(
      {at::cat({at::zeros({1, 11}, at::kLong), at::ones({1, 13}, at::kLong), at::full({1, 8}, 2, at::kLong)}, 1),
       at::cat({at::zeros({1, 19}, at::kLong), at::ones({1, 13}, at::kLong)}, 1)});
  packed.labels.masked_fill_(packed.sequence_id.roll(-1, 1) != packed.sequence_id, data::kIgnoreLabel);
  data::TokenBatch padded;
  padded.input_ids = packed.input_ids.clone();
  padded.attention_mask = at::ones({2, s}, at::kLong);
  padded.attention_mask[1].narrow(0, 0, 5).zero_();
  padded.labels = padded.input_ids.masked_fill(padded.attention_mask == 0, data::kIgnoreLabel);
  data::TokenBatch plain;
  plain.input_ids = packed.input_ids;
  plain.labels = packed.input_ids.clone();

  models::LlamaOptions lo;  // grouped-query attention with rotary positions
  lo.vocab_size = 50, lo.hidden_size = 32, lo.intermediate_size = 48, lo.num_hidden_layers = 2;
  lo.num_attention_heads = 4, lo.num_key_value_heads = 2, lo.head_dim = 8, lo.max_position_embeddings = s;
  models::MPTOptions mo;  // ALiBi and packed-document attention in the additive mask
  mo.d_model = 32, mo.n_heads = 4, mo.n_layers = 2, mo.vocab_size = 50, mo.max_seq_len = s;
  mo.attn.kv_n_heads = 4, mo.attn.alibi = true, mo.attn.attn_uses_sequence_id = true, mo.learned_pos_emb = false;
  models::MPTOptions learned = mo;  // learned positions, added before the cut
  learned.attn.alibi = false, learned.attn.attn_uses_sequence_id = false, learned.learned_pos_emb = true;
  for (const auto& group : groups) {
    models::LlamaForCausalLM llama = models::build_llama(lo, 5);
    expect_shards_match(*llama, plain, group, "Llama, causal");
    expect_shards_match(*llama, packed, group, "Llama, packed documents");
    expect_shards_match(*llama, padded, group, "Llama, left padding");
    models::MPTForCausalLM alibi = models::build_mpt(mo, 5);
    expect_shards_match(*alibi, packed, group, "MPT with ALiBi, packed documents");
    models::MPTForCausalLM positions = models::build_mpt(learned, 5);
    expect_shards_match(*positions, padded, group, "MPT with learned positions, left padding");
  }
}

// Runs in each of the 4 processes that DistTensorParallel.VocabularyParallelLossAndEmbeddingMatchTheWholeVocabulary
// launches.
TEST(DistWorker, VocabParallel) {
  if (!is_worker()) GTEST_SKIP() << "a worker of DistTensorParallel.VocabularyParallel*";
  const std::vector<std::shared_ptr<dist::TensorParallelGroup>> groups = whole_world_and_pairs();
  ASSERT_EQ(groups[0]->size(), 4);
  const int64_t vocab = 12;
  at::manual_seed(3);  // the same on every rank
  const at::Tensor logits = at::randn({2, 8, vocab}, at::kFloat) * 3;
  data::TokenBatch batch;
  batch.input_ids = at::randint(0, vocab, {2, 8}, at::kLong);
  batch.labels = batch.input_ids.clone();
  batch.labels.index_put_({0, 3}, data::kIgnoreLabel);
  const at::Tensor table = at::randn({vocab, 5}, at::kFloat);
  const at::Tensor ids = at::randint(0, vocab, {3, 7}, at::kLong);
  for (const auto& group : groups) {
    const dist::VocabShard v = dist::vocab_shard(vocab, *group);
    ASSERT_EQ(v.rows, vocab / group->size());
    for (const models::CrossEntropyOptions o :
         {models::CrossEntropyOptions{}, models::CrossEntropyOptions{0.1, 1e-3}}) {
      SCOPED_TRACE(
          fmt::format("group of {}, label smoothing {}, z-loss {}", group->size(), o.label_smoothing, o.z_loss));
      // The whole vocabulary's loss and gradient (torch's cross-entropy, through CrossEntropyLoss).
      const at::Tensor whole = logits.clone().requires_grad_(true);
      const at::Tensor want = models::CrossEntropyLoss(o).sum(whole, batch);
      want.backward();
      // This rank's columns only.
      const at::Tensor mine = logits.narrow(2, v.start, v.rows).clone().requires_grad_(true);
      const at::Tensor got = dist::vocab_parallel_cross_entropy(mine, models::next_token_targets(batch), vocab,
                                                                o.label_smoothing, o.z_loss, group);
      got.backward();
      EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-5 * want.item<double>());
      EXPECT_TRUE(at::allclose(mine.grad(), whole.grad().narrow(2, v.start, v.rows), 1e-5, 1e-6));
    }
    // The gathered logits are the whole vocabulary's; backward keeps this rank's columns.
    const at::Tensor part = logits.narrow(2, v.start, v.rows).clone().requires_grad_(true);
    const at::Tensor joined = dist::vocab_gather(part, group);
    EXPECT_TRUE(at::equal(joined, logits));
    (joined * at::arange(vocab, at::kFloat)).sum().backward();
    EXPECT_TRUE(
        at::equal(part.grad(), at::arange(vocab, at::kFloat).narrow(0, v.start, v.rows).expand({2, 8, v.rows})));
    // The embedding from this rank's rows: every id's row after the sum, with the padding row's gradient zero.
    const at::Tensor rows = table.narrow(0, v.start, v.rows).clone().requires_grad_(true);
    const at::Tensor looked_up = dist::vocab_parallel_embedding(rows, ids, vocab, /*padding_idx=*/5, group);
    EXPECT_TRUE(at::allclose(looked_up, at::embedding(table, ids)));
    looked_up.sum().backward();
    const at::Tensor whole_table = table.clone().requires_grad_(true);
    at::embedding(whole_table, ids, 5).sum().backward();
    EXPECT_TRUE(at::equal(rows.grad(), whole_table.grad().narrow(0, v.start, v.rows)));
  }
}

TEST(DistTensorParallel, VocabularyParallelLossAndEmbeddingMatchTheWholeVocabulary) {
  if (is_worker()) GTEST_SKIP() << "launcher side";
  EXPECT_EQ(launch_workers("VocabParallel", 4), 0);
}

TEST(DistContextParallel, ShardsMatchTheWholeSequence) {
  if (is_worker()) GTEST_SKIP() << "launcher side";
  // Each rank holds chunks r and 2C - 1 - r of 2C: positions 0-3 and 28-31 on rank 0 of 4, 8-15 and 16-23 ... of 2.
  EXPECT_EQ(models::context_parallel_positions(16, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(models::context_parallel_positions(16, 2, 1), (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(launch_workers("ContextParallel", 4), 0);
}

TEST(DistCollectives, AWorldOfOneIsLocalUnlessAProcessGroupIsAskedFor) {
  dist::Rendezvous rv;
  rv.master_port = free_port();
  EXPECT_EQ(dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(30))->backend_name(), "local");
  auto comm = dist::Communicator::connect(rv, at::kCPU, std::chrono::seconds(30), /*process_group_for_one=*/true);
  EXPECT_EQ(comm->backend_name(), "gloo");
  at::Tensor t = at::arange(4, at::kFloat);
  comm->all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
  at::Tensor all = at::empty({4}, at::kFloat);
  comm->all_gather(all, t).wait();
  EXPECT_TRUE(at::equal(all, t));
  EXPECT_DOUBLE_EQ(comm->stats().all_reduce_bytes, 0.0);  // a ring of one sends nothing
}

// Runs in the 2 processes of DistCollectives.ATimedOutCollectiveNamesRankAndOperation.
TEST(DistWorker, Timeout) {
  if (!is_worker()) GTEST_SKIP() << "a worker of DistCollectives.ATimedOutCollectiveNamesRankAndOperation";
  auto comm = dist::Communicator::connect(dist::rendezvous_from_env(), at::kCPU, std::chrono::seconds(2));
  // Rank 1 stays up past rank 0's timeout, so rank 0 sees a timed-out collective rather than a closed connection.
  const double scale = ::tessera::testing::time_scale();
  if (comm->rank() == 1) {  // never joins the collective
    std::this_thread::sleep_for(std::chrono::duration<double>(2 + 4 * scale));
    return;
  }
  at::Tensor t = at::ones({1000});
  const auto start = std::chrono::steady_clock::now();
  try {
    comm->all_reduce(t).wait();
    ADD_FAILURE() << "the all_reduce completed without its peer";
  } catch (const dist::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: all_reduce of 1000 Float elements failed"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2 + 2 * scale);
}

TEST(DistCollectives, ATimedOutCollectiveNamesRankAndOperation) {
  if (is_worker()) GTEST_SKIP() << "launcher side";
  EXPECT_EQ(launch_workers("Timeout", 2), 0);
}

TEST(DistWorker, RecvTimeout) {
  if (!is_worker()) GTEST_SKIP() << "a worker of DistCollectives.ATimedOutReceiveNamesThePeerAndWhatItWaitsFor";
  auto comm = dist::Communicator::connect(dist::rendezvous_from_env(), at::kCPU, std::chrono::seconds(2));
  const double scale = ::tessera::testing::time_scale();
  if (comm->rank() == 1) {  // a pipeline stage that never sends (stopped)
    std::this_thread::sleep_for(std::chrono::duration<double>(2 + 4 * scale));
    return;
  }
  at::Tensor grad = at::empty({3});
  try {
    comm->recv(grad, 1, /*tag=*/1, "the gradient of microbatch 0 from pipeline stage 1").wait();
    ADD_FAILURE() << "the recv completed without a send";
  } catch (const dist::CommError& e) {
    // What a failure and the watchdog's hang report (the same operation text) say a stage waits on.
    EXPECT_NE(std::string(e.what()).find("rank 0: recv of 3 Float elements from rank 1 (the gradient of microbatch 0 "
                                         "from pipeline stage 1) failed"),
              std::string::npos)
        << e.what();
  }
}

TEST(DistCollectives, ATimedOutReceiveNamesThePeerAndWhatItWaitsFor) {
  if (is_worker()) GTEST_SKIP() << "launcher side";
  EXPECT_EQ(launch_workers("RecvTimeout", 2), 0);
}

TEST(DistCollectives, WorldOfOneIsLocal) {
  auto comm = dist::Communicator::single();
  EXPECT_EQ(comm->size(), 1);
  at::Tensor in = at::arange(4, at::kFloat), out = at::empty({4});
  comm->all_gather(out, in).wait();
  EXPECT_TRUE(at::equal(out, in));
  comm->all_reduce(in).wait();
  EXPECT_TRUE(at::equal(in, at::arange(4, at::kFloat)));
  EXPECT_EQ(comm->stats().total_bytes(), 0);
}

TEST(DistRendezvous, PlacementFromHostIdentitiesIsNodeByNode) {
  dist::Rendezvous rv;
  rv.rank = 4;
  rv.world_size = 6;
  rv.placement_known = false;
  const dist::Rendezvous placed =
      dist::place_by_hosts(rv, {"a 10.0.0.1", "a 10.0.0.1", "a 10.0.0.2", "a 10.0.0.2", "b 10.0.0.3", "b 10.0.0.3"});
  EXPECT_TRUE(placed.placement_known);
  EXPECT_EQ(placed.local_world_size, 2);
  EXPECT_EQ(placed.local_rank, 0);
  EXPECT_EQ(placed.node_rank(), 2);
  EXPECT_EQ(dist::place_by_hosts(rv, std::vector<std::string>(6, "x")).local_world_size, 6);
  EXPECT_EQ(dist::place_by_hosts(rv, {"0", "1", "2", "3", "4", "5"}).num_nodes(), 6);
  // Interleaved (round-robin) placement, uneven nodes, a machine coming back: refused, naming the hosts.
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"a", "b", "a", "b", "a", "b"}, {"a", "a", "a", "a", "b", "b"}, {"a", "a", "b", "b", "a", "a"}}) {
    try {
      dist::place_by_hosts(rv, bad);
      ADD_FAILURE() << "accepted " << fmt::format("{}", fmt::join(bad, ","));
    } catch (const dist::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("not placed node by node"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1 on " + bad[1]), std::string::npos) << e.what();
    }
  }
}

TEST(DistRendezvous, ReadsTorchrunAndSlurmVariables) {
  if (is_worker()) GTEST_SKIP();
  const char* names[] = {"RANK",          "WORLD_SIZE",   "LOCAL_RANK",           "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR",   "MASTER_PORT",  "SLURM_PROCID",         "SLURM_NTASKS",
                         "SLURM_LOCALID", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE"};
  for (const char* v : names) unsetenv(v);
  EXPECT_EQ(dist::rendezvous_from_env().world_size, 1);
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "29555", 1);
  dist::Rendezvous rv = dist::rendezvous_from_env();
  EXPECT_EQ(rv.rank, 5);
  EXPECT_EQ(rv.node_rank(), 1);
  EXPECT_EQ(rv.num_nodes(), 2);
  EXPECT_EQ(rv.master_addr, "10.0.0.7");
  EXPECT_EQ(rv.master_port, 29555);
  setenv("LOCAL_WORLD_SIZE", "3", 1);  // 8 ranks do not split into nodes of 3
  EXPECT_THROW(dist::rendezvous_from_env(), ConfigError);
  setenv("RANK", "x", 1);
  EXPECT_THROW(dist::rendezvous_from_env(), ConfigError);
  for (const char* v : names) unsetenv(v);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NTASKS_PER_NODE", "2", 1);
  setenv("MASTER_ADDR", "node0", 1);
  rv = dist::rendezvous_from_env();
  EXPECT_EQ(rv.rank, 3);
  EXPECT_EQ(rv.world_size, 4);
  EXPECT_EQ(rv.node_rank(), 1);
  EXPECT_TRUE(rv.placement_known);
  // srun over several nodes without --ntasks-per-node: the rendezvous finds the placement (it needs MASTER_ADDR).
  unsetenv("SLURM_NTASKS_PER_NODE");
  rv = dist::rendezvous_from_env();
  EXPECT_FALSE(rv.placement_known);
  EXPECT_EQ(rv.rank, 3);
  unsetenv("MASTER_ADDR");
  EXPECT_THROW(dist::rendezvous_from_env(), ConfigError);
  // ... on one node every task is local.
  setenv("SLURM_NNODES", "1", 1);
  rv = dist::rendezvous_from_env();
  EXPECT_TRUE(rv.placement_known);
  EXPECT_EQ(rv.local_world_size, 4);
  EXPECT_EQ(rv.local_rank, 1);
  for (const char* v : names) unsetenv(v);
  // A PyTorchJob pod: MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK only.
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "job-master-0", 1);
  setenv("MASTER_PORT", "23456", 1);
  rv = dist::rendezvous_from_env();
  EXPECT_FALSE(rv.placement_known);
  EXPECT_EQ(rv.master_addr, "job-master-0");
  for (const char* v : names) unsetenv(v);
}
