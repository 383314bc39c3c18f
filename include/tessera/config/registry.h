// Components chosen by `name:` in recipes (models, optimizers, schedulers, loaders, algorithms, callbacks, loggers).
// Each family has one Registry; an entry maps a name to the function that parses that component's Options (errors
// name the file, key path and line) and, for the families the trainer builds, the function that builds it. Built-in
// components and research code embedding Tessera register the same way, before the Trainer is built; a recipe then
// names them. Registration is not thread-safe: do it at start-up.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/config/preflight.h"
#include "tessera/config/reader.h"
#include "tessera/util/error.h"

namespace tessera::config {

// `Options` is what parsing yields; `Built` (void: parse-only) what build(name, options, args...) returns.
template <class Options, class Built = void, class... Args>
class Registry {
 public:
  using Parser = std::function<Options(Section&)>;
  using Builder = std::function<Built(const Options&, Args...)>;
  // Pre-flight (config/preflight.h): what would fail once the run is under way (a missing input, an output folder
  // that cannot be written, a server that does not answer), checked before anything is built.
  using Checker = std::function<Problems(const Options&, const CheckContext&)>;

  // `family` names the kind of component in messages ("optimizer", "callback").
  explicit Registry(std::string family) : family_(std::move(family)) {}

  // Registers (or replaces) a component. Without a builder the name parses but cannot be built.
  void add(const std::string& name, Parser parser, Builder builder = nullptr) {
    entries_[name] = {std::move(parser), std::move(builder)};
    checkers_.erase(name);  // a replaced component brings its own check, or none
  }
  // Gives a registered entry its pre-flight check; an entry without one has nothing to check.
  void set_check(const std::string& name, Checker checker) { checkers_[name] = std::move(checker); }
  Problems check(const std::string& name, const Options& options, const CheckContext& context) const {
    auto it = checkers_.find(name);
    return it == checkers_.end() ? Problems{} : it->second(options, context);
  }

  // Names LLM Foundry/Composer register in this family that Tessera does not implement yet: a recipe naming one gets
  // "not supported yet" rather than "unknown".
  void add_foundry_names(std::initializer_list<const char*> names) { foundry_.insert(names.begin(), names.end()); }

  const std::string& family() const { return family_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) out.push_back(name);
    return out;
  }

  // Parses section `s` as component `name`. A foundry-only name is recorded as not supported yet (nullopt); an
  // unknown name is an error at `name_key` of `at` listing what is available.
  std::optional<Options> parse(const std::string& name, Section& s, Section& at, std::string_view name_key) const {
    if (auto it = entries_.find(name); it != entries_.end()) return it->second.parse(s);
    if (foundry_.count(name)) {
      at.not_supported(name_key, fmt::format("{} {}", family_, name));
      return std::nullopt;
    }
    at.fail(name_key, fmt::format("unknown {} \"{}\" (available: {})", family_, name, fmt::join(names(), ", ")));
  }

  // Builds component `name` from options its parser returned. Throws ConfigError for a name that is not registered
  // or was registered without a builder.
  Built build(const std::string& name, const Options& options, Args... args) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      throw ConfigError(family_,
                        fmt::format("unknown {} \"{}\" (available: {})", family_, name, fmt::join(names(), ", ")));
    }
    if (!it->second.build) {
      throw ConfigError(family_, fmt::format("{} \"{}\" was registered without a builder", family_, name));
    }
    return it->second.build(options, std::forward<Args>(args)...);
  }

 private:
  struct Entry {
    Parser parse;
    Builder build;
  };
  std::string family_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, Checker> checkers_;
  std::set<std::string> foundry_;
};

}  // namespace tessera::config
