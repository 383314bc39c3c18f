// The elastic rendezvous's wire: endpoint parsing and a line-oriented TCP connection.
#include "rendezvous.h"

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

#include "tessera/util/error.h"

namespace tessera::dist::detail {

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
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);  // a reset ends the connection just the same
    break;
  }
  size_t start = 0;
  for (size_t nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n', start)) {
    lines.push_back(pending_.substr(start, nl - start));
    start = nl + 1;
  }
  pending_.erase(0, start);
  if (eof) close();
  return !eof;
}

int listen_on(const Endpoint& endpoint) {
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw Error("launch", fmt::format("rendezvous on port {}: socket: {}", endpoint.port, std::strerror(errno)));
  const int one = 1, zero = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 peers too
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  a.sin6_port = htons(static_cast<uint16_t>(endpoint.port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 64) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error("launch", fmt::format("cannot run the rendezvous on port {} (--rdzv-endpoint {}:{}): {}", endpoint.port,
                                      endpoint.host, endpoint.port, std::strerror(e)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
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
