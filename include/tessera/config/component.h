// Component maps (`algorithms:`, `callbacks:`, `loggers:`): each key names a registered component and its value holds
// that component's options. Options are type-erased here (std::any); each component's layer knows its own Options
// type, and its registry entry both parses and builds it.
#pragma once

#include <any>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tessera/config/registry.h"

namespace tessera::config {

struct ComponentOptions {
  std::string name;
  std::any options;  // the component's own Options struct, as its parser returned it
};

// A family whose components each have their own Options type; `Built` is what build() returns.
template <class Built, class... Args>
using ComponentRegistry = Registry<std::any, Built, Args...>;

// Reads the map at `key` of `parent`: every entry must be a registered component (or LLM Foundry's, then reported as
// not supported yet). A null entry (`lr_monitor: {}` or `lr_monitor:`) means default options.
template <class Built, class... Args>
std::vector<ComponentOptions> parse_components(Section& parent, std::string_view key,
                                               const ComponentRegistry<Built, Args...>& registry) {
  std::vector<ComponentOptions> out;
  Section map = parent.section(key);
  for (const std::string& name : map.keys()) {
    Section options = map.section(name);
    if (auto parsed = registry.parse(name, options, map, name)) out.push_back({name, std::move(*parsed)});
  }
  return out;
}

// Builds every component of `components` in order (a builder may return nullptr: nothing to add on this rank).
template <class Built, class... Args>
std::vector<Built> build_components(const std::vector<ComponentOptions>& components,
                                    const ComponentRegistry<Built, Args...>& registry,
                                    std::type_identity_t<Args>... args) {
  std::vector<Built> out;
  for (const ComponentOptions& c : components) {
    if (Built b = registry.build(c.name, c.options, args...)) out.push_back(std::move(b));
  }
  return out;
}

}  // namespace tessera::config
