// Event dispatch in Composer's order.
#include "tessera/core/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace tessera::core {

bool Engine::debug_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TESSERA_ENGINE_DEBUG");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return enabled;
}

void Engine::run_event(Event event) {
  const bool debug = debug_enabled();
  auto trace = [&](const std::string& who) {
    if (debug)
      spdlog::debug("[ep={}][ba={}][event={}] {}", state_.timestamp.epoch, state_.timestamp.batch, to_string(event),
                    who);
  };
  auto run_algorithms = [&] {
    std::vector<Algorithm*> matched;
    for (auto& a : state_.algorithms) {
      if (a->match(event, state_)) matched.push_back(a.get());
    }
    if (is_after_event(event)) std::reverse(matched.begin(), matched.end());
    for (Algorithm* a : matched) {
      trace(a->name());
      a->apply(event, state_, logger_);
    }
  };
  auto run_callbacks = [&](bool loggers) {
    for (auto& c : state_.callbacks) {
      if ((dynamic_cast<LoggerDestination*>(c.get()) != nullptr) != loggers) continue;
      trace(c->name());
      c->run_event(event, state_, logger_);
    }
  };
  if (event == Event::kInit) {
    run_callbacks(true);
    run_callbacks(false);
    run_algorithms();
  } else {
    run_algorithms();
    run_callbacks(false);
    run_callbacks(true);
  }
}

void Engine::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& c : state_.callbacks) {
    try {
      c->close(state_, logger_);
    } catch (const std::exception& e) {
      spdlog::error("callback {} failed to close: {}", c->name(), e.what());
    }
  }
}

}  // namespace tessera::core
