// Runs algorithms, callbacks and loggers on each event, in Composer's order:
//   - on INIT: loggers, then other callbacks, then algorithms (loggers exist before anything logs);
//   - otherwise: algorithms (those whose match() is true; in reverse order on AFTER_* events), then callbacks, then
//     loggers (they see what the others changed and logged).
// close() calls every callback's close(); exceptions there are logged and swallowed so that all of them run.
#pragma once

#include <functional>

#include "tessera/core/callback.h"
#include "tessera/core/event.h"
#include "tessera/core/state.h"

namespace tessera::core {

class Engine {
 public:
  Engine(State& state, Logger& logger) : state_(state), logger_(logger) {}
  ~Engine() { close(); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void run_event(Event event);
  void close();

  // With TESSERA_ENGINE_DEBUG=1 in the environment, every dispatch is logged at debug level (Composer's ENGINE_DEBUG).
  static bool debug_enabled();

 private:
  State& state_;
  Logger& logger_;
  bool closed_ = false;
};

}  // namespace tessera::core
