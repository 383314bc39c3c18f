// Components chosen by `name:` in recipes (optimizers, schedulers, models, loaders, algorithms, callbacks, loggers).
// Each family has one Registry that maps a name to the function parsing that component's Options. Later features,
// and research code embedding Tessera, only add entries. Registration is not thread-safe: do it at start-up.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/config/reader.h"

namespace tessera::config {

template <class Options>
class Registry {
 public:
  using Parser = std::function<Options(Section&)>;

  // `family` names the kind of component in messages ("optimizer", "callback").
  explicit Registry(std::string family) : family_(std::move(family)) {}

  // Registers (or replaces) a component.
  void add(const std::string& name, Parser parser) { parsers_[name] = std::move(parser); }
  // Names LLM Foundry/Composer register in this family that Tessera does not implement yet: a recipe naming one gets
  // "not supported yet" rather than "unknown".
  void add_foundry_names(std::initializer_list<const char*> names) { foundry_.insert(names.begin(), names.end()); }

  bool contains(const std::string& name) const { return parsers_.count(name) > 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, parser] : parsers_) out.push_back(name);
    return out;
  }

  // Parses section `s` as component `name`. A foundry-only name is recorded as not supported yet (nullopt); an
  // unknown name is an error at `name_key` of `at` listing what is available.
  std::optional<Options> parse(const std::string& name, Section& s, Section& at, std::string_view name_key) const {
    if (auto it = parsers_.find(name); it != parsers_.end()) return it->second(s);
    if (foundry_.count(name)) {
      at.not_supported(name_key, fmt::format("{} {}", family_, name));
      return std::nullopt;
    }
    at.fail(name_key, fmt::format("unknown {} \"{}\" (available: {})", family_, name, fmt::join(names(), ", ")));
  }

 private:
  std::string family_;
  std::map<std::string, Parser> parsers_;
  std::set<std::string> foundry_;
};

}  // namespace tessera::config
