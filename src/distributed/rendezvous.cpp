// The elastic rendezvous's wire: endpoint parsing, a line-oriented TCP connection with a bounded line, and the
// listening sockets of the rendezvous (the elastic host's and the rank-0 store's), bound where their peers connect.
#include "rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tessera/util/error.h"

namespace tessera::dist::detail {
namespace {

// "ADDRESS:PORT" of a socket address, for messages.
std::string address_text(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  ::getnameinfo(a, len, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  return a->sa_family == AF_INET6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

std::string peer_of(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "an unknown peer";
  return address_text(reinterpret_cast<sockaddr*>(&a), len);
}

bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

// Binds and listens on `a`; the socket, or -1 with errno set.
int bind_listen(const sockaddr* a, socklen_t len) {
  const int fd = ::socket(a->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (a->sa_family == AF_INET6) {
    // Every interface (::) takes IPv4 peers too; a specific address is the one family anyway.
    const int zero = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (::bind(fd, a, len) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                 : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

}  // namespace

Endpoint parse_endpoint(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw ConfigError("launch", fmt::format("--rdzv-endpoint '{}' is not HOST:PORT", text));
  }
  Endpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
  const std::string port = text.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    throw ConfigError("launch", fmt::format("--rdzv-endpoint '{}': '{}' is not a TCP port", text, port));
  }
  e.port = std::stoi(port);
  return e;
}

LineConn::LineConn(int fd) : fd_(fd) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

LineConn::~LineConn() {
  close();
}

LineConn::LineConn(LineConn&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), pending_(std::move(other.pending_)) {}

LineConn& LineConn::operator=(LineConn&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    pending_ = std::move(other.pending_);
  }
  return *this;
}

void LineConn::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool LineConn::send(const std::string& line) {
  if (fd_ < 0) return false;
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    if (n <= 0) {
      close();
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

bool LineConn::receive(std::vector<std::string>& lines, int timeout_ms) {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return true;
  bool eof = false;
  char buf[4096];
  // At most about kMaxLineBytes a call: what a fast peer sends beyond waits in the kernel for the next call.
  for (size_t got = 0; got <= kMaxLineBytes;) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);  // a reset ends the connection just the same
    break;
  }
  size_t start = 0;
  bool too_long = false;
  for (size_t nl = pending_.find('\n'); nl != std::string::npos && !too_long; nl = pending_.find('\n', start)) {
    too_long = nl - start > kMaxLineBytes;
    if (!too_long) lines.push_back(pending_.substr(start, nl - start));
    start = nl + 1;
  }
  pending_.erase(0, start);
  if (too_long || pending_.size() > kMaxLineBytes) {
    spdlog::error("[launch] rendezvous: {} sent a line longer than {} bytes; closing its connection", peer_of(fd_),
                  kMaxLineBytes);
    pending_.clear();
    eof = true;
  }
  if (eof) close();
  return !eof;
}

Listener listen_at(const std::string& host, int port, const std::string& what, bool other_nodes,
                   const std::string& component) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    throw Error(component,
                fmt::format("{} at {}:{}: cannot resolve '{}': {}", what, host, port, host, ::gai_strerror(rc)));
  }
  // A host name that this machine resolves to loopback while other machines resolve it to this one's address (Debian's
  // 127.0.1.1 for the host's own name): loopback would shut the other nodes out. A literal 127.0.0.1, ::1 or
  // localhost means loopback.
  in6_addr numeric{};
  const bool literal = host == "localhost" || ::inet_pton(AF_INET, host.c_str(), &numeric) == 1 ||
                       ::inet_pton(AF_INET6, host.c_str(), &numeric) == 1;
  int fd = -1;
  int error = EADDRNOTAVAIL;  // the first failure that is not "no such address here"
  std::string loopback;       // a loopback address that the name `host` resolved to, when other nodes connect to it
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    if (other_nodes && !literal && is_loopback(ai->ai_addr)) {
      loopback = address_text(ai->ai_addr, ai->ai_addrlen);
      continue;
    }
    fd = bind_listen(ai->ai_addr, ai->ai_addrlen);
    if (fd < 0 && errno != EADDRNOTAVAIL && error == EADDRNOTAVAIL) error = errno;
  }
  ::freeaddrinfo(found);
  if (fd < 0 && error != EADDRNOTAVAIL) {
    throw Error(component, fmt::format("{}: cannot listen at {}:{}: {}", what, host, port, std::strerror(error)));
  }
  if (fd < 0) {
    // Peers are told `host` but it is not an address here: listen where any of this machine's addresses is reached.
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(static_cast<uint16_t>(port));
    fd = bind_listen(reinterpret_cast<sockaddr*>(&any6), sizeof(any6));
    if (fd < 0 && (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL)) {  // a machine without IPv6
      sockaddr_in any4{};
      any4.sin_family = AF_INET;
      any4.sin_addr.s_addr = htonl(INADDR_ANY);
      any4.sin_port = htons(static_cast<uint16_t>(port));
      fd = bind_listen(reinterpret_cast<sockaddr*>(&any4), sizeof(any4));
    }
    if (fd < 0) {
      throw Error(component, fmt::format("{}: cannot listen on port {}: {}", what, port, std::strerror(errno)));
    }
    spdlog::warn("[{}] {}: {} {}; listening on every interface of this machine (port {})", component, what, host,
                 loopback.empty() ? "is not an address of this machine"
                                  : fmt::format("resolves to the loopback address {} here, but other nodes connect "
                                                "to it",
                                                loopback),
                 bound_port(fd));
  }
  return Listener{fd, bound_port(fd)};
}

int listen_on(const Endpoint& endpoint, bool other_nodes) {
  const Listener l = listen_at(endpoint.host, endpoint.port,
                               fmt::format("the rendezvous (--rdzv-endpoint {}:{})", endpoint.host, endpoint.port),
                               other_nodes, "launch");
  ::fcntl(l.fd, F_SETFL, ::fcntl(l.fd, F_GETFL) | O_NONBLOCK);
  return l.fd;
}

LineConn accept_connection(int listener) {
  const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  return fd < 0 ? LineConn() : LineConn(fd);
}

LineConn try_connect(const Endpoint& endpoint) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (const int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    throw ConfigError("launch", fmt::format("--rdzv-endpoint {}:{}: cannot resolve '{}': {}", endpoint.host,
                                            endpoint.port, endpoint.host, ::gai_strerror(rc)));
  }
  LineConn conn;
  for (addrinfo* ai = found; ai != nullptr && !conn.is_open(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      conn = LineConn(fd);
    } else {
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return conn;
}

std::vector<std::string> split_message(const std::string& line, size_t max_words) {
  std::vector<std::string> words;
  size_t start = 0;
  while (start <= line.size() && words.size() + 1 < max_words) {
    const size_t space = line.find(' ', start);
    if (space == std::string::npos) break;
    words.push_back(line.substr(start, space - start));
    start = space + 1;
  }
  if (start <= line.size()) words.push_back(line.substr(start));
  return words;
}

}  // namespace tessera::dist::detail
