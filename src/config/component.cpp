// Parsing of component maps through a registry.
#include "tessera/config/component.h"

namespace tessera::config {

std::vector<ComponentOptions> parse_components(Section& parent, std::string_view key,
                                               const ComponentRegistry& registry) {
  std::vector<ComponentOptions> out;
  Section map = parent.section(key);
  for (const std::string& name : map.keys()) {
    Section options = map.section(name);
    if (auto parsed = registry.parse(name, options, map, name)) out.push_back({name, std::move(*parsed)});
  }
  return out;
}

}  // namespace tessera::config
