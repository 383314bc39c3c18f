// tokenizer.json -> TokenizerImpl. Every error names the file and the JSON path of the offending key; nothing in a
// malformed document can crash the loader (all JSON access goes through the checked helpers below).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <map>

#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace tessera::data::detail {
namespace {

// A map, not ordered_json: a vocabulary of 200k keys parsed into ordered_json takes a linear search per key.
using Json = nlohmann::json;
constexpr const char* kJsonLoadComponent = "tokenizer";

std::string quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class Loader {
 public:
  explicit Loader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    throw Error(kJsonLoadComponent, fmt::format("{}: {}: {}", source_, path, message));
  }

  static std::string type_name(const Json& j) { return j.type_name(); }

  const Json* member(const Json& obj, const std::string& path, const char* key, bool required) const {
    if (!obj.is_object()) fail(path, fmt::format("expected an object, got {}", type_name(obj)));
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) fail(join(path, key), "missing");
      return nullptr;
    }
    return &*it;
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  bool get_bool(const Json& obj, const std::string& path, const char* key, bool fallback) const {
    const Json* v = member(obj, path, key, false);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_boolean()) fail(join(path, key), fmt::format("expected a boolean, got {}", type_name(*v)));
    return v->get<bool>();
  }
  std::string get_string(const Json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, fmt::format("expected a string, got {}", type_name(v)));
    return v.get<std::string>();
  }
  std::string get_type(const Json& obj, const std::string& path) const {
    return get_string(*member(obj, path, "type", true), join(path, "type"));
  }
  int32_t get_id(const Json& v, const std::string& path) const {
    if (!v.is_number_integer()) fail(path, fmt::format("expected an integer id, got {}", type_name(v)));
    const int64_t id = v.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), 1ULL << 62))
                                              : v.get<int64_t>();
    if (id < 0 || id > kMaxTokenId) fail(path, fmt::format("id {} out of range [0, {}]", id, kMaxTokenId));
    return static_cast<int32_t>(id);
  }
  // A key that must be null (or absent) because Tessera does not implement what a value would ask for.
  void require_null(const Json& obj, const std::string& path, const char* key, const char* why) const {
    const Json* v = member(obj, path, key, false);
    if (v != nullptr && !v->is_null()) fail(join(path, key), fmt::format("must be null ({})", why));
  }

  // Calls `load(item, path[i])` for each item of the array `list` (a Sequence's members).
  template <typename Load>
  void for_each_item(const Json& list, const std::string& path, Load load) const {
    if (!list.is_array()) fail(path, "expected an array");
    for (size_t i = 0; i < list.size(); ++i) load(list[i], fmt::format("{}[{}]", path, i));
  }

  // A key that must be null, absent or "" (an affix Tessera's BPE does not implement).
  void require_empty(const Json& obj, const std::string& path, const char* key) const {
    const Json* v = member(obj, path, key, false);
    if (v != nullptr && !v->is_null() && !(v->is_string() && v->get<std::string>().empty()))
      fail(join(path, key), "must be null or empty (subword prefixes and suffixes are not supported)");
  }
  // The UTF-8 of exactly one character.
  std::string get_char(const Json& v, const std::string& path) const {
    const std::string s = get_string(v, path);
    size_t n = 0;
    for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    if (n != 1) fail(path, fmt::format("expected one character, got {}", quote(s)));
    return s;
  }

  void load(std::string_view text, TokenizerImpl& t) {
    Json doc;
    try {
      doc = Json::parse(text);
    } catch (const Json::exception& e) {
      throw Error(kJsonLoadComponent, fmt::format("{}: malformed JSON: {}", source_, e.what()));
    }
    if (!doc.is_object()) fail("(root)", fmt::format("expected an object, got {}", type_name(doc)));
    require_null(doc, "", "truncation", "truncation is not supported");
    require_null(doc, "", "padding", "padding is not supported");
    load_model(*member(doc, "", "model", true), "model", t.model);
    if (const Json* a = member(doc, "", "added_tokens", false); a != nullptr && !a->is_null())
      load_added(*a, "added_tokens", t);
    if (const Json* n = member(doc, "", "normalizer", false); n != nullptr && !n->is_null())
      load_normalizer(*n, "normalizer", t);
    if (const Json* p = member(doc, "", "pre_tokenizer", false); p != nullptr && !p->is_null())
      load_pre_tokenizer(*p, "pre_tokenizer", t);
    // With a ByteLevel pre-tokenizer the BPE runs on bytes; it must come last (what follows would see byte-level
    // characters). Without one, on characters (SentencePiece style).
    for (size_t i = 0; i < t.pre_tokenizers.size(); ++i) {
      if (t.pre_tokenizers[i].kind == PreTokenizer::Kind::kByteLevel && i + 1 != t.pre_tokenizers.size())
        fail("pre_tokenizer", "a ByteLevel pre-tokenizer must come last in the Sequence");
    }
    t.model.byte_level = !t.pre_tokenizers.empty() && t.pre_tokenizers.back().kind == PreTokenizer::Kind::kByteLevel;
    if (t.model.byte_level && t.model.byte_fallback)
      fail("model.byte_fallback", "must be false with a ByteLevel pre-tokenizer (every byte has a token)");
    if (const Json* pp = member(doc, "", "post_processor", false); pp != nullptr && !pp->is_null())
      load_post_processor(*pp, "post_processor", t);
    if (const Json* d = member(doc, "", "decoder", false); d != nullptr && !d->is_null())
      load_decoder(*d, "decoder", t);
    t.byte_level_decoder = t.decoders.size() == 1 && t.decoders[0].kind == DecodeStep::Kind::kByteLevel;
  }

 private:
  void load_model(const Json& m, const std::string& path, BpeModel& model) {
    const std::string type = get_type(m, path);
    if (type != "BPE") fail(path + ".type", fmt::format("unsupported model {} (supported: BPE)", quote(type)));
    require_null(m, path, "dropout", "BPE dropout is not supported");
    require_empty(m, path, "continuing_subword_prefix");
    require_empty(m, path, "end_of_word_suffix");
    model.byte_fallback = get_bool(m, path, "byte_fallback", false);
    model.fuse_unk = get_bool(m, path, "fuse_unk", false);
    model.ignore_merges = get_bool(m, path, "ignore_merges", false);

    const std::string vpath = path + ".vocab";
    const Json& vocab = *member(m, path, "vocab", true);
    if (!vocab.is_object()) fail(vpath, fmt::format("expected an object, got {}", type_name(vocab)));
    std::map<int32_t, std::string> by_id;
    model.vocab.reserve(vocab.size());
    for (const auto& [token, value] : vocab.items()) {
      const int32_t id = get_id(value, vpath + "." + quote(token));
      if (auto [it, inserted] = by_id.emplace(id, token); !inserted)
        fail(vpath, fmt::format("tokens {} and {} both have id {}", quote(it->second), quote(token), id));
      model.vocab[token] = id;
    }
    if (const Json* unk = member(m, path, "unk_token", false); unk != nullptr && !unk->is_null()) {
      const std::string token = get_string(*unk, path + ".unk_token");
      auto it = model.vocab.find(token);
      if (it == model.vocab.end()) fail(path + ".unk_token", fmt::format("{} is not in the vocab", quote(token)));
      model.unk_id = it->second;
    }
    model.fallback_ids.fill(-1);
    for (int b = 0; b < 256; ++b) {
      if (auto it = model.vocab.find(fmt::format("<0x{:02X}>", b)); it != model.vocab.end())
        model.fallback_ids[b] = it->second;
    }
    model.byte_ids.fill(-1);
    std::string bytes;
    for (const auto& [token, id] : model.vocab) {
      if (!from_byte_level(token, bytes)) continue;
      model.byte_vocab[bytes] = id;
      if (bytes.size() == 1) model.byte_ids[static_cast<uint8_t>(bytes[0])] = id;
    }

    const std::string mpath = path + ".merges";
    const Json* merges = member(m, path, "merges", false);
    if (merges == nullptr || merges->is_null()) return;
    if (!merges->is_array()) fail(mpath, fmt::format("expected an array, got {}", type_name(*merges)));
    model.merges.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      const std::string ipath = fmt::format("{}[{}]", mpath, i);
      const Json& e = (*merges)[i];
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          fail(ipath, fmt::format("expected \"<left> <right>\" with one space, got {}", quote(s)));
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else if (e.is_array() && e.size() == 2) {
        a = get_string(e[0], ipath + "[0]");
        b = get_string(e[1], ipath + "[1]");
      } else {
        fail(ipath, fmt::format("expected a \"a b\" string or a [a, b] pair, got {}", type_name(e)));
      }
      const auto ia = model.vocab.find(a), ib = model.vocab.find(b), ic = model.vocab.find(a + b);
      if (ia == model.vocab.end()) fail(ipath, fmt::format("merge names unknown token {}", quote(a)));
      if (ib == model.vocab.end()) fail(ipath, fmt::format("merge names unknown token {}", quote(b)));
      if (ic == model.vocab.end()) fail(ipath, fmt::format("merged token {} is not in the vocab", quote(a + b)));
      model.merges.put(ia->second, ib->second, {static_cast<int32_t>(i), ic->second});
    }
  }

  void load_added(const Json& list, const std::string& path, TokenizerImpl& t) {
    if (!list.is_array()) fail(path, fmt::format("expected an array, got {}", type_name(list)));
    // Hugging Face ignores the stored ids and assigns them again (AddedVocabulary::add_tokens): the vocab's id when
    // the content is in the model vocab, else the next id after the model vocab or the largest added id. A file whose
    // ids disagree would encode differently there, so it is an error here.
    const auto model_size = static_cast<int64_t>(t.model.vocab.size());
    int64_t max_added = -1;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string ipath = fmt::format("{}[{}]", path, i);
      const Json& e = list[i];
      AddedToken a;
      a.id = get_id(*member(e, ipath, "id", true), ipath + ".id");
      a.content = get_string(*member(e, ipath, "content", true), ipath + ".content");
      if (a.content.empty()) fail(ipath + ".content", "empty added token");
      a.special = get_bool(e, ipath, "special", false);
      a.single_word = get_bool(e, ipath, "single_word", false);
      a.lstrip = get_bool(e, ipath, "lstrip", false);
      a.rstrip = get_bool(e, ipath, "rstrip", false);
      a.normalized = get_bool(e, ipath, "normalized", !a.special);
      if (t.added_ids.count(a.content))
        fail(ipath + ".content", fmt::format("duplicate added token {}", quote(a.content)));
      int64_t expected;
      if (auto it = t.model.vocab.find(a.content); it != t.model.vocab.end()) {
        expected = it->second;
      } else if (max_added < 0) {
        expected = model_size;
      } else {
        expected = (max_added >= model_size || model_size == 0) ? max_added + 1 : model_size;
      }
      if (a.id != expected) {
        fail(ipath + ".id", fmt::format("{} has id {}, but Hugging Face tokenizers would give it id {} (ids of added "
                                        "tokens must follow the model vocab)",
                                        quote(a.content), a.id, expected));
      }
      for (const AddedToken& other : t.added) {
        if (other.id == a.id)
          fail(ipath + ".id",
               fmt::format("id {} is used by added tokens {} and {}", a.id, quote(other.content), quote(a.content)));
      }
      max_added = std::max<int64_t>(max_added, a.id);
      t.added_ids[a.content] = a.id;
      t.added.push_back(std::move(a));
    }
  }

  void load_normalizer(const Json& n, const std::string& path, TokenizerImpl& t) {
    const std::string type = get_type(n, path);
    if (type == "Sequence") {
      for_each_item(*member(n, path, "normalizers", true), path + ".normalizers",
                    [&](const Json& item, const std::string& ipath) { load_normalizer(item, ipath, t); });
      return;
    }
    Normalizer norm;
    if (type == "NFC") {
      norm.kind = Normalizer::Kind::kNfc;
    } else if (type == "Prepend") {
      norm.kind = Normalizer::Kind::kPrepend;
      norm.content = get_string(*member(n, path, "prepend", true), path + ".prepend");
    } else if (type == "Replace") {
      norm.kind = Normalizer::Kind::kReplace;
      norm.pattern = load_pattern(n, path);
      norm.content = get_string(*member(n, path, "content", true), path + ".content");
      if (norm.pattern == nullptr) return;  // an empty String pattern replaces nothing
    } else {
      fail(path + ".type",
           fmt::format("unsupported normalizer {} (supported: NFC, Prepend, Replace, Sequence, null)", quote(type)));
    }
    t.normalizers.push_back(std::move(norm));
  }

  // A Split / Replace "pattern": {"Regex": ...} or {"String": ...}; null for an empty String (never matches).
  std::shared_ptr<const Regex> load_pattern(const Json& p, const std::string& path) const {
    const std::string ppath = path + ".pattern";
    const Json& pattern = *member(p, path, "pattern", true);
    const Json* regex = member(pattern, ppath, "Regex", false);
    const Json* literal = member(pattern, ppath, "String", false);
    if ((regex == nullptr) == (literal == nullptr)) fail(ppath, "expected {\"Regex\": ...} or {\"String\": ...}");
    const std::string spath = regex != nullptr ? ppath + ".Regex" : ppath + ".String";
    const std::string text = get_string(regex != nullptr ? *regex : *literal, spath);
    if (regex == nullptr && text.empty()) return nullptr;
    return std::make_shared<Regex>(text, regex == nullptr, fmt::format("{}: {}", source_, spath));
  }

  // Metaspace's prepend_scheme, with the older add_prefix_space key as Hugging Face reads it.
  PreTokenizer::Prepend load_prepend_scheme(const Json& p, const std::string& path) const {
    PreTokenizer::Prepend scheme = PreTokenizer::Prepend::kAlways;
    if (const Json* s = member(p, path, "prepend_scheme", false); s != nullptr && !s->is_null()) {
      const std::string v = get_string(*s, path + ".prepend_scheme");
      if (v == "always") {
        scheme = PreTokenizer::Prepend::kAlways;
      } else if (v == "first") {
        scheme = PreTokenizer::Prepend::kFirst;
      } else if (v == "never") {
        scheme = PreTokenizer::Prepend::kNever;
      } else {
        fail(path + ".prepend_scheme", fmt::format("unknown scheme {} (always, first, never)", quote(v)));
      }
    }
    const Json* legacy = member(p, path, "add_prefix_space", false);
    if (legacy != nullptr && legacy->is_boolean() && !legacy->get<bool>()) {
      if (scheme != PreTokenizer::Prepend::kNever && member(p, path, "prepend_scheme", false) != nullptr)
        fail(path + ".add_prefix_space", "false contradicts prepend_scheme");
      scheme = PreTokenizer::Prepend::kNever;
    }
    return scheme;
  }

  void load_decoder(const Json& d, const std::string& path, TokenizerImpl& t) {
    const std::string type = get_type(d, path);
    if (type == "Sequence") {
      for_each_item(*member(d, path, "decoders", true), path + ".decoders",
                    [&](const Json& item, const std::string& ipath) { load_decoder(item, ipath, t); });
      return;
    }
    DecodeStep step;
    if (type == "ByteLevel") {
      step.kind = DecodeStep::Kind::kByteLevel;
    } else if (type == "ByteFallback") {
      step.kind = DecodeStep::Kind::kByteFallback;
    } else if (type == "Fuse") {
      step.kind = DecodeStep::Kind::kFuse;
    } else if (type == "Replace") {
      step.kind = DecodeStep::Kind::kReplace;
      const std::string ppath = path + ".pattern";
      const Json& pattern = *member(d, path, "pattern", true);
      const Json* literal = member(pattern, ppath, "String", false);
      if (literal == nullptr) fail(ppath, "expected {\"String\": ...} (a Regex pattern in a decoder is not supported)");
      step.pattern = get_string(*literal, ppath + ".String");
      step.content = get_string(*member(d, path, "content", true), path + ".content");
    } else if (type == "Strip") {
      step.kind = DecodeStep::Kind::kStrip;
      step.content = get_char(*member(d, path, "content", true), path + ".content");
      step.start = get_count(d, path, "start");
      step.stop = get_count(d, path, "stop");
    } else if (type == "Metaspace") {
      step.kind = DecodeStep::Kind::kMetaspace;
      step.pattern = get_char(*member(d, path, "replacement", true), path + ".replacement");
      step.prepend = load_prepend_scheme(d, path) != PreTokenizer::Prepend::kNever;
    } else {
      fail(path + ".type", fmt::format("unsupported decoder {} (supported: ByteLevel, Replace, ByteFallback, Fuse, "
                                       "Strip, Metaspace, Sequence, null)",
                                       quote(type)));
    }
    t.decoders.push_back(std::move(step));
  }

  size_t get_count(const Json& obj, const std::string& path, const char* key) const {
    const Json& v = *member(obj, path, key, true);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      fail(join(path, key), fmt::format("expected a non-negative integer, got {}", type_name(v)));
    return static_cast<size_t>(std::min<uint64_t>(v.get<uint64_t>(), 1U << 30));
  }

  void load_pre_tokenizer(const Json& p, const std::string& path, TokenizerImpl& t) {
    const std::string type = get_type(p, path);
    if (type == "Sequence") {
      for_each_item(*member(p, path, "pretokenizers", true), path + ".pretokenizers",
                    [&](const Json& item, const std::string& ipath) { load_pre_tokenizer(item, ipath, t); });
      return;
    }
    PreTokenizer pt;
    if (type == "ByteLevel") {
      pt.kind = PreTokenizer::Kind::kByteLevel;
      pt.add_prefix_space = get_bool(p, path, "add_prefix_space", true);
      pt.use_regex = get_bool(p, path, "use_regex", true);
    } else if (type == "Split") {
      pt.kind = PreTokenizer::Kind::kSplit;
      pt.regex = load_pattern(p, path);
      const std::string behavior = get_string(*member(p, path, "behavior", true), path + ".behavior");
      static const std::map<std::string, SplitBehavior> kBehaviors = {
          {"Removed", SplitBehavior::kRemoved},
          {"Isolated", SplitBehavior::kIsolated},
          {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
          {"MergedWithNext", SplitBehavior::kMergedWithNext},
          {"Contiguous", SplitBehavior::kContiguous}};
      auto it = kBehaviors.find(behavior);
      if (it == kBehaviors.end()) fail(path + ".behavior", fmt::format("unknown behavior {}", quote(behavior)));
      pt.behavior = it->second;
      pt.invert = get_bool(p, path, "invert", false);
    } else if (type == "Metaspace") {
      pt.kind = PreTokenizer::Kind::kMetaspace;
      pt.replacement = get_char(*member(p, path, "replacement", true), path + ".replacement");
      pt.prepend = load_prepend_scheme(p, path);
      pt.split = get_bool(p, path, "split", true);
      pt.regex = std::make_shared<Regex>(pt.replacement, true, fmt::format("{}: {}.replacement", source_, path));
    } else {
      fail(path + ".type",
           fmt::format("unsupported pre_tokenizer {} (supported: ByteLevel, Split, Metaspace, Sequence, null)",
                       quote(type)));
    }
    t.pre_tokenizers.push_back(std::move(pt));
  }

  void load_post_processor(const Json& p, const std::string& path, TokenizerImpl& t) {
    const std::string type = get_type(p, path);
    if (type == "ByteLevel") return;  // offsets only; adds no ids
    if (type == "Sequence") {
      for_each_item(*member(p, path, "processors", true), path + ".processors",
                    [&](const Json& item, const std::string& ipath) { load_post_processor(item, ipath, t); });
      return;
    }
    if (type != "TemplateProcessing") {
      fail(path + ".type", fmt::format("unsupported post_processor {} (supported: ByteLevel, TemplateProcessing, "
                                       "Sequence, null)",
                                       quote(type)));
    }
    if (!t.template_prefix.empty() || !t.template_suffix.empty())
      fail(path, "more than one TemplateProcessing is not supported");
    const Json& specials = *member(p, path, "special_tokens", true);
    if (!specials.is_object()) fail(path + ".special_tokens", "expected an object");
    const Json& single = *member(p, path, "single", true);
    const std::string spath = path + ".single";
    if (!single.is_array()) fail(spath, "expected an array");
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string ipath = fmt::format("{}[{}]", spath, i);
      const Json& item = single[i];
      if (const Json* seq = member(item, ipath, "Sequence", false)) {
        const std::string id = get_string(*member(*seq, ipath + ".Sequence", "id", true), ipath + ".Sequence.id");
        if (id != "A")
          fail(ipath + ".Sequence.id", fmt::format("the single template may only use A, got {}", quote(id)));
        if (seen_sequence) fail(ipath, "the sequence appears twice");
        seen_sequence = true;
      } else if (const Json* sp = member(item, ipath, "SpecialToken", false)) {
        const std::string name =
            get_string(*member(*sp, ipath + ".SpecialToken", "id", true), ipath + ".SpecialToken.id");
        const std::string tpath = fmt::format("{}.special_tokens.{}", path, quote(name));
        auto it = specials.find(name);
        if (it == specials.end()) fail(tpath, "missing (named by " + ipath + ")");
        const Json& ids = *member(*it, tpath, "ids", true);
        if (!ids.is_array()) fail(tpath + ".ids", "expected an array");
        for (size_t k = 0; k < ids.size(); ++k) {
          const int32_t id = get_id(ids[k], fmt::format("{}.ids[{}]", tpath, k));
          (seen_sequence ? t.template_suffix : t.template_prefix).push_back(id);
        }
      } else {
        fail(ipath, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_sequence) fail(spath, "the template has no Sequence A");
  }

  std::string source_;
};

}  // namespace

std::shared_ptr<TokenizerImpl> load_tokenizer_json(std::string_view json, const std::string& source) {
  static std::atomic<uint64_t> next_uid{1};
  auto t = std::make_shared<TokenizerImpl>();
  t->source = source;
  Loader(source).load(json, *t);
  t->json = std::string(json);
  t->uid = next_uid++;
  t->finish();
  return t;
}

void load_tokenizer_config(const std::filesystem::path& folder, TokenizerImpl& t) {
  std::map<std::string, std::optional<std::string>> special;  // key -> content (nullopt: explicitly null)
  Json config;
  std::string config_source;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const std::filesystem::path file = folder / name;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) continue;
    const std::string source = file.string();
    Loader loader(source);
    Json doc;
    try {
      doc = Json::parse(util::read_file(source, kJsonLoadComponent));
    } catch (const Json::exception& e) {
      throw Error(kJsonLoadComponent, fmt::format("{}: malformed JSON: {}", source, e.what()));
    }
    if (!doc.is_object()) loader.fail("(root)", "expected an object");
    for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      auto it = doc.find(key);
      if (it == doc.end()) continue;
      // special_tokens_map.json overrides tokenizer_config.json, as in transformers' from_pretrained.
      if (it->is_null()) {
        special[key] = std::nullopt;
      } else if (it->is_string()) {
        special[key] = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        special[key] = (*it)["content"].get<std::string>();
      } else {
        loader.fail(key, "expected a string, an AddedToken object with a content string, or null");
      }
    }
    if (std::string(name) == "tokenizer_config.json") {
      config = std::move(doc);
      config_source = source;
    }
  }
  const auto token_of = [&](const char* key) -> std::optional<std::string> {
    auto it = special.find(key);
    if (it == special.end() || !it->second) return std::nullopt;
    const std::string& content = *it->second;
    if (!t.added_ids.count(content) && !t.model.vocab.count(content)) {
      throw Error(kJsonLoadComponent,
                  fmt::format("{}: {} {} is not a token of {}", folder.string(), key, quote(content), t.source));
    }
    return content;
  };
  t.bos_token = token_of("bos_token");
  t.eos_token = token_of("eos_token");
  t.pad_token = token_of("pad_token");
  t.unk_token = token_of("unk_token");

  // What chat templates and collators read: the template (a chat_template.jinja beside the config wins, as in
  // transformers' from_pretrained; a list of named templates gives its "default"), padding_side and the
  // additional special tokens.
  if (config.is_object()) {
    Loader loader(config_source);
    if (auto it = config.find("padding_side"); it != config.end()) {
      if (!it->is_string() || (*it != "left" && *it != "right")) loader.fail("padding_side", "expected left or right");
      t.padding_side = it->get<std::string>();
    }
    if (auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array()) {
      for (const Json& x : *it) {
        if (x.is_string()) t.additional_special_tokens.push_back(x.get<std::string>());
        if (x.is_object() && x.contains("content") && x["content"].is_string())
          t.additional_special_tokens.push_back(x["content"].get<std::string>());
      }
    }
    if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
      if (it->is_string()) {
        t.chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        for (const Json& x : *it) {
          if (!x.is_object() || !x.contains("name") || !x.contains("template") || !x["template"].is_string())
            loader.fail("chat_template", "expected a string or a list of {name, template} objects");
          if (x["name"] == "default") t.chat_template = x["template"].get<std::string>();
        }
      } else {
        loader.fail("chat_template", "expected a string or a list of {name, template} objects");
      }
    }
  }
  {
    const std::filesystem::path file = folder / "chat_template.jinja";
    std::error_code ec;
    if (std::filesystem::is_regular_file(file, ec))
      t.chat_template = util::read_file(file.string(), kJsonLoadComponent);
  }

  // LlamaTokenizerFast rebuilds the post-processor from add_bos_token (default true) / add_eos_token (default false).
  if (!config.is_object()) return;
  const auto cls = config.find("tokenizer_class");
  if (cls == config.end() || !cls->is_string()) return;
  const std::string name = cls->get<std::string>();
  if (name != "LlamaTokenizer" && name != "LlamaTokenizerFast") return;
  Loader loader(config_source);
  const bool add_bos = loader.get_bool(config, "", "add_bos_token", true);
  const bool add_eos = loader.get_bool(config, "", "add_eos_token", false);
  const auto id_of = [&](const std::optional<std::string>& token, const char* key) {
    if (!token) loader.fail(key, fmt::format("add_{} is true but {} is not set", key, key));
    auto it = t.added_ids.find(*token);
    return it != t.added_ids.end() ? it->second : t.model.vocab.find(*token)->second;
  };
  t.template_prefix.clear();
  t.template_suffix.clear();
  if (add_bos) t.template_prefix.push_back(id_of(t.bos_token, "bos_token"));
  if (add_eos) t.template_suffix.push_back(id_of(t.eos_token, "eos_token"));
}

}  // namespace tessera::data::detail
