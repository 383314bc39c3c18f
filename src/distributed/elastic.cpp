// Elastic jobs (distributed/launcher.h, docs/distributed.md#elastic-jobs-node-exclusion): the rendezvous host, which
// decides every attempt, restart and exclusion, and the agents on the other nodes; rendezvous.h has their messages.
#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "launch_attempt.h"
#include "rendezvous.h"
#include "tessera/util/error.h"
#include "tessera/util/preemption.h"
#include "watchdog.h"

namespace tessera::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array<std::pair<Ending::Kind, const char*>, 7> kKindNames = {{
    {Ending::Kind::kSuccess, "success"},
    {Ending::Kind::kRankFailed, "failed"},
    {Ending::Kind::kCannotRun, "cannot_run"},
    {Ending::Kind::kHang, "hang"},
    {Ending::Kind::kSignal, "signal"},
    {Ending::Kind::kPreempted, "preempted"},
    {Ending::Kind::kStopped, "stopped"},
}};

const char* kind_name(Ending::Kind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "failed";
}

Ending::Kind kind_from(const std::string& name) {
  for (const auto& [k, n] : kKindNames) {
    if (name == n) return k;
  }
  return Ending::Kind::kRankFailed;
}

// How often the rendezvous host and its agents look at their connections outside an attempt.
constexpr int kRendezvousPollMs = 50;

bool parse_int(const std::string& text, int& out) {
  try {
    size_t used = 0;
    out = std::stoi(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

// The rendezvous host: node 0 of every attempt, and the one that decides restarts and exclusions.
class RendezvousHost {
 public:
  RendezvousHost(const LaunchOptions& o, const SignalGuard& signals, Watchdog* watchdog)
      : o_(o), signals_(signals), watchdog_(watchdog), endpoint_(detail::parse_endpoint(o.rdzv_endpoint)) {
    listener_ = detail::listen_on(endpoint_, o.max_nodes > 1);
  }
  ~RendezvousHost() {
    for (Node& n : nodes_) n.conn.close();
    if (listener_ >= 0) ::close(listener_);
  }
  RendezvousHost(const RendezvousHost&) = delete;
  RendezvousHost& operator=(const RendezvousHost&) = delete;

  int run() {
    spdlog::info("[launch] elastic job: {} to {} nodes of {} ranks; rendezvous host (node {}) at {}:{}", o_.min_nodes,
                 o_.max_nodes, o_.nproc_per_node, o_.node_id, endpoint_.host, endpoint_.port);
    for (int restarts = 0;; ++restarts) {
      if (std::optional<int> code = gather(restarts == 0)) return finish(*code);
      const size_t n = std::min(nodes_.size() + 1, static_cast<size_t>(o_.max_nodes));  // + 1: this node
      std::vector<Node*> members;
      std::string names = o_.node_id;
      for (size_t i = 0; i + 1 < n; ++i) {
        members.push_back(&nodes_[i]);
        names += ", " + nodes_[i].id;
      }
      const int nnodes = static_cast<int>(n);
      spdlog::info("[launch] attempt {}: {} node{} ({}), world size {}", restarts, nnodes, nnodes == 1 ? "" : "s",
                   names, nnodes * o_.nproc_per_node);
      for (size_t i = 0; i < members.size(); ++i) {
        members[i]->end.reset();
        members[i]->conn.send(fmt::format("START {} {} {}", restarts, i + 1, nnodes));
      }
      LaunchOptions round = o_;
      round.nnodes = nnodes;
      round.node_rank = 0;
      round.master_addr = endpoint_.host;
      const Ending own = run_attempt(round, restarts, signals_, watchdog_, [&]() -> std::optional<std::string> {
        service(0);
        for (const Node* m : members) {
          if (!m->conn.is_open() && !m->end)
            return fmt::format("node {} is lost (its launcher's connection closed)", m->id);
          if (m->end && m->end->kind != Ending::Kind::kSuccess) return fmt::format("node {}: {}", m->id, m->end->cause);
        }
        return std::nullopt;
      });
      collect(members, own);

      // The outcome: the worst of every node's.
      std::vector<std::pair<std::string, Ending>> ends = {{o_.node_id, own}};
      for (const Node* m : members) {
        ends.emplace_back(m->id, m->end.value_or(Ending{Ending::Kind::kRankFailed, 1, "lost"}));
      }
      auto any = [&](Ending::Kind k) {
        return std::find_if(ends.begin(), ends.end(), [&](const auto& e) { return e.second.kind == k; });
      };
      std::vector<std::pair<std::string, std::string>> newly_excluded;  // id, reason
      for (const Node* m : members) {
        if (!m->end) {
          newly_excluded.emplace_back(m->id, "lost");
        } else if (m->end->kind == Ending::Kind::kRankFailed && m->end->code == util::kExitNodeBad) {
          newly_excluded.emplace_back(m->id, fmt::format("its ranks marked it bad: {}", m->end->cause));
        }
      }
      const bool all_ok =
          std::all_of(ends.begin(), ends.end(), [](const auto& e) { return e.second.kind == Ending::Kind::kSuccess; });
      if (all_ok) {
        if (restarts > 0) {
          spdlog::info("[launch] the job succeeded after {} restart{}", restarts, restarts == 1 ? "" : "s");
        }
        return finish(0);
      }
      if (auto e = any(Ending::Kind::kSignal); e != ends.end() || own.interrupted || g_pending_signal != 0) {
        const int code = e != ends.end() ? e->second.code : own.code;
        if (o_.max_restarts > 0) spdlog::warn("[launch] not restarting: stopped by a signal");
        return finish(code);
      }
      if (auto e = any(Ending::Kind::kCannotRun); e != ends.end()) return finish(e->second.code);
      // The first real failure, not a node stopped because of it.
      std::string cause;
      int code = 1;
      for (const auto& [id, reason] : newly_excluded) {
        if (cause.empty()) cause = fmt::format("node {} ({})", id, reason);
      }
      for (const auto& [id, e] : ends) {
        if (cause.empty() && e.kind != Ending::Kind::kSuccess && e.kind != Ending::Kind::kStopped &&
            e.kind != Ending::Kind::kPreempted) {
          cause = fmt::format("node {}: {}", id, e.cause);
          code = e.code;
        }
      }
      if (cause.empty()) {
        if (auto e = any(Ending::Kind::kPreempted); e != ends.end()) {
          spdlog::warn(
              "[launch] the job stopped for a preemption after saving a checkpoint (exit {}); run it again "
              "to resume",
              util::kExitPreempted);
          return finish(util::kExitPreempted);
        }
        cause = "a node stopped";
      }
      if (own.kind == Ending::Kind::kRankFailed && own.code == util::kExitNodeBad) {
        spdlog::error(
            "[launch] this node ({}), the rendezvous host, was marked bad by its ranks ({}); the host cannot "
            "leave its own job: stopping it so that it can be started again without this node",
            o_.node_id, own.cause);
        return finish(util::kExitNodeBad);
      }
      for (const auto& [id, reason] : newly_excluded) exclude(id, reason);
      if (restarts >= o_.max_restarts) {
        if (o_.max_restarts > 0) {
          spdlog::error("[launch] giving up after {} restart{} (--max-restarts {}); last failure: {}", restarts,
                        restarts == 1 ? "" : "s", o_.max_restarts, cause);
        }
        return finish(code);
      }
      spdlog::warn("[launch] restart {}/{} after {}{}", restarts + 1, o_.max_restarts, cause, excluded_list());
    }
  }

 private:
  struct Node {
    std::string id;
    detail::LineConn conn;
    std::optional<Ending> end;  // the current attempt's, once reported
  };

  std::string excluded_list() const {
    if (excluded_.empty()) return "";
    std::string list;
    for (const auto& [id, reason] : excluded_) list += fmt::format("{}{} ({})", list.empty() ? "" : ", ", id, reason);
    return "; excluded nodes: " + list;
  }

  void exclude(const std::string& id, const std::string& reason) {
    excluded_.emplace_back(id, reason);
    spdlog::error("[launch] excluding node {} from the job: {}", id, reason);
    for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
      if (it->id == id) {
        it->conn.send("EXCLUDED " + reason);
        nodes_.erase(it);
        break;
      }
    }
  }

  // Accepts connections, reads JOINs and the nodes' messages, waiting up to timeout_ms for the first.
  void service(int timeout_ms) {
    for (detail::LineConn c = detail::accept_connection(listener_); c.is_open();
         c = detail::accept_connection(listener_)) {
      joining_.push_back(std::move(c));
    }
    std::vector<std::string> lines;
    for (auto it = joining_.begin(); it != joining_.end();) {
      lines.clear();
      const bool open = it->receive(lines, 0);
      if (!lines.empty()) {
        join(std::move(*it), lines.front());
        it = joining_.erase(it);
      } else if (!open) {
        it = joining_.erase(it);
      } else {
        ++it;
      }
    }
    for (Node& n : nodes_) {
      lines.clear();
      n.conn.receive(lines, timeout_ms);
      timeout_ms = 0;
      for (const std::string& line : lines) {
        const std::vector<std::string> w = detail::split_message(line, 4);
        int code = 0;
        if (w.size() == 4 && w[0] == "END" && parse_int(w[2], code)) {
          n.end = Ending{kind_from(w[1]), code, w[3]};
        } else {
          spdlog::warn("[launch] ignoring an unexpected message from node {}: '{}'", n.id, line);
        }
      }
    }
    if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
  }

  void join(detail::LineConn conn, const std::string& line) {
    const std::vector<std::string> w = detail::split_message(line, 3);
    int nproc = 0;
    if (w.size() != 3 || w[0] != "JOIN" || !parse_int(w[2], nproc)) {
      spdlog::warn("[launch] ignoring a connection that did not join: '{}'", line);
      return;
    }
    const std::string& id = w[1];
    std::string refusal;
    if (nproc != o_.nproc_per_node) {
      refusal = fmt::format("node {} has --nproc-per-node {}, the job {}", id, nproc, o_.nproc_per_node);
    } else if (id == o_.node_id ||
               std::any_of(nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.id == id; })) {
      refusal = fmt::format("a node named {} is already in the job (give each launcher its own --node-id)", id);
    } else if (auto e = std::find_if(excluded_.begin(), excluded_.end(), [&](const auto& x) { return x.first == id; });
               e != excluded_.end()) {
      refusal = fmt::format("node {} was excluded from this job ({})", id, e->second);
    }
    if (!refusal.empty()) {
      spdlog::error("[launch] refusing node {}: {}", id, refusal);
      conn.send("REJECT " + refusal);
      return;
    }
    spdlog::info("[launch] node {} joined", id);
    nodes_.push_back(Node{id, std::move(conn), std::nullopt});
  }

  // Waits for enough nodes: max_nodes, or min_nodes and (before the first attempt) the last call for more. Returns an
  // exit code when the job cannot go on.
  std::optional<int> gather(bool first) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o_.rdzv_timeout_seconds));
    std::optional<Clock::time_point> last_call;
    while (true) {
      service(kRendezvousPollMs);
      // A node lost while waiting is simply gone (it never started this attempt).
      for (auto it = nodes_.begin(); it != nodes_.end();) {
        if (it->conn.is_open()) {
          ++it;
          continue;
        }
        spdlog::warn("[launch] node {} left before the attempt started", it->id);
        it = nodes_.erase(it);
      }
      if (const int sig = g_pending_signal; sig != 0) {
        spdlog::warn("[launch] stopped by signal {} ({}) while waiting for nodes", sig, strsignal(sig));
        return 128 + sig;
      }
      const int joined = static_cast<int>(nodes_.size()) + 1;
      if (joined >= o_.max_nodes) return std::nullopt;
      if (joined >= o_.min_nodes) {
        if (!first) return std::nullopt;  // a restart goes ahead on the nodes left, and those that joined meanwhile
        if (!last_call) {
          last_call = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(o_.rdzv_last_call_seconds));
        }
        if (Clock::now() >= *last_call) return std::nullopt;
      }
      if (Clock::now() >= deadline) {
        spdlog::error("[launch] only {} of the {} nodes the job needs (--nnodes {}:{}) joined within {} s{}", joined,
                      o_.min_nodes, o_.min_nodes, o_.max_nodes, o_.rdzv_timeout_seconds, excluded_list());
        return 1;
      }
    }
  }

  // After this node's ranks are done: stops the other members (unless every node so far succeeded) and waits for
  // each to report how its attempt ended; a node that does not within the grace period is lost.
  void collect(const std::vector<Node*>& members, const Ending& own) {
    auto failed = [&] {
      if (own.kind != Ending::Kind::kSuccess) return true;
      return std::any_of(members.begin(), members.end(), [](const Node* m) {
        return !m->conn.is_open() || (m->end && m->end->kind != Ending::Kind::kSuccess);
      });
    };
    bool stopped = false;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                             std::min(o_.stop_grace_seconds, kMaxGraceSeconds) + 15));
    while (true) {
      if (!stopped && failed()) {
        stopped = true;
        for (Node* m : members) {
          if (!m->end) m->conn.send("STOP");
        }
      }
      if (std::all_of(members.begin(), members.end(), [](const Node* m) { return m->end || !m->conn.is_open(); })) {
        return;
      }
      if (Clock::now() >= deadline) {
        for (Node* m : members) {
          if (!m->end && m->conn.is_open()) {
            spdlog::error("[launch] node {} did not report the end of its attempt; counting it as lost", m->id);
            m->conn.close();
          }
        }
        return;
      }
      service(kRendezvousPollMs);
    }
  }

  int finish(int code) {
    for (Node& n : nodes_) n.conn.send(fmt::format("DONE {}", code));
    return code;
  }

  const LaunchOptions& o_;
  const SignalGuard& signals_;
  Watchdog* watchdog_;
  const detail::Endpoint endpoint_;
  int listener_ = -1;
  std::vector<Node> nodes_;  // the other nodes, in joining order
  std::vector<detail::LineConn> joining_;
  std::vector<std::pair<std::string, std::string>> excluded_;  // id, reason
};

}  // namespace

int run_rendezvous_host(const LaunchOptions& o, const SignalGuard& signals, Watchdog* watchdog) {
  return RendezvousHost(o, signals, watchdog).run();
}

// Another node's launcher: joins the rendezvous and runs the attempts it is told to.
int run_agent(const LaunchOptions& o, const SignalGuard& signals, Watchdog* watchdog) {
  const detail::Endpoint endpoint = detail::parse_endpoint(o.rdzv_endpoint);
  spdlog::info("[launch] elastic job: node {} joining the rendezvous at {}:{}", o.node_id, endpoint.host,
               endpoint.port);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.rdzv_timeout_seconds));
  detail::LineConn conn;
  while (!(conn = detail::try_connect(endpoint)).is_open()) {
    if (const int sig = g_pending_signal; sig != 0) return 128 + sig;
    if (Clock::now() >= deadline) {
      spdlog::error("[launch] the rendezvous host at {}:{} did not answer within {} s (--rdzv-timeout)", endpoint.host,
                    endpoint.port, o.rdzv_timeout_seconds);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  conn.send(fmt::format("JOIN {} {}", o.node_id, o.nproc_per_node));
  auto host_gone = [&] {
    spdlog::error("[launch] the rendezvous host at {}:{} is gone (its connection closed); the job is lost",
                  endpoint.host, endpoint.port);
    return 1;
  };
  std::vector<std::string> lines;
  while (true) {
    lines.clear();
    const bool open = conn.receive(lines, kRendezvousPollMs);
    if (const int sig = g_pending_signal; sig != 0) {
      spdlog::warn("[launch] stopped by signal {} ({}) while waiting for the rendezvous", sig, strsignal(sig));
      return 128 + sig;
    }
    for (const std::string& line : lines) {
      const std::vector<std::string> w = detail::split_message(line, 4);
      int restarts = 0, node_rank = 0, nnodes = 0, code = 0;
      if (w.size() == 4 && w[0] == "START" && parse_int(w[1], restarts) && parse_int(w[2], node_rank) &&
          parse_int(w[3], nnodes)) {
        LaunchOptions round = o;
        round.nnodes = nnodes;
        round.node_rank = node_rank;
        round.master_addr = endpoint.host;
        spdlog::info("[launch] attempt {}: node {} is node {} of {} (ranks {}..{} of {})", restarts, o.node_id,
                     node_rank, nnodes, node_rank * o.nproc_per_node, (node_rank + 1) * o.nproc_per_node - 1,
                     nnodes * o.nproc_per_node);
        bool lost = false;
        const Ending end = run_attempt(round, restarts, signals, watchdog, [&]() -> std::optional<std::string> {
          std::vector<std::string> got;
          if (!conn.receive(got, 0) && got.empty()) {
            lost = true;
            return std::string("the rendezvous host is gone");
          }
          for (const std::string& g : got) {
            if (g == "STOP") return std::string("another node failed (the rendezvous host said to stop)");
          }
          return std::nullopt;
        });
        if (lost || !conn.send(fmt::format("END {} {} {}", kind_name(end.kind), end.code, end.cause))) {
          return host_gone();
        }
        if (end.kind == Ending::Kind::kSignal) return end.code;
      } else if (w.size() >= 2 && w[0] == "DONE" && parse_int(w[1], code)) {
        return code;
      } else if (w.size() >= 2 && w[0] == "EXCLUDED") {
        spdlog::error("[launch] node {} was excluded from the job: {}", o.node_id, line.substr(9));
        return util::kExitNodeBad;
      } else if (w.size() >= 2 && w[0] == "REJECT") {
        throw ConfigError("launch", fmt::format("the rendezvous host at {}:{} refused node {}: {}", endpoint.host,
                                                endpoint.port, o.node_id, line.substr(7)));
      } else if (w[0] != "STOP") {  // a STOP that came after the attempt ended needs nothing
        spdlog::warn("[launch] ignoring an unexpected message from the rendezvous host: '{}'", line);
      }
    }
    if (!open) return host_gone();
  }
}

}  // namespace tessera::dist::detail
