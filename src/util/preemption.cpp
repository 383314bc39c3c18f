#include "tessera/util/preemption.h"

#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <utility>

#include "tessera/util/error.h"

namespace tessera::util {
namespace {

constexpr std::pair<const char*, int> kSignals[] = {{"TERM", SIGTERM}, {"INT", SIGINT},   {"HUP", SIGHUP},
                                                    {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"QUIT", SIGQUIT}};

// Lock-free atomics are async-signal-safe.
std::atomic<int> g_received{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_preemption_signal(int sig) {
  int none = 0;
  g_received.compare_exchange_strong(none, sig);
}

}  // namespace

int parse_signal_name(const std::string& name) {
  std::string n;
  for (const char c : name) n += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (n.rfind("SIG", 0) == 0) n = n.substr(3);
  for (const auto& [text, number] : kSignals) {
    if (n == text) return number;
  }
  throw ConfigError("recipe", fmt::format("\"{}\" is not a signal Tessera can treat as preemption (expected one of "
                                          "SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT)",
                                          name));
}

std::string signal_name(int signal) {
  for (const auto& [text, number] : kSignals) {
    if (number == signal) return std::string("SIG") + text;
  }
  return fmt::format("signal {}", signal);
}

PreemptionHandler::PreemptionHandler(std::vector<int> signals) : signals_(std::move(signals)) {
  if (g_installed.exchange(true)) return;
  owner_ = true;
  g_received = 0;
  for (const int sig : signals_) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    previous_.push_back(old);
    if (old.sa_handler == SIG_IGN) continue;
    struct sigaction act {};
    act.sa_handler = on_preemption_signal;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    ::sigaction(sig, &act, nullptr);
  }
}

PreemptionHandler::~PreemptionHandler() {
  if (!owner_) return;
  for (size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
  g_installed = false;
}

int PreemptionHandler::received() {
  return g_received.load();
}

}  // namespace tessera::util
