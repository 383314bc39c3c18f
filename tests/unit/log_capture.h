// Sends spdlog's default logger to a string for the scope of a test (what a component logs, read back as text).
// Not thread-safe against a test that swaps the default logger itself.
#pragma once

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>

namespace tessera::testing {

class LogCapture {
 public:
  LogCapture() : old_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", std::move(sink)));
  }
  ~LogCapture() { spdlog::set_default_logger(old_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  // Everything logged so far (the logger flushed first).
  std::string text() {
    spdlog::default_logger()->flush();
    return text_.str();
  }

 private:
  std::shared_ptr<spdlog::logger> old_;
  std::ostringstream text_;
};

}  // namespace tessera::testing
