// A family's config keys, declared once. Each row of a FamilyKeys table names a key (a recipe's `model:` key and
// config.json's are the same: the HF-native families take transformers' config keys), the Options field it fills
// (its default is the field's value when the row is read: the member initialiser, or what the model_type's defaults
// set), the model_types that have the key, and a check with the message for a value the family cannot compute. From
// the one table come the recipe parser (read()), the keys a config.json may carry and the refusal of any other
// (from_hf()), and the config.json writer (hf_config()). Checks that relate several keys stay in the family's parser,
// after read(). Included by the families' sources only.
#pragma once

#include <ATen/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/config/reader.h"
#include "tessera/config/value.h"
#include "tessera/models/blocks/attention.h"
#include "tessera/models/blocks/layers.h"
#include "tessera/models/causal_lm.h"
#include "tessera/models/family_support.h"
#include "tessera/util/error.h"

namespace tessera::models {

// A per-layer list of attention kinds (config key `key`): one entry per layer, each sliding_attention or
// full_attention; refused naming the key otherwise.
inline void check_layer_types(config::Section& s, const std::vector<std::string>& types, int64_t layers,
                              const std::string& key = "layer_types") {
  s.check(static_cast<int64_t>(types.size()) == layers, key,
          fmt::format("has {} entries for {} layers", types.size(), layers));
  for (const std::string& t : types) {
    s.check(t == "sliding_attention" || t == "full_attention", key,
            fmt::format("each entry is sliding_attention or full_attention, got \"{}\"", t));
  }
}

// A check of one value: the message for a value it refuses, empty when the value is fine.
template <class T>
using KeyCheck = std::function<std::string(const T&)>;

inline KeyCheck<int64_t> positive() {
  return [](const int64_t& v) { return v > 0 ? "" : std::string("must be positive"); };
}
inline KeyCheck<double> positive_real() {
  return [](const double& v) { return v > 0 ? "" : std::string("must be positive"); };
}
// A dropout probability.
inline KeyCheck<double> probability() {
  return [](const double& v) { return v >= 0 && v < 1 ? "" : std::string("must be in [0, 1)"); };
}
// A positive value or null (none).
template <class T>
KeyCheck<std::optional<T>> positive_or_none() {
  return
      [](const std::optional<T>& v) { return !v || *v > 0 ? "" : std::string("must be positive (or null for none)"); };
}
// One of transformers' ACT2FN names that Tessera computes (blocks/layers.h).
inline KeyCheck<std::string> hf_activation_check() {
  return [](const std::string& v) {
    return is_hf_activation(v) ? ""
                               : fmt::format("\"{}\" is not an activation Tessera computes ({})", v,
                                             fmt::join(hf_activation_names(), ", "));
  };
}

// `v` for a config.json key that transformers' config class types as an integer (its strict dataclasses of
// transformers 5 refuse 4.0): an integer where it is whole, else the number.
inline nlohmann::ordered_json whole_number_json(double v) {
  return v == std::floor(v) && std::abs(v) < 9.0e15 ? nlohmann::ordered_json(static_cast<int64_t>(v))
                                                    : nlohmann::ordered_json(v);
}

template <class O>
class FamilyKeys {
 public:
  using Types = std::vector<std::string>;
  using Reader = std::function<void(config::Section&, O&)>;
  using Writer = std::function<nlohmann::ordered_json(const O&)>;
  using Prepare = std::function<void(const nlohmann::json&, nlohmann::json&)>;

  // `model_types`: the table's config.json model_types, the first the default of a recipe's `model_type` key.
  // `architecture(type)`: the transformers class config.json names for it.
  FamilyKeys(Types model_types, std::function<std::string(const std::string&)> architecture)
      : types_(std::move(model_types)), architecture_(std::move(architecture)) {}

  // The model_type's defaults where they differ from the Options' member initialisers (MixtralConfig's rope_theta),
  // applied before any row is read.
  FamilyKeys& defaults(std::function<void(const std::string&, O&)> set) {
    defaults_ = std::move(set);
    return *this;
  }

  // Key `key` read into `field` (int64_t, double, bool, std::string, std::optional<int64_t | double> where null
  // means none, std::vector<std::string | int64_t>), checked by `check`, for the model_types `only` (empty: all).
  template <class T>
  FamilyKeys& field(std::string key, T O::*f, KeyCheck<T> check = {}, Types only = {}) {
    if constexpr (std::is_same_v<T, std::optional<int64_t>> || std::is_same_v<T, std::optional<double>>) {
      nullable_.insert(key);  // config.json's null is "none" here, not the key left out
    }
    return row(
        key, std::move(only),
        [key, f, check](config::Section& s, O& o) {
          o.*f = get(s, key, o.*f);
          if (check) {
            if (const std::string why = check(o.*f); !why.empty()) s.fail(key, why);
          }
        },
        [f](const O& o) { return json(o.*f); });
  }
  // bos_token_id, eos_token_id and pad_token_id (std::optional<int64_t> fields of the same names; null: none).
  FamilyKeys& token_ids() {
    field("bos_token_id", &O::bos_token_id);
    field("eos_token_id", &O::eos_token_id);
    return field("pad_token_id", &O::pad_token_id);
  }
  // rope_scaling of the default or linear kind (read_linear_rope_scaling(), `family` naming the model in its
  // refusal) into `field`, 1 for none; written as null or {rope_type: linear, factor}.
  FamilyKeys& linear_rope_scaling(double O::*f, std::string family) {
    return custom(
        "rope_scaling", [f, family](config::Section& s, O& o) { o.*f = read_linear_rope_scaling(s, family); },
        [f](const O& o) {
          if (o.*f == 1.0) return nlohmann::ordered_json(nullptr);
          return nlohmann::ordered_json{{"rope_type", "linear"}, {"factor", o.*f}};
        });
  }
  // rope_scaling of the default or yarn kind into `f` (none, or YaRN's factor, original_max_position_embeddings
  // (max_position_embeddings when absent), beta_fast (32), beta_slow (1), mscale, mscale_all_dim, attention_factor
  // and truncate (true)); other kinds are refused at rope_type. Absent: `f` as the options have it (a config class
  // whose default is YaRN keeps it); null or default: none. Written as null or the YaRN object.
  FamilyKeys& yarn_rope_scaling(std::optional<YarnRope> O::*f) {
    nullable("rope_scaling");
    return custom(
        "rope_scaling",
        [f](config::Section& s, O& o) {
          const std::vector<std::string> present = s.keys();
          if (std::find(present.begin(), present.end(), "rope_scaling") == present.end()) return;
          (void)s.raw("rope_scaling");
          o.*f = std::nullopt;
          if (!s.has("rope_scaling")) return;  // null
          config::Section r = s.section("rope_scaling");
          const std::string type = r.get_optional_string("rope_type").value_or(r.get_string("type", "default"));
          r.check(type == "default" || type == "yarn", "rope_type", "expected default or yarn, got " + type);
          if (type == "yarn") {
            YarnRope y;
            y.factor = r.require_double("factor");
            r.check(y.factor > 0, "factor", "must be positive");
            y.original_max_position_embeddings = r.get_nullable_int("original_max_position_embeddings", std::nullopt)
                                                     .value_or(o.max_position_embeddings);
            y.beta_fast = r.get_nullable_double("beta_fast", std::nullopt).value_or(32.0);
            y.beta_slow = r.get_nullable_double("beta_slow", std::nullopt).value_or(1.0);
            y.mscale = r.get_nullable_double("mscale", std::nullopt);
            y.mscale_all_dim = r.get_nullable_double("mscale_all_dim", std::nullopt);
            y.attention_factor = r.get_nullable_double("attention_factor", std::nullopt);
            y.truncate = r.get_bool("truncate", true);
            o.*f = y;
          } else {
            (void)r.get_optional_double("factor");  // transformers reads no other key of a default rope_scaling
          }
          r.finish();
        },
        [f](const O& o) {
          if (!(o.*f)) return nlohmann::ordered_json(nullptr);
          const YarnRope& y = *(o.*f);
          nlohmann::ordered_json r = {{"rope_type", "yarn"},
                                      {"factor", y.factor},
                                      {"original_max_position_embeddings", y.original_max_position_embeddings},
                                      {"beta_fast", y.beta_fast},
                                      {"beta_slow", y.beta_slow},
                                      {"truncate", y.truncate}};
          if (y.mscale) r["mscale"] = *y.mscale;
          if (y.mscale_all_dim) r["mscale_all_dim"] = *y.mscale_all_dim;
          if (y.attention_factor) r["attention_factor"] = *y.attention_factor;
          return r;
        });
  }
  // partial_rotary_factor into `f`: in (0, 1], and int(head_dim(o) x it) rotary features, even and positive.
  FamilyKeys& partial_rotary_factor(double O::*f, std::function<int64_t(const O&)> head_dim) {
    return custom(
        "partial_rotary_factor",
        [f, head_dim](config::Section& s, O& o) {
          o.*f = s.get_double("partial_rotary_factor", o.*f);
          const int64_t hd = head_dim(o), rotary = static_cast<int64_t>(static_cast<double>(hd) * (o.*f));
          s.check(o.*f > 0 && o.*f <= 1 && rotary > 0 && rotary % 2 == 0, "partial_rotary_factor",
                  fmt::format("must be in (0, 1] and give an even number of rotary dimensions (int(head_dim {} x {}) "
                              "= {})",
                              hd, o.*f, rotary));
        },
        [f](const O& o) { return nlohmann::ordered_json(o.*f); });
  }
  // Key `key` read into `field`, `fallback(o)` of the rows before it when absent or null (num_key_value_heads:
  // num_attention_heads); written as resolved.
  FamilyKeys& resolved(std::string key, int64_t O::*f, std::function<int64_t(const O&)> fallback,
                       KeyCheck<int64_t> check = {}, Types only = {}) {
    return row(
        key, std::move(only),
        [key, f, fallback, check](config::Section& s, O& o) {
          o.*f = s.get_optional_int(key).value_or(fallback(o));
          if (check) {
            if (const std::string why = check(o.*f); !why.empty()) s.fail(key, why);
          }
        },
        [f](const O& o) { return nlohmann::ordered_json(o.*f); });
  }
  // A number transformers' config class types as an integer (its strict dataclasses of transformers 5 refuse 16.0)
  // that the family holds as a double: read as any number, written as an integer when whole (Gemma's
  // query_pre_attn_scalar).
  FamilyKeys& whole_number(std::string key, double O::*f, KeyCheck<double> check = {}, Types only = {}) {
    return row(
        key, std::move(only),
        [key, f, check](config::Section& s, O& o) {
          o.*f = s.get_double(key, o.*f);
          if (check) {
            if (const std::string why = check(o.*f); !why.empty()) s.fail(key, why);
          }
        },
        [f](const O& o) { return whole_number_json(o.*f); });
  }
  // A key of which the family computes one value, `value`; any other is refused ("<value>: <why>"). Written as
  // `value`.
  template <class T>
  FamilyKeys& fixed(std::string key, T value, std::string why, Types only = {}) {
    return row(
        key, std::move(only),
        [key, value, why](config::Section& s, O&) {
          const T got = get(s, key, value);
          if (got != value) s.fail(key, fmt::format("{}: {}", json(got).dump(), why));
        },
        [value](const O&) { return json(value); });
  }
  // A key with its own reader and writer (a nested section, a derived field).
  FamilyKeys& custom(std::string key, Reader read, Writer write, Types only = {}) {
    return row(std::move(key), std::move(only), std::move(read), std::move(write));
  }
  // Checks of keys read by the rows before them, run in table order. `key` (an int64 field) must divide `of`'s value:
  // "must divide <of> (<value>)", named at `key`.
  FamilyKeys& divides(std::string key, int64_t O::*f, std::string of, int64_t O::*g, Types only = {}) {
    return row(
        key, std::move(only),
        [f, of, g, k = key](config::Section& s, O& o) {
          s.check(o.*f > 0 && o.*g % o.*f == 0, k, fmt::format("must divide {} ({})", of, o.*g));
        },
        nullptr);
  }
  // pad_token_id, when set, is a token id below vocab_size (the embedding's padding row).
  FamilyKeys& pad_token_below_vocab() {
    return row(
        "pad_token_id", {},
        [](config::Section& s, O& o) {
          if (o.pad_token_id) {
            s.check(*o.pad_token_id >= 0 && *o.pad_token_id < o.vocab_size, "pad_token_id",
                    fmt::format("must be a token id below vocab_size ({})", o.vocab_size));
          }
        },
        nullptr);
  }
  // A key the family writes into config.json for transformers' sake and reads itself from config.json only
  // (from_hf()'s `prepare`), not a recipe key (Qwen2's use_sliding_window).
  FamilyKeys& written(std::string key, Writer write, Types only = {}) {
    return row(std::move(key), std::move(only), nullptr, std::move(write));
  }

  // Checks (and settings derived) over the options once every row is read, failing at the key they name (Falcon's
  // head_dim parity, Gemma 2's sliding layers' rotary base).
  FamilyKeys& finally(std::function<void(config::Section&, O&)> finish) {
    finish_ = std::move(finish);
    return *this;
  }
  // config.json keys from_hf() accepts besides the table's (keys the transformers class does not read, or that the
  // family reads otherwise), and `prepare(raw, cfg)`, which may adjust the keys first (an alias, a default that
  // differs from a recipe's).
  FamilyKeys& hf_accepts(std::set<std::string> keys, Prepare prepare = nullptr) {
    accepted_ = std::move(keys);
    prepare_ = std::move(prepare);
    return *this;
  }

  // A key whose null in config.json means "none" (as an optional field's does), for a custom() row to read.
  FamilyKeys& nullable(std::string key) {
    nullable_.insert(std::move(key));
    return *this;
  }

  const Types& model_types() const { return types_; }

  // A recipe's `model:` section (or config.json's keys) -> options: read() and finally().
  O parse(config::Section& s, const std::string& type = "") const {
    O o;
    read(s, o, type);
    return o;
  }
  // config.json `raw` -> options through parse(), with the table's hf_accepts().
  O from_hf(const nlohmann::json& raw, const std::string& where) const {
    return from_hf(
        raw, where, [this](config::Section& s) { return parse(s); }, accepted_, prepare_);
  }

  // Reads `model_type` (one of the table's; `type`, when a recipe name chose it, or the first by default), the
  // model_type's defaults, each row that applies to it in order, and init_device; returns the model_type.
  std::string read(config::Section& s, O& o, const std::string& type = "") const {
    const std::string chosen = s.get_string("model_type", type.empty() ? types_.front() : type);
    if (std::find(types_.begin(), types_.end(), chosen) == types_.end())
      s.fail("model_type", fmt::format("expected {}, got \"{}\"", fmt::join(types_, ", "), chosen));
    if (!type.empty() && chosen != type)
      s.fail("model_type", fmt::format("\"{}\" is not the model name's model_type, {}", chosen, type));
    if (defaults_) defaults_(chosen, o);
    for (const Row& r : rows_) {
      if (r.read && applies(r, chosen)) r.read(s, o);
    }
    if (finish_) finish_(s, o);
    o.init_device = s.get_choice("init_device", o.init_device, {"cpu", "meta", "cuda"});
    return chosen;
  }

  // The keys of model_type `type`'s config.json that the family reads.
  std::set<std::string> names(const std::string& type) const {
    std::set<std::string> out = {"model_type"};
    for (const Row& r : rows_) {
      if (r.read && applies(r, type)) out.insert(r.key);
    }
    return out;
  }

  // config.json `raw` -> Options through `parse` (the family's recipe parser, which calls read()): its model_type
  // must be one of the table's; a key outside names() is refused (refuse_unread_hf_keys) unless `accepted` or one
  // the table writes for transformers; `prepare(raw, cfg)` may adjust the keys first (an alias, a default that
  // differs from a recipe's). Errors are Error("hf") naming `where`.
  O from_hf(const nlohmann::json& raw, const std::string& where, const std::function<O(config::Section&)>& parse,
            std::set<std::string> accepted = {}, const Prepare& prepare = nullptr) const {
    const std::string type = raw.value("model_type", "");
    if (std::find(types_.begin(), types_.end(), type) == types_.end()) {
      throw Error("hf", fmt::format("{}: model_type is \"{}\", expected {}", where, type, fmt::join(types_, ", ")));
    }
    for (const Row& r : rows_) {
      if (!r.read && applies(r, type)) accepted.insert(r.key);
    }
    nlohmann::json cfg = hf_config_keys(raw, names(type), where, accepted, nullable_);
    if (prepare) prepare(raw, cfg);
    O o;
    read_hf_config(cfg, where, [&](config::Section& s) { o = parse(s); });
    o.init_device = "cpu";
    return o;
  }

  // config.json of `o` (model_type `type`): its architecture, every row that applies in table order, use_cache and
  // the weights' dtype.
  nlohmann::ordered_json hf_config(const O& o, const std::string& type, at::ScalarType dtype) const {
    nlohmann::ordered_json j = {{"architectures", {architecture_(type)}}, {"model_type", type}};
    for (const Row& r : rows_) {
      if (r.write && applies(r, type)) j[r.key] = r.write(o);
    }
    j["use_cache"] = true;
    j["torch_dtype"] = hf_torch_dtype(dtype);
    return j;
  }

 private:
  struct Row {
    std::string key;
    Types only;
    Reader read;
    Writer write;
  };

  FamilyKeys& row(std::string key, Types only, Reader read, Writer write) {
    rows_.push_back(Row{std::move(key), std::move(only), std::move(read), std::move(write)});
    return *this;
  }
  static bool applies(const Row& r, const std::string& type) {
    return r.only.empty() || std::find(r.only.begin(), r.only.end(), type) != r.only.end();
  }

  template <class T>
  static T get(config::Section& s, const std::string& key, const T& fallback) {
    if constexpr (std::is_same_v<T, int64_t>) {
      return s.get_int(key, fallback);
    } else if constexpr (std::is_same_v<T, double>) {
      return s.get_double(key, fallback);
    } else if constexpr (std::is_same_v<T, bool>) {
      return s.get_bool(key, fallback);
    } else if constexpr (std::is_same_v<T, std::string>) {
      return s.get_string(key, fallback);
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      return s.get_nullable_int(key, fallback);
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      return s.get_nullable_double(key, fallback);
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      return s.get_strings(key, fallback);
    } else {
      static_assert(std::is_same_v<T, std::vector<int64_t>>, "a FamilyKeys field of an unsupported type");
      const config::Value* list = s.raw(key);
      if (list == nullptr) return fallback;
      T out;
      if (!list->is_sequence()) s.fail(key, "expected a list of integers, got " + list->brief());
      for (const config::Value& v : list->items()) {
        const auto i = v.as_int();
        if (!i) s.fail(key, "expected a list of integers, got " + list->brief());
        out.push_back(*i);
      }
      return out;
    }
  }
  template <class T>
  static nlohmann::ordered_json json(const T& v) {
    if constexpr (std::is_same_v<T, std::optional<int64_t>> || std::is_same_v<T, std::optional<double>>) {
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
    } else {
      return nlohmann::ordered_json(v);
    }
  }

  Types types_;
  std::function<std::string(const std::string&)> architecture_;
  std::function<void(const std::string&, O&)> defaults_;
  std::function<void(config::Section&, O&)> finish_;
  std::set<std::string> accepted_;
  std::set<std::string> nullable_;  // the keys of optional fields
  Prepare prepare_;
  std::vector<Row> rows_;
};

}  // namespace tessera::models
