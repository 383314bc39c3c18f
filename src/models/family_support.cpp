// Shared option reading and unit numbering for the model families (family_support.h).
#include "tessera/models/family_support.h"

#include "tessera/config/value.h"
#include "tessera/util/error.h"

namespace tessera::models {

nlohmann::json hf_config_keys(const nlohmann::json& raw, const std::set<std::string>& keys) {
  // A null means "none" only for these; elsewhere it is the key left out (transformers' default).
  static const std::set<std::string> kNullable = {"bos_token_id", "eos_token_id", "pad_token_id",
                                                  "final_logit_softcapping", "attn_logit_softcapping"};
  nlohmann::json cfg = nlohmann::json::object();
  for (const auto& [k, v] : raw.items()) {
    if (keys.count(k) && (!v.is_null() || kNullable.count(k))) cfg[k] = v;
  }
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (cfg.contains(id) && cfg[id].is_array()) cfg[id] = nullptr;
  }
  return cfg;
}

void read_hf_config(const nlohmann::json& cfg, const std::string& where,
                    const std::function<void(config::Section&)>& parse) {
  config::Origin origin;
  origin.file = where;
  config::Value v = config::parse_yaml(cfg.dump(), origin);
  config::ParseContext ctx(where);
  config::Section s(&v, "", ctx);
  try {
    parse(s);
    s.finish();
    ctx.throw_if_unsupported();
  } catch (const ConfigError& e) {
    throw Error("hf", e.message());
  }
}

double read_linear_rope_scaling(config::Section& s, const std::string& family) {
  if (!s.has("rope_scaling")) return 1.0;
  config::Section r = s.section("rope_scaling");
  const std::string type = r.get_optional_string("rope_type").value_or(r.get_string("type", "default"));
  r.check(type == "default" || type == "linear", "rope_type",
          "expected default or linear (Tessera's " + family + " computes no other scaling), got " + type);
  const double factor = r.get_double("factor", 1.0);
  r.check(factor > 0, "factor", "must be positive");
  r.finish();
  return type == "linear" ? factor : 1.0;
}

int64_t layer_unit(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return 0;
  return std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size())) + 1;
}

}  // namespace tessera::models
