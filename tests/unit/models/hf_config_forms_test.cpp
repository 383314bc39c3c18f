// config.json in transformers 5's form (rope_parameters, dtype) reads as the transformers 4 form it stands for, in
// every family; keys a family does not read that can change the model are refused by name; and none of the keys
// transformers 4.57.6 and 5.25.0 write for each family's default configuration is refused
// (tests/data/hf_default_configs/, written by tests/compat/hf_default_configs.py). Folders saved by transformers 5
// are loaded against its logits in tests/compat/test_transformers5_configs.py.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "models/falcon/falcon.h"
#include "models/gemma/gemma.h"
#include "models/gpt_neox/gpt_neox.h"
#include "models/llama/llama.h"
#include "models/mpt/mpt.h"
#include "models/phi3/phi3.h"
#include "tessera/config/value.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/family_support.h"
#include "tessera/models/hf_causal_lm.h"
#include "tessera/util/error.h"
#include "test_util.h"

namespace tessera::models {
namespace hf_config_forms_test {

using nlohmann::json;
using testing::error_of;

const json kLlama = {
    {"model_type", "llama"},    {"hidden_size", 64},        {"intermediate_size", 96}, {"num_hidden_layers", 2},
    {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 101},       {"max_position_embeddings", 64}};

json with(json base, const json& changes) {
  base.update(changes);
  return base;
}

json read_fixture(const std::string& name) {
  std::ifstream in(std::filesystem::path(testing::source_dir()) / "tests" / "data" / "hf_default_configs" / name);
  return json::parse(in);
}

TEST(HfConfigForms, ALlama3FolderOfTransformers5ReadsItsRopeParameters) {
  // What transformers 5 writes for Llama 3.1 (the finding: Tessera took the default base of 10000, 5e-3 apart).
  const json v5 = with(kLlama, {{"dtype", "bfloat16"},
                                {"rope_parameters",
                                 {{"rope_type", "llama3"},
                                  {"rope_theta", 500000.0},
                                  {"factor", 8.0},
                                  {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 16}}}});
  const LlamaOptions o = llama_options_from_hf_config(v5, "m/config.json");
  EXPECT_EQ(o.rope_theta, 500000.0);
  EXPECT_EQ(o.rope_scaling.type, "llama3");
  EXPECT_EQ(o.rope_scaling.factor, 8.0);
  EXPECT_EQ(o.rope_scaling.original_max_position_embeddings, 16);
  // The same options as transformers 4's form of that config.
  const json v4 = with(kLlama, {{"torch_dtype", "bfloat16"},
                                {"rope_theta", 500000.0},
                                {"rope_scaling",
                                 {{"rope_type", "llama3"},
                                  {"factor", 8.0},
                                  {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 16}}}});
  EXPECT_EQ(llama_hf_config(o, at::kFloat),
            llama_hf_config(llama_options_from_hf_config(v4, "m/config.json"), at::kFloat));
  // rope_type default (every plain rotary config of transformers 5): only the base.
  const LlamaOptions plain = llama_options_from_hf_config(
      with(kLlama, {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1234.0}}}}), "m/config.json");
  EXPECT_EQ(plain.rope_theta, 1234.0);
  EXPECT_EQ(plain.rope_scaling.type, "default");
}

TEST(HfConfigForms, ConfigOverridesNameTransformers4KeysWhicheverFormTheFolderIsIn) {
  // hf_causal_lm's config_overrides, as LLM Foundry's recipes write them (rope_theta), on a folder saved by
  // transformers 5 (rope_parameters): the override applies instead of being refused as "not in config.json".
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tessera_hf_config_forms_overrides";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << with(kLlama,
                                             {{"dtype", "float32"},
                                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5e5}}}})
                                            .dump();
  config::Origin origin;
  origin.file = "recipe.yaml";
  config::Value v = config::parse_yaml(
      "pretrained_model_name_or_path: " + dir.string() + "\nconfig_overrides:\n  rope_theta: 1234.0\n", origin);
  config::ParseContext ctx("recipe.yaml");
  config::Section s(&v, "model", ctx);
  const HfCausalLMOptions o = parse_hf_causal_lm_options(s);
  EXPECT_EQ(llama_options_from_hf_config(o.config, "m/config.json").rope_theta, 1234.0);
  EXPECT_FALSE(o.config.contains("rope_parameters"));
  std::filesystem::remove_all(dir);
}

TEST(HfConfigForms, EachRotaryFamilyTakesRopeParametersIntoItsOwnKeys) {
  // GPT-NeoX: rotary_emb_base and rotary_pct.
  const json neox = {
      {"model_type", "gpt_neox"},
      {"hidden_size", 64},
      {"intermediate_size", 96},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 4},
      {"vocab_size", 101},
      {"is_decoder", false},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000.0}, {"partial_rotary_factor", 0.5}}}};
  const GPTNeoXOptions n = gpt_neox_keys().from_hf(neox, "n/config.json");
  EXPECT_EQ(n.rotary_emb_base, 1000.0);
  EXPECT_EQ(n.rotary_pct, 0.5);
  // Phi-3: partial_rotary_factor, and longrope's factors; the top-level original_max_position_embeddings decides (its
  // copy in rope_parameters is transformers 5's own).
  const json phi3 = {{"model_type", "phi3"},
                     {"hidden_size", 64},
                     {"intermediate_size", 96},
                     {"num_hidden_layers", 2},
                     {"num_attention_heads", 4},
                     {"vocab_size", 101},
                     {"pad_token_id", 0},
                     {"max_position_embeddings", 64},
                     {"original_max_position_embeddings", 16},
                     {"rope_parameters",
                      {{"rope_type", "longrope"},
                       {"rope_theta", 11000.0},
                       {"partial_rotary_factor", 0.5},
                       {"original_max_position_embeddings", 16},
                       {"short_factor", {1.0, 1.2, 1.5, 2.0}},
                       {"long_factor", {1.5, 2.0, 3.0, 4.0}}}}};
  const Phi3Options p = phi3_keys().from_hf(phi3, "p/config.json");
  EXPECT_EQ(p.rope_theta, 11000.0);
  EXPECT_EQ(p.partial_rotary_factor, 0.5);
  EXPECT_EQ(p.original_max_position_embeddings, 16);
  EXPECT_EQ(p.long_factor, (std::vector<double>{1.5, 2.0, 3.0, 4.0}));
  // Without it, Phi3Config's default (4096), in either form.
  json no_original = phi3;
  no_original.erase("original_max_position_embeddings");
  no_original["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(phi3_keys().from_hf(no_original, "p/config.json").original_max_position_embeddings, 4096);
  // Gemma 3: one object per layer type; the sliding layers' base is rope_local_base_freq.
  const json gemma3 = {{"model_type", "gemma3_text"},
                       {"hidden_size", 64},
                       {"intermediate_size", 96},
                       {"num_hidden_layers", 2},
                       {"num_attention_heads", 4},
                       {"num_key_value_heads", 2},
                       {"head_dim", 16},
                       {"vocab_size", 101},
                       {"layer_types", {"sliding_attention", "full_attention"}},
                       {"rope_parameters",
                        {{"full_attention", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 200000.0}}},
                         {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 500.0}}}}}};
  const GemmaOptions g = gemma_keys().from_hf(gemma3, "g/config.json");
  EXPECT_EQ(g.rope_theta, 200000.0);
  EXPECT_EQ(g.rope_local_base_freq, 500.0);
  EXPECT_EQ(g.rope_linear_factor, 2.0);
  // Falcon, with transformers 5's derived num_key_value_heads.
  const json falcon = {{"model_type", "falcon"},
                       {"hidden_size", 64},
                       {"num_hidden_layers", 2},
                       {"num_attention_heads", 4},
                       {"vocab_size", 101},
                       {"num_key_value_heads", 1},
                       {"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 8000.0}}}};
  const FalconOptions f = falcon_keys().from_hf(falcon, "f/config.json");
  EXPECT_EQ(f.rope_theta, 8000.0);
  EXPECT_EQ(f.rope_linear_factor, 2.0);
  // DBRX: attn_config.rope_theta.
  const json dbrx = {
      {"model_type", "dbrx"},
      {"d_model", 64},
      {"n_heads", 4},
      {"n_layers", 2},
      {"vocab_size", 101},
      {"num_key_value_heads", 2},
      {"attn_config", {{"kv_n_heads", 2}, {"dtype", nullptr}, {"model_type", ""}}},
      {"ffn_config", {{"ffn_hidden_size", 48}, {"moe_num_experts", 4}, {"moe_top_k", 2}, {"hidden_size", 64}}},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 12000.0}}}};
  EXPECT_EQ(mpt_options_from_dbrx_config(dbrx, "d/config.json").attn.rope_theta, 12000.0);
  // Qwen3-MoE: transformers 5 writes the expert count under its attribute map's name.
  const LlamaOptions q = llama_options_from_hf_config(with(kLlama, {{"model_type", "qwen3_moe"},
                                                                    {"num_local_experts", 6},
                                                                    {"num_experts_per_tok", 2},
                                                                    {"moe_intermediate_size", 32}}),
                                                      "q/c.json");
  EXPECT_EQ(q.num_experts, 6);
}

TEST(HfConfigForms, WhatBothFormsGiveDifferentlyOrTesseraDoesNotComputeIsRefusedByName) {
  auto llama_error = [](const json& changes) {
    return error_of([&] { (void)llama_options_from_hf_config(with(kLlama, changes), "m/config.json"); });
  };
  // The base in both forms, differently: transformers 5 reads one, transformers 4 the other.
  EXPECT_NE(
      llama_error({{"rope_theta", 10000.0}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}})
          .find("[hf] m/config.json: rope_parameters.rope_theta: 500000.0 disagrees with rope_theta (10000.0)"),
      std::string::npos);
  // The same value in both forms reads.
  EXPECT_EQ(
      llama_error({{"rope_theta", 500000}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}}),
      "(no error)");
  // A partial rotary factor in a family that rotates whole heads; a scaling Tessera's Llama does not compute.
  EXPECT_NE(llama_error({{"rope_parameters", {{"rope_theta", 1e4}, {"partial_rotary_factor", 0.5}}}})
                .find("m/config.json: rope_parameters.partial_rotary_factor: 0.5 is not read by Tessera's llama"),
            std::string::npos);
  const std::string yarn = llama_error({{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}}});
  EXPECT_NE(yarn.find("rope_scaling.rope_type: expected default, linear or llama3, got yarn"), std::string::npos)
      << yarn;
  EXPECT_NE(yarn.find("rope_parameters"), std::string::npos) << yarn;
  // Malformed: named, not a crash.
  EXPECT_NE(llama_error({{"rope_parameters", "fast"}})
                .find("m/config.json: rope_parameters: expected an object, got \"fast\""),
            std::string::npos);
  EXPECT_NE(llama_error({{"rope_parameters", {{"rope_type", 5}}}}).find("rope_scaling.rope_type: "), std::string::npos);
  // Parameters per layer type in a family with one rotary table.
  EXPECT_NE(
      llama_error({{"rope_parameters", {{"full_attention", {{"rope_theta", 1e4}}}}}})
          .find("rope_parameters: {\"full_attention\":{\"rope_theta\":10000.0}}: rotary parameters per layer type"),
      std::string::npos);
  // Gemma 3's sliding layers rotate without scaling.
  const std::string gemma3 = error_of([] {
    (void)gemma_keys().from_hf(
        {{"model_type", "gemma3_text"},
         {"rope_parameters", {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}}}},
        "g/config.json");
  });
  EXPECT_NE(gemma3.find("g/config.json: rope_parameters.sliding_attention: "), std::string::npos) << gemma3;
  // A DBRX base in both forms, differently.
  EXPECT_NE(error_of([] {
              (void)mpt_options_from_dbrx_config({{"model_type", "dbrx"},
                                                  {"attn_config", {{"rope_theta", 500000}}},
                                                  {"rope_parameters", {{"rope_theta", 10000}}}},
                                                 "d/config.json");
            }).find("d/config.json: rope_parameters.rope_theta: 10000 disagrees with attn_config.rope_theta (500000)"),
            std::string::npos);
}

TEST(HfConfigForms, AKeyTheFamilyDoesNotReadIsRefusedByNameUnlessItChangesNothing) {
  auto llama_error = [](const json& changes) {
    return error_of([&] { (void)llama_options_from_hf_config(with(kLlama, changes), "m/config.json"); });
  };
  // Quantised weights, a key no family reads, an alias transformers maps onto a field, a window the family lacks.
  EXPECT_NE(
      llama_error({{"quantization_config", {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}}})
          .find("[hf] m/config.json: quantization_config: {\"load_in_4bit\":true,\"quant_method\":\"bitsandbytes\"} "
                "is not read by Tessera's llama, and it can change the model"),
      std::string::npos);
  EXPECT_NE(llama_error({{"attention_sink_size", 4}})
                .find("m/config.json: attention_sink_size: 4 is not read by Tessera's llama"),
            std::string::npos);
  EXPECT_NE(llama_error({{"use_sliding_window", true}}).find("m/config.json: use_sliding_window: true is not read"),
            std::string::npos);
  EXPECT_NE(
      llama_error({{"layer_types", {"sliding_attention", "full_attention"}}}).find("m/config.json: layer_types: "),
      std::string::npos);
  EXPECT_NE(llama_error({{"pruned_heads", {{"0", {1}}}}}).find("m/config.json: pruned_heads: "), std::string::npos);
  EXPECT_NE(error_of([] {
              (void)mpt_options_from_gpt2_config({{"model_type", "gpt2"}, {"hidden_size", 32}}, "g/config.json");
            }).find("g/config.json: hidden_size: 32 is not read by Tessera's gpt2"),
            std::string::npos);
  // Nested: DBRX's and MPT's attn_config.
  EXPECT_NE(error_of([] {
              (void)mpt_options_from_dbrx_config({{"model_type", "dbrx"}, {"attn_config", {{"alibi", true}}}},
                                                 "d/config.json");
            }).find("d/config.json: attn_config.alibi: true is not read by Tessera's dbrx"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              (void)mpt_options_from_hf_config({{"model_type", "mpt"}, {"attn_config", {{"prefix_lm", true}}}},
                                               "t/config.json");
            }).find("t/config.json: attn_config.prefix_lm: true is not read by Tessera's mpt"),
            std::string::npos);
  // LLM Foundry's query temperature tuning: off at attn_scale 0 (what its MPTConfig writes), refused on.
  auto mpt_error = [](const json& tuning) {
    return error_of([&] {
      (void)mpt_options_from_hf_config(
          {{"model_type", "mpt"}, {"attn_config", {{"attn_temperature_tuning", tuning}, {"kv_dim", nullptr}}}},
          "t/config.json");
    });
  };
  EXPECT_EQ(mpt_error({{"floor_scale", 8192}, {"attn_scale", 0.0}}), "(no error)");
  EXPECT_NE(mpt_error({{"floor_scale", 8192}, {"attn_scale", 0.1}})
                .find("t/config.json: attn_config.attn_temperature_tuning: "),
            std::string::npos);
  // What changes no causal LM's logits reads: bookkeeping, outputs, other heads, generation, init, nulls, and the
  // keys above at their default.
  EXPECT_EQ(llama_error({{"architectures", {"LlamaForCausalLM"}},
                         {"transformers_version", "5.25.0"},
                         {"dtype", "float32"},
                         {"torch_dtype", "float32"},
                         {"use_cache", true},
                         {"pretraining_tp", 1},
                         {"id2label", {{"0", "LABEL_0"}}},
                         {"temperature", 0.7},
                         {"initializer_range", 0.02},
                         {"quantization_config", nullptr},
                         {"use_sliding_window", false},
                         {"layer_types", {"full_attention", "full_attention"}},
                         {"pruned_heads", json::object()},
                         {"is_encoder_decoder", false}}),
            "(no error)");
}

TEST(HfConfigForms, TheDefaultConfigsTransformers4And5WriteAreReadAsTheSameModel) {
  const json v4 = read_fixture("transformers-4.57.6.json");
  const json v5 = read_fixture("transformers-5.25.0.json");
  ASSERT_EQ(v4.size(), 16U);
  for (const auto& [type, config] : v4.items()) {
    SCOPED_TRACE(type);
    ASSERT_TRUE(v5.contains(type));
    std::shared_ptr<CausalLM> a, b;
    ASSERT_EQ(error_of([&] { a = build_from_hf_config(config, type + "/4/config.json", "meta"); }), "(no error)");
    ASSERT_EQ(error_of([&] { b = build_from_hf_config(v5[type], type + "/5/config.json", "meta"); }), "(no error)");
    EXPECT_EQ(a->describe(), b->describe());
    auto exported = [](const CausalLM& m) {  // the options it holds, as config.json (or why it has none)
      std::string out;
      const std::string error = error_of([&] { out = m.hf_config(at::kFloat).dump(); });
      return error == "(no error)" ? out : error;
    };
    EXPECT_EQ(exported(*a), exported(*b));
  }
}

// Each family's config.json is written from the same key table its reader takes (family_keys.h): what Tessera
// writes for every model_type (in its own form: MPT writes a GPT-2 or DBRX folder as mpt) reads back, unrefused, as
// options that write the same config.json again.
TEST(HfConfigForms, TheConfigTesseraWritesReadsBackAsTheSameOptions) {
  const json v4 = read_fixture("transformers-4.57.6.json");
  for (const auto& [type, config] : v4.items()) {
    SCOPED_TRACE(type);
    const std::shared_ptr<CausalLM> a = build_from_hf_config(config, type + "/config.json", "meta");
    nlohmann::ordered_json written;
    if (error_of([&] { written = a->hf_config(at::kBFloat16); }) != "(no error)") continue;  // no transformers form
    std::shared_ptr<CausalLM> b;
    ASSERT_EQ(error_of([&] { b = build_from_hf_config(json::parse(written.dump()), "written/config.json", "meta"); }),
              "(no error)");
    EXPECT_EQ(b->describe(), a->describe());
    EXPECT_EQ(b->hf_config(at::kBFloat16).dump(2), written.dump(2));
  }
}

// Exports in transformers 5's form (checkpoint::save_hf_model's default): each family's config.json as Tessera
// writes it (transformers 4's form), through hf_config_v5(), carries its rotary settings only in rope_parameters
// (what transformers 5 itself writes for that family's default config), and reads back as the same options.
TEST(HfConfigForms, ConfigsWrittenInTransformers5FormReadBackAsTheSameOptions) {
  const json v4 = read_fixture("transformers-4.57.6.json");
  const json v5 = read_fixture("transformers-5.25.0.json");
  int rotary = 0;
  for (const auto& [type, config] : v4.items()) {
    SCOPED_TRACE(type);
    const std::shared_ptr<CausalLM> a = build_from_hf_config(config, type + "/config.json", "meta");
    nlohmann::ordered_json written;
    if (error_of([&] { written = a->hf_config(at::kBFloat16); }) != "(no error)") continue;  // no transformers form
    const nlohmann::ordered_json five = hf_config_v5(written);
    EXPECT_EQ(five.contains("rope_parameters"), v5[type].contains("rope_parameters"));
    for (const char* key : {"rope_theta", "rope_scaling", "rotary_emb_base", "rotary_pct", "rope_local_base_freq",
                            "partial_rotary_factor", "torch_dtype"}) {
      EXPECT_FALSE(five.contains(key)) << key;
    }
    EXPECT_EQ(five.value("dtype", ""), "bfloat16");
    if (five.contains("rope_parameters")) {
      ++rotary;
      // The same rotary bases and kinds as transformers 5's own default config (per layer type for Gemma 3).
      const json ours = json::parse(five["rope_parameters"].dump()), theirs = v5[type]["rope_parameters"];
      const bool nested = theirs.contains("full_attention");
      const json layers = nested ? theirs : json{{"", theirs}};
      for (const auto& [layer, p] : layers.items()) {
        const json& mine = nested ? ours.at(layer) : ours;
        EXPECT_EQ(mine.at("rope_theta"), p.at("rope_theta")) << layer;
        EXPECT_EQ(mine.at("rope_type"), p.at("rope_type")) << layer;
      }
    }
    std::shared_ptr<CausalLM> b;
    ASSERT_EQ(error_of([&] { b = build_from_hf_config(json::parse(five.dump()), "five/config.json", "meta"); }),
              "(no error)");
    EXPECT_EQ(b->hf_config(at::kBFloat16).dump(2), written.dump(2));
    // transformers 4's form for the same model is what the family writes, but for DBRX, which adds rope_parameters
    // (transformers 5 reads its base there only).
    const nlohmann::ordered_json four = hf_config_for(written, 4);
    EXPECT_EQ(four.contains("rope_parameters"), type == "dbrx");
    EXPECT_EQ(build_from_hf_config(json::parse(four.dump()), "four/config.json", "meta")->hf_config(at::kBFloat16),
              written);
  }
  EXPECT_GE(rotary, 12);
}

}  // namespace hf_config_forms_test
}  // namespace tessera::models
