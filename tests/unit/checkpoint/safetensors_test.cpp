// safetensors files and HF folders: round trips, sharding, and clear errors for every kind of damage.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/mpt/mpt.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/util/error.h"
#include "test_util.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "tessera_st" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using tessera::testing::error_of;

// An MPT folder's config.json read as the MPT family reads it.
models::MPTOptions read_mpt_config(const fs::path& dir) {
  std::ifstream in(dir / "config.json");
  return models::mpt_options_from_hf_config(nlohmann::json::parse(in), (dir / "config.json").string());
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  const fs::path file = temp_dir("roundtrip") / "t.safetensors";
  std::map<std::string, at::Tensor> tensors = {{"f32", at::randn({3, 4})},
                                               {"bf16", at::randn({5}).to(at::kBFloat16)},
                                               {"f16", at::randn({2, 2}).to(at::kHalf)},
                                               {"i64", at::arange(6, at::kLong).view({2, 3})},
                                               {"i32", at::arange(4, at::kInt)},
                                               {"u8", at::arange(7, at::kByte)},
                                               {"bool", at::tensor({1, 0, 1}).to(at::kBool)},
                                               {"f64", at::randn({1}, at::kDouble)},
                                               {"scalar", at::tensor(3.5f)},
                                               {"empty", at::zeros({0, 4})},
                                               {"noncontig", at::randn({4, 3}).t()}};
  save_safetensors(file.string(), tensors, {{"format", "pt"}});
  SafetensorsFile f(file.string());
  EXPECT_EQ(f.names().size(), tensors.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(at::equal(f.load(name), t)) << name;
    EXPECT_EQ(f.info(name).dtype, t.scalar_type()) << name;
  }
  EXPECT_TRUE(at::equal(f.load("bf16", at::kFloat), tensors["bf16"].to(at::kFloat)));
  EXPECT_EQ(read_bytes(file).size() % 8, 0u);
}

TEST(Safetensors, DamagedFilesAreNamedErrors) {
  const fs::path dir = temp_dir("damaged");
  const fs::path good = dir / "good.safetensors";
  save_safetensors(good.string(), {{"w", at::randn({16, 16})}, {"b", at::randn({16})}});
  const std::string bytes = read_bytes(good);
  const fs::path bad = dir / "bad.safetensors";
  auto open_bad = [&] { SafetensorsFile f(bad.string()); };

  write_bytes(bad, bytes.substr(0, bytes.size() - 10));  // truncated data
  EXPECT_NE(error_of(open_bad).find(bad.string() + ": truncated: tensor w ends at byte"), std::string::npos)
      << error_of(open_bad);
  write_bytes(bad, bytes.substr(0, 5));  // not even a header length
  EXPECT_NE(error_of(open_bad).find("truncated"), std::string::npos);
  std::string huge = bytes;
  huge[5] = '\x7f';  // header length far beyond the file
  write_bytes(bad, huge);
  EXPECT_NE(error_of(open_bad).find("bad header"), std::string::npos);
  std::string json = bytes;
  json[8] = 'X';  // the header is no longer JSON
  write_bytes(bad, json);
  EXPECT_NE(error_of(open_bad).find("bad header: not valid JSON"), std::string::npos);
  std::string dtype = bytes;
  dtype.replace(dtype.find("\"F32\""), 5, "\"Q32\"");
  write_bytes(bad, dtype);
  EXPECT_NE(error_of(open_bad).find("tensor b"), std::string::npos) << error_of(open_bad);
  std::string shape = bytes;
  shape.replace(shape.find("[16,16]"), 7, "[16,17]");
  write_bytes(bad, shape);
  EXPECT_NE(error_of(open_bad).find("tensor w: data_offsets"), std::string::npos) << error_of(open_bad);
  EXPECT_NE(error_of([&] { SafetensorsFile f((dir / "none.safetensors").string()); }).find("cannot open"),
            std::string::npos);
}

// A safetensors file with `header` as its JSON header and `data` as its data section.
std::string crafted_safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (char& b : out) b = static_cast<char>(n & 0xff), n >>= 8;
  return out + header + data;
}

TEST(Safetensors, HeaderSizesAreCheckedNotWrappedAround) {
  const fs::path file = temp_dir("sizes") / "crafted.safetensors";
  const auto error_for = [&](const std::string& header, const std::string& data) {
    write_bytes(file, crafted_safetensors(header, data));
    return error_of([&] { SafetensorsFile f(file.string()); });
  };
  const std::string where = file.string() + ": tensor w: ";
  // 2^62 float32 elements are 2^64 bytes, which wrapped around to 0 and matched data_offsets [0, 0]: a view of 2^62
  // elements over an empty data section.
  std::string err = error_for(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", "");
  EXPECT_NE(err.find(where + "shape 4611686018427387904 of F32 needs more than 2^64 bytes"), std::string::npos) << err;
  // Element counts past 2^64 (2^32 x 2^32 wrapped to 0) or past int64 (a tensor's sizes) are refused as well.
  for (const char* shape : {"[4294967296,4294967296]", "[9223372036854775807,2]"}) {
    err = error_for(std::string(R"({"w":{"dtype":"U8","shape":)") + shape + R"(,"data_offsets":[0,0]}})", "");
    EXPECT_NE(err.find(where + "shape "), std::string::npos) << err;
    EXPECT_NE(err.find("has more elements than a tensor can hold"), std::string::npos) << err;
  }
  // Offsets whose difference is right but which lie far beyond the file.
  err = error_for(R"({"w":{"dtype":"U8","shape":[3],"data_offsets":[18446744073709551612,18446744073709551615]}})",
                  "abcd");
  EXPECT_NE(err.find(file.string() + ": truncated: tensor w ends at byte 18446744073709551615 of a 4-byte data"),
            std::string::npos)
      << err;
  // The same construction with honest sizes reads back.
  write_bytes(file, crafted_safetensors(R"({"w":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_TRUE(
      at::equal(SafetensorsFile(file.string()).load("w"), at::tensor({97, 98, 99, 100}, at::kByte).view({2, 2})));
}

TEST(Safetensors, ShardedDirectoriesWithIndex) {
  const fs::path dir = temp_dir("sharded");
  std::map<std::string, at::Tensor> tensors;
  for (int i = 0; i < 5; ++i) tensors["layer" + std::to_string(i)] = at::randn({64, 64});  // 16 KiB each
  const auto files = save_sharded_safetensors(dir.string(), tensors, 40 * 1024);
  EXPECT_EQ(files.size(), 3u);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  auto opened = open_safetensors_dir(dir.string());
  ASSERT_EQ(opened.size(), 5u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(opened[name]->load(name), t)) << name;
  fs::remove(dir / files[1]);
  EXPECT_NE(error_of([&] { open_safetensors_dir(dir.string()); }).find("does not exist"), std::string::npos);
  // Re-saving small removes the stale index.
  save_sharded_safetensors(dir.string(), {{"x", at::ones({2})}}, 1 << 20);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(open_safetensors_dir(dir.string()).size(), 1u);
}

TEST(Safetensors, IndexShardNamesAreNamesNotPaths) {
  // model.safetensors.index.json's weight_map names the shard of each tensor; "../decoy/x" or "/abs" once opened a
  // file outside the folder. A hub snapshot's shards, symlinks into ../../blobs, still open.
  const fs::path root = temp_dir("index_names");
  const fs::path dir = root / "model", decoy = root / "decoy";
  std::map<std::string, at::Tensor> tensors;
  for (int i = 0; i < 3; ++i) tensors["layer" + std::to_string(i)] = at::randn({64, 64});  // 16 KiB each
  const auto files = save_sharded_safetensors(dir.string(), tensors, 20 * 1024);
  ASSERT_EQ(files.size(), 3u);
  fs::create_directories(decoy);
  fs::copy_file(dir / files[0], decoy / "shard.safetensors");  // what a followed name would open
  const std::string decoy_bytes = read_bytes(decoy / "shard.safetensors");
  const fs::path index_path = dir / "model.safetensors.index.json";
  const nlohmann::json good = nlohmann::json::parse(read_bytes(index_path));
  for (const std::string& bad : {std::string("../decoy/shard.safetensors"), (decoy / "shard.safetensors").string(),
                                 std::string("./") + files[0]}) {
    nlohmann::json index = good;
    index["weight_map"]["layer0"] = bad;
    write_bytes(index_path, index.dump());
    const std::string err = error_of([&] { open_safetensors_dir(dir.string()); });
    EXPECT_NE(err.find(index_path.string() + ": shard file name \"" + bad + "\""), std::string::npos) << err;
    EXPECT_NE(err.find("refusing to use it as a path"), std::string::npos) << err;
  }
  EXPECT_EQ(read_bytes(decoy / "shard.safetensors"), decoy_bytes);
  EXPECT_EQ(fs::directory_iterator(decoy)->path().filename(), "shard.safetensors");
  // huggingface_hub's cache layout: snapshots/<rev>/<file> -> ../../blobs/<hash>.
  const fs::path blobs = root / "hub" / "blobs", snap = root / "hub" / "snapshots" / "c0ffee";
  fs::create_directories(blobs);
  fs::create_directories(snap);
  write_bytes(index_path, good.dump());
  for (const std::string& f : std::vector<std::string>{files[0], files[1], files[2], "model.safetensors.index.json"}) {
    fs::copy_file(dir / f, blobs / ("blob-" + f));
    fs::create_symlink(fs::path("..") / ".." / "blobs" / ("blob-" + f), snap / f);
  }
  const auto opened = open_safetensors_dir(snap.string());
  ASSERT_EQ(opened.size(), 3u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(opened.at(name)->load(name), t)) << name;
}

TEST(HfFolder, ExportLoadRoundTripAndWeightErrors) {
  models::MPTOptions o;
  o.d_model = 32, o.n_heads = 4, o.n_layers = 2, o.vocab_size = 50, o.max_seq_len = 16, o.attn.kv_n_heads = 4;
  o.init.init_div_is_residual = 2.0;
  auto model = models::build_mpt(o, 9);
  const fs::path dir = temp_dir("hf");
  const at::Tensor ids = at::randint(0, 50, {2, 7}, at::kLong);
  // transformers' layout: learned positions and biases are GPT-2, Conv1D weights transposed.
  save_hf_model(*model, (dir / "gpt2").string());
  {
    SafetensorsFile f((dir / "gpt2" / "model.safetensors").string());
    EXPECT_TRUE(at::equal(f.load("transformer.h.1.attn.c_attn.weight"),
                          model->named_parameters()["transformer.blocks.1.attn.Wqkv.weight"].t()));
    EXPECT_FALSE(f.contains("lm_head.weight"));  // tied
    auto loaded = load_hf_model((dir / "gpt2").string());
    EXPECT_TRUE(at::equal(loaded->forward(ids), model->forward(ids)));
  }
  // The family's own layout (LLM Foundry's MPT).
  save_hf_model(*model, (dir / "m").string(), at::kFloat, uint64_t{5} << 30, HfLayout::kFamily);
  auto loaded = load_hf_model((dir / "m").string());
  EXPECT_TRUE(at::equal(loaded->forward(ids), model->forward(ids)));
  EXPECT_EQ(read_mpt_config(dir / "m").max_seq_len, 16);

  // Missing, unexpected and mis-shaped tensors are named.
  auto tensors = open_safetensors_dir((dir / "m").string());
  std::map<std::string, at::Tensor> copy;
  for (const auto& [n, f] : tensors) copy[n] = f->load(n);
  auto write_variant = [&](const std::map<std::string, at::Tensor>& t) {
    save_safetensors((dir / "m" / "model.safetensors").string(), t);
  };
  auto missing = copy;
  missing.erase("transformer.blocks.1.ffn.up_proj.weight");
  write_variant(missing);
  EXPECT_NE(error_of([&] {
              load_hf_model((dir / "m").string());
            }).find("missing tensor transformer.blocks.1.ffn.up_proj.weight"),
            std::string::npos);
  auto extra = copy;
  extra["transformer.blocks.9.attn.Wqkv.weight"] = at::zeros({1});
  write_variant(extra);
  EXPECT_NE(error_of([&] { load_hf_model((dir / "m").string()); }).find("unexpected tensor transformer.blocks.9"),
            std::string::npos);
  auto shaped = copy;
  shaped["transformer.norm_f.weight"] = at::ones({31});
  write_variant(shaped);
  EXPECT_NE(error_of([&] {
              load_hf_model((dir / "m").string());
            }).find("tensor transformer.norm_f.weight has shape [31], the model expects [32]"),
            std::string::npos);
  write_bytes(dir / "m" / "config.json", "{\"model_type\": \"llama\"}");
  EXPECT_NE(error_of([&] { read_mpt_config(dir / "m"); }).find("model_type is \"llama\", expected \"mpt\""),
            std::string::npos);
  write_bytes(dir / "m" / "config.json", "{\"model_type\": \"mpt\", \"d_model\": 30, \"n_heads\": 4}");
  EXPECT_NE(error_of([&] { read_mpt_config(dir / "m"); }).find("n_heads: must divide d_model (30)"), std::string::npos);
}

TEST(HfFolder, ModelsTransformersCannotComputeAreRefusedWithTheReasonBeforeWriting) {
  models::MPTOptions o;
  o.d_model = 32, o.n_heads = 4, o.n_layers = 1, o.vocab_size = 50, o.max_seq_len = 16, o.attn.kv_n_heads = 4;
  o.init.init_div_is_residual = 2.0;
  const fs::path dir = temp_dir("refused");
  auto refusal = [&](const models::MPTOptions& opts) {
    auto model = models::build_mpt(opts, 1);
    fs::remove_all(dir / "out");
    const std::string err = error_of([&] { save_hf_model(*model, (dir / "out").string()); });
    EXPECT_FALSE(fs::exists(dir / "out")) << "nothing is written";
    EXPECT_NE(err.find("--layout llm-foundry"), std::string::npos) << err;
    return err;
  };
  models::MPTOptions alibi = o;
  alibi.attn.alibi = true, alibi.learned_pos_emb = false;  // with biases: transformers' MPT has none
  EXPECT_NE(refusal(alibi).find("MptForCausalLM (ALiBi, no biases) cannot represent biases (no_bias: false)"),
            std::string::npos);
  models::MPTOptions gqa = o;
  gqa.attn.attn_type = "grouped_query_attention", gqa.attn.kv_n_heads = 2;
  EXPECT_NE(refusal(gqa).find("GPT2LMHeadModel (learned positions) cannot represent attn_config.attn_type "
                              "grouped_query_attention (kv_n_heads 2 of 4 heads)"),
            std::string::npos);
  models::MPTOptions glu = o;
  glu.ffn.type = models::FfnType::kGLU, glu.attn.qk_ln = true;
  EXPECT_NE(refusal(glu).find("attn_config.qk_ln, ffn_config.ffn_type mptglu"), std::string::npos);
  // ALiBi without biases is transformers' MPT, in the family's names.
  alibi.no_bias = true;
  auto model = models::build_mpt(alibi, 1);
  save_hf_model(*model, (dir / "mpt").string());
  EXPECT_EQ(read_mpt_config(dir / "mpt").attn.alibi, true);
}

TEST(HfFolder, BiasesTheModelLacksAreZerosInGpt2AndMustStayZeros) {
  models::MPTOptions o;
  o.d_model = 32, o.n_heads = 4, o.n_layers = 1, o.vocab_size = 50, o.max_seq_len = 16, o.attn.kv_n_heads = 4;
  o.no_bias = true, o.tie_word_embeddings = false, o.init.init_div_is_residual = 2.0;
  auto model = models::build_mpt(o, 2);
  const fs::path dir = temp_dir("zeros");
  save_hf_model(*model, (dir / "g").string());
  SafetensorsFile f((dir / "g" / "model.safetensors").string());
  EXPECT_EQ(f.load("transformer.h.0.mlp.c_fc.bias").count_nonzero().item<int64_t>(), 0);
  EXPECT_TRUE(f.contains("lm_head.weight"));
  // Read back into the same (bias-free) architecture: the zeros stand for nothing.
  auto again = models::build_mpt(o, 3);
  load_weights(*again, HfWeights(*again, (dir / "g").string()));
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), again->named_parameters()[p.key()])) << p.key();
  }
  const at::Tensor ids = at::randint(0, 50, {2, 5}, at::kLong);
  EXPECT_TRUE(at::equal(again->forward(ids), model->forward(ids)));
  // A bias that is not zero would be a different function: refused, naming it.
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& n : f.names()) tensors[n] = f.load(n);
  tensors["transformer.h.0.mlp.c_fc.bias"] = at::ones({128});
  save_safetensors((dir / "g" / "model.safetensors").string(), tensors);
  EXPECT_NE(error_of([&] {
              load_weights(*again, HfWeights(*again, (dir / "g").string()));
            }).find("tensor transformer.h.0.mlp.c_fc.bias is not all zeros"),
            std::string::npos);
  // Loaded as its own model, the GPT-2 folder has biases and computes what it stores.
  auto with_bias = load_hf_model((dir / "g").string());
  EXPECT_FALSE(std::dynamic_pointer_cast<models::MPTForCausalLMImpl>(with_bias)->options().no_bias);
}

}  // namespace
}  // namespace tessera::checkpoint
