// Component maps (`algorithms:`, `callbacks:`, `loggers:`): each key names a registered component and its value holds
// that component's options. Options are type-erased here; each component's layer knows its own Options type.
#pragma once

#include <any>
#include <string>
#include <vector>

#include "tessera/config/registry.h"

namespace tessera::config {

struct ComponentOptions {
  std::string name;
  std::any options;  // the component's own Options struct, as its parser returned it
};

using ComponentRegistry = Registry<std::any>;

// Reads the map at `key` of `parent`: every entry must be a registered component (or LLM Foundry's, then reported as
// not supported yet). A null entry (`lr_monitor: {}` or `lr_monitor:`) means default options.
std::vector<ComponentOptions> parse_components(Section& parent, std::string_view key,
                                               const ComponentRegistry& registry);

}  // namespace tessera::config
