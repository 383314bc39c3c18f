// Internal: the wire of the elastic launchers' rendezvous (docs/distributed.md#elastic-jobs). The launcher started with
// --rdzv-host listens on the endpoint; every other node's launcher keeps one TCP connection to it, which carries lines
// of text, words separated by single spaces, the last word of a message taking the rest of the line:
//   agent -> host   JOIN <node id> <nproc per node>
//                   END <kind> <exit code> <cause>         (kind: success, failed, cannot_run, hang, signal, preempted,
//                                                            stopped)
//   host -> agent   START <restart count> <node rank> <nnodes>
//                   STOP                                    (another node failed: stop the ranks, then report END)
//                   DONE <exit code>                        (the job is over: exit with this code)
//                   EXCLUDED <reason>                       (this node is out of the job)
//                   REJECT <reason>                         (the JOIN was refused)
// A closed connection means the other side is gone: an agent's node is lost, or the job is (the host's). A line longer
// than kMaxLineBytes closes the connection that sent it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tessera::dist::detail {

// "HOST:PORT" (HOST may be a name, an IPv4 address or a bracketed IPv6 address). Throws ConfigError naming the value.
struct Endpoint {
  std::string host;
  int port = 0;
};
Endpoint parse_endpoint(const std::string& text);

// The longest line a rendezvous connection takes (the messages are a few words): a peer that sends more without a
// newline is cut off, so that no peer makes the host buffer without limit.
inline constexpr size_t kMaxLineBytes = size_t{1} << 20;

// One end of a rendezvous connection. Owns the socket. Movable, not copyable.
class LineConn {
 public:
  LineConn() = default;
  explicit LineConn(int fd);
  ~LineConn();
  LineConn(LineConn&& other) noexcept;
  LineConn& operator=(LineConn&& other) noexcept;
  LineConn(const LineConn&) = delete;
  LineConn& operator=(const LineConn&) = delete;

  bool is_open() const { return fd_ >= 0; }
  // Sends one line (a newline is added). Returns false, and closes, when the peer is gone.
  bool send(const std::string& line);
  // Waits up to timeout_ms for data, then appends the complete lines received to `lines` (reading at most about
  // kMaxLineBytes per call). Returns false, and closes, once the peer has closed the connection (after the lines it
  // sent before), or when it sent a line longer than kMaxLineBytes (an error naming the peer's address is logged).
  bool receive(std::vector<std::string>& lines, int timeout_ms);
  void close();

 private:
  int fd_ = -1;
  std::string pending_;
};

// A listening TCP socket (close-on-exec, SO_REUSEADDR, blocking) and its port. The caller owns fd.
struct Listener {
  int fd = -1;
  int port = 0;
};

// Listens on `port` (0: a port the kernel picks) at the address of this machine that `host` names, so that a
// rendezvous is reachable only where its peers are told to connect: 127.0.0.1 or localhost binds loopback, the name or
// address of one of this machine's interfaces binds that interface. Every interface only, with a warning naming
// `what`: when `host` is no address of this machine (a name behind NAT, a floating address), or when the name `host`
// resolves to a loopback address here while `other_nodes` will connect (a host name that /etc/hosts maps to
// 127.0.1.1; a literal 127.0.0.1, ::1 or localhost stays on loopback).
// Throws Error(component) naming `what`, host and port (a name that does not resolve, a port in use).
Listener listen_at(const std::string& host, int port, const std::string& what, bool other_nodes,
                   const std::string& component);

// The elastic rendezvous host's socket: listen_at the endpoint (non-blocking). Throws Error naming the endpoint.
int listen_on(const Endpoint& endpoint, bool other_nodes);
// A connection waiting on the listening socket, or a closed LineConn when none is (does not block).
LineConn accept_connection(int listener);
// One attempt to connect; a closed LineConn when the host does not answer (yet). Throws ConfigError when the host
// name does not resolve.
LineConn try_connect(const Endpoint& endpoint);

// The message's words: at most max_words, the last taking the rest of the line.
std::vector<std::string> split_message(const std::string& line, size_t max_words);

}  // namespace tessera::dist::detail
