// Network probes for the rendezvous tests: this machine's non-loopback addresses, whether a TCP port accepts a
// connection there, and what /proc/net/tcp says a listening socket is bound to.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::testing {

// This machine's addresses other than loopback, as numeric text: IPv4, and IPv6 outside link-local (which needs a
// scope to connect to). Empty on a machine with loopback only.
inline std::vector<std::string> non_loopback_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[NI_MAXHOST] = "";
    if (i->ifa_addr->sa_family == AF_INET) {
      const in_addr a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
      if ((ntohl(a.s_addr) >> 24) == 127) continue;
      ::inet_ntop(AF_INET, &a, text, sizeof(text));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a) || IN6_IS_ADDR_LOOPBACK(&a)) continue;
      ::inet_ntop(AF_INET6, &a, text, sizeof(text));
    } else {
      continue;
    }
    out.emplace_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

// A connected TCP socket to host:port (numeric host), or -1 when the connection is refused or not made within 2 s.
inline int connect_to(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  bool ok = false;
  if (fd >= 0) {
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof(error);
      ok = ::poll(&p, 1, 2000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
  }
  ::freeaddrinfo(found);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

inline bool connects(const std::string& host, int port) {
  const int fd = connect_to(host, port);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

// The local addresses of the sockets listening on `port`, as /proc/net/tcp and tcp6 spell them in `table` (their
// text): "0100007F" is 127.0.0.1, "00000000" every IPv4 interface, 32 zeros every interface.
inline std::vector<std::string> listening_addresses(const std::string& table, int port) {
  std::vector<std::string> out;
  char want[8];
  std::snprintf(want, sizeof(want), "%04X", port);
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string slot, local, remote, state;
    if (!(words >> slot >> local >> remote >> state) || state != "0A") continue;  // 0A: LISTEN
    const size_t colon = local.find(':');
    if (colon != std::string::npos && local.substr(colon + 1) == want) out.push_back(local.substr(0, colon));
  }
  return out;
}

}  // namespace tessera::testing
