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
// A closed connection means the other side is gone: an agent's node is lost, or the job is (the host's).
#pragma once

#include <string>
#include <vector>

namespace tessera::dist::detail {

// "HOST:PORT" (HOST may be a name, an IPv4 address or a bracketed IPv6 address). Throws ConfigError naming the value.
struct Endpoint {
  std::string host;
  int port = 0;
};
Endpoint parse_endpoint(const std::string& text);

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
  // Waits up to timeout_ms for data, then appends the complete lines received to `lines`. Returns false, and closes,
  // once the peer has closed the connection (after the lines it sent before).
  bool receive(std::vector<std::string>& lines, int timeout_ms);
  void close();

 private:
  int fd_ = -1;
  std::string pending_;
};

// Listens on the endpoint's port (every address; SO_REUSEADDR). Throws Error naming the endpoint.
int listen_on(const Endpoint& endpoint);
// A connection waiting on the listening socket, or a closed LineConn when none is (does not block).
LineConn accept_connection(int listener);
// One attempt to connect; a closed LineConn when the host does not answer (yet). Throws ConfigError when the host
// name does not resolve.
LineConn try_connect(const Endpoint& endpoint);

// The message's words: at most max_words, the last taking the rest of the line.
std::vector<std::string> split_message(const std::string& line, size_t max_words);

}  // namespace tessera::dist::detail
