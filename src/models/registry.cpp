// The model families Tessera ships, by recipe name (`model.name`) and by config.json model_type.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessera/models/causal_lm.h"
#include "tessera/models/falcon.h"
#include "tessera/models/gemma.h"
#include "tessera/models/gpt_neo.h"
#include "tessera/models/gpt_neox.h"
#include "tessera/models/hf_causal_lm.h"
#include "tessera/models/llama.h"
#include "tessera/models/mpt.h"
#include "tessera/models/opt.h"
#include "tessera/models/phi3.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

// A family whose recipe section `parse` reads into its Options (which have max_position_embeddings and init_device)
// and whose model `build` makes from them and a seed.
template <class Options, class Model>
void add_family(ModelRegistry& r, const std::string& name, std::function<Options(config::Section&)> parse,
                Model (*build)(const Options&, uint64_t)) {
  r.add(
      name,
      [name, parse](config::Section& s) {
        const Options o = parse(s);
        s.finish();
        return ModelOptions{name, o, o.max_position_embeddings, o.init_device, {}};
      },
      [build](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
        Options o = std::any_cast<const Options&>(m.options);
        o.init_device = device;
        return build(o, seed).ptr();
      });
}

}  // namespace

ModelRegistry& model_registry() {
  static ModelRegistry* registry = [] {
    auto* r = new ModelRegistry("model");
    r->add(
        "mpt_causal_lm",
        [](config::Section& s) {
          const MPTOptions o = parse_mpt_options(s);
          return ModelOptions{"mpt_causal_lm", o, o.max_seq_len, o.init_device, {}};
        },
        [](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
          MPTOptions o = std::any_cast<const MPTOptions&>(m.options);
          o.init_device = device;
          return build_mpt(o, seed).ptr();
        });
    // DBRX: transformers' DbrxConfig keys (d_model, attn_config, ffn_config, ...), built as the MPT computing it.
    r->add(
        "dbrx",
        [](config::Section& s) {
          s.get_choice("model_type", "dbrx", {"dbrx"});
          nlohmann::json c = {{"model_type", "dbrx"}};
          int64_t expert_parallel = 1;
          for (const char* key : {"d_model", "n_heads", "n_layers", "max_seq_len", "vocab_size"}) {
            if (s.has(key)) c[key] = s.get_int(key, 0);
          }
          for (const char* key : {"resid_pdrop", "emb_pdrop", "initializer_range"}) {
            if (s.has(key)) c[key] = s.get_double(key, 0.0);
          }
          c["output_router_logits"] = s.get_bool("output_router_logits", false);
          c["tie_word_embeddings"] = s.get_bool("tie_word_embeddings", false);
          const std::string device = s.get_choice("init_device", "cpu", {"cpu", "meta", "cuda"});
          auto optional = [](config::Section& sec, const char* key, nlohmann::json& into) {
            if (!sec.has(key)) return;
            const auto v = sec.get_optional_double(key);
            into[key] = v ? nlohmann::json(*v) : nlohmann::json();
          };
          if (auto a = s.section("attn_config"); a.present()) {
            nlohmann::json j = nlohmann::json::object();
            if (a.has("kv_n_heads")) j["kv_n_heads"] = a.get_int("kv_n_heads", 1);
            for (const char* key : {"rope_theta", "attn_pdrop"}) {
              if (a.has(key)) j[key] = a.get_double(key, 0.0);
            }
            optional(a, "clip_qkv", j);
            a.finish();
            c["attn_config"] = j;
          }
          if (auto f = s.section("ffn_config"); f.present()) {
            nlohmann::json j = nlohmann::json::object();
            for (const char* key : {"ffn_hidden_size", "moe_num_experts", "moe_top_k"}) {
              if (f.has(key)) j[key] = f.get_int(key, 0);
            }
            if (f.has("moe_loss_weight")) j["moe_loss_weight"] = f.get_double("moe_loss_weight", 0.0);
            // LLM Foundry's expert-parallel degree (DBRX was trained with it): not a DbrxConfig key, applied below.
            expert_parallel = f.get_int("moe_world_size", 1);
            optional(f, "moe_jitter_eps", j);
            optional(f, "moe_normalize_expert_weights", j);
            if (auto act = f.section("ffn_act_fn"); act.present()) {
              j["ffn_act_fn"] = {{"name", act.get_string("name", "silu")}};
              act.finish();
            }
            f.finish();
            c["ffn_config"] = j;
          }
          s.finish();
          MPTOptions o;
          try {
            o = mpt_options_from_dbrx_config(c, s.key_path(""));
          } catch (const Error& e) {
            s.fail("d_model", e.message());
          }
          o.init_device = device;
          if (expert_parallel != 1) {
            const int64_t experts = o.ffn.moe->num_experts;
            if (expert_parallel < 1 || experts % expert_parallel != 0) {
              s.fail("ffn_config",
                     fmt::format("moe_world_size {} must divide moe_num_experts ({})", expert_parallel, experts));
            }
            o.ffn.moe->world_size = expert_parallel;
          }
          return ModelOptions{"dbrx", o, o.max_seq_len, o.init_device, {}};
        },
        [](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
          MPTOptions o = std::any_cast<const MPTOptions&>(m.options);
          o.init_device = device;
          return build_mpt(o, seed).ptr();
        });
    add_family<LlamaOptions>(*r, "llama", &parse_llama_options, &build_llama);
    add_family<FalconOptions>(*r, "falcon", &parse_falcon_options, &build_falcon);
    for (const char* type : {"gemma2", "gemma3_text"}) {
      add_family<GemmaOptions>(
          *r, type, [t = std::string(type)](config::Section& s) { return parse_gemma_options(s, t); }, &build_gemma);
    }
    add_family<GPTNeoOptions>(*r, "gpt_neo", &parse_gpt_neo_options, &build_gpt_neo);
    add_family<GPTNeoXOptions>(*r, "gpt_neox", &parse_gpt_neox_options, &build_gpt_neox);
    add_family<OPTOptions>(*r, "opt", &parse_opt_options, &build_opt);
    add_family<Phi3Options>(*r, "phi3", &parse_phi3_options, &build_phi3);
    r->add(
        "hf_causal_lm",
        [](config::Section& s) {
          const HfCausalLMOptions o = parse_hf_causal_lm_options(s);
          const std::string where = o.folder + "/config.json";
          int64_t max_seq_len = 0;
          try {
            max_seq_len = build_from_hf_config(o.config, where, "meta")->max_seq_len();
          } catch (const Error& e) {
            s.fail("pretrained_model_name_or_path", e.message());
          }
          ModelOptions m{"hf_causal_lm", o, max_seq_len, o.init_device, {}};
          if (o.pretrained) m.pretrained_weights = o.folder;
          return m;
        },
        [](const ModelOptions& m, const std::string& device, uint64_t seed) -> std::shared_ptr<CausalLM> {
          const auto& o = std::any_cast<const HfCausalLMOptions&>(m.options);
          return build_from_hf_config(o.config, o.folder + "/config.json", device, seed);
        });
    r->add_foundry_names({"hf_t5", "hf_prefix_lm"});
    return r;
  }();
  return *registry;
}

void HfModelTypeRegistry::add(const std::string& model_type, HfConfigBuilder build) {
  builders_[model_type] = std::move(build);
}

bool HfModelTypeRegistry::contains(const std::string& model_type) const {
  return builders_.count(model_type) > 0;
}

std::vector<std::string> HfModelTypeRegistry::model_types() const {
  std::vector<std::string> out;
  for (const auto& [type, build] : builders_) out.push_back(type);
  return out;
}

std::shared_ptr<CausalLM> HfModelTypeRegistry::build(const nlohmann::json& config, const std::string& where,
                                                     const std::string& device, std::optional<uint64_t> seed) const {
  const std::string type = config.is_object() ? config.value("model_type", "") : "";
  const auto it = builders_.find(type);
  if (it == builders_.end()) {
    throw Error(
        "hf", fmt::format("{}: model_type is \"{}\"; Tessera reads: {}", where, type, fmt::join(model_types(), ", ")));
  }
  return it->second(config, where, device, seed);
}

namespace {

// The builder of a family whose options `read` takes from a config.json: `Model` allocated only, or `build` from a
// seed.
template <class Options, class Model>
HfConfigBuilder hf_builder(Options (*read)(const nlohmann::json&, const std::string&),
                           Model (*build)(const Options&, uint64_t)) {
  return [read, build](const nlohmann::json& config, const std::string& where, const std::string& device,
                       std::optional<uint64_t> seed) -> std::shared_ptr<CausalLM> {
    Options o = read(config, where);
    o.init_device = device;
    return seed ? build(o, *seed).ptr() : Model(o).ptr();
  };
}

}  // namespace

HfModelTypeRegistry& hf_model_type_registry() {
  static HfModelTypeRegistry* registry = [] {
    auto* r = new HfModelTypeRegistry;
    r->add("mpt", hf_builder(&mpt_options_from_hf_config, &build_mpt));
    r->add("gpt2", hf_builder(&mpt_options_from_gpt2_config, &build_mpt));  // an MPT with learned positions
    r->add("dbrx", hf_builder(&mpt_options_from_dbrx_config, &build_mpt));  // an MPT with DBRX's names
    for (const char* type : {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe"}) {
      r->add(type, hf_builder(&llama_options_from_hf_config, &build_llama));
    }
    r->add("falcon", hf_builder(&falcon_options_from_hf_config, &build_falcon));
    for (const char* type : {"gemma2", "gemma3_text"}) {
      r->add(type, hf_builder(&gemma_options_from_hf_config, &build_gemma));
    }
    r->add("gpt_neo", hf_builder(&gpt_neo_options_from_hf_config, &build_gpt_neo));
    r->add("gpt_neox", hf_builder(&gpt_neox_options_from_hf_config, &build_gpt_neox));
    r->add("opt", hf_builder(&opt_options_from_hf_config, &build_opt));
    r->add("phi3", hf_builder(&phi3_options_from_hf_config, &build_phi3));
    return r;
  }();
  return *registry;
}

std::shared_ptr<CausalLM> build_from_hf_config(const nlohmann::json& config, const std::string& where,
                                               const std::string& device, std::optional<uint64_t> seed) {
  return hf_model_type_registry().build(config, where, device, seed);
}

}  // namespace tessera::models
