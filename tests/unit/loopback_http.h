// A small HTTP/1.1 server on 127.0.0.1 for the unit tests of Tessera's HTTP clients (S3, credentials endpoints,
// MLflow): each test says what to answer with a handler, then looks at what the client sent.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tessera::testing {

// Listens on a free port of 127.0.0.1 from construction to destruction and serves on one thread, one request per
// connection ("Connection: close"; Tessera's clients open one per request), each answered by the handler. The body is
// read by Content-Length (no chunked encoding); HEAD answers leave the body out but keep its Content-Length. The
// handler runs on the server's thread, one request at a time; a handler that throws answers 500 with what() as the
// body. requests() may be called from any thread. The destructor stops the thread and waits for it.
class LoopbackHttpServer {
 public:
  struct Request {
    std::string line;                            // the request line, e.g. "GET /bucket/key?x=1 HTTP/1.1"
    std::string method;                          // "GET"
    std::string target;                          // path and query: "/bucket/key?x=1"
    std::map<std::string, std::string> headers;  // by lower-case name, values without surrounding blanks
    std::string body;

    // The value of header `name` (any case), or "" when the request has none.
    std::string header(const std::string& name) const {
      const auto it = headers.find(lower(name));
      return it == headers.end() ? "" : it->second;
    }
  };
  struct Response {
    int status = 200;
    std::string content_type = "application/json";  // "" sends no Content-Type
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;  // extra headers, e.g. {"ETag", "\"e\""}
  };
  using Handler = std::function<Response(const Request&)>;

  explicit LoopbackHttpServer(Handler handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("LoopbackHttpServer: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~LoopbackHttpServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  LoopbackHttpServer(const LoopbackHttpServer&) = delete;
  LoopbackHttpServer& operator=(const LoopbackHttpServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Every request so far, in the order they came.
  std::vector<Request> requests() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }
  // Their request lines.
  std::vector<std::string> request_lines() const {
    std::vector<std::string> lines;
    for (const Request& r : requests()) lines.push_back(r.line);
    return lines;
  }

 private:
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static bool send_all(int c, const std::string& data) {
    for (size_t sent = 0; sent < data.size();) {
      const ssize_t n = ::send(c, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      handle(c);
      ::close(c);
    }
  }

  // Reads one request from connection `c` and answers it; a client that stops sending for 10 s gets no answer.
  void handle(int c) {
    std::string in;
    char buf[65536];
    const auto receive = [&] {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) return false;
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n > 0) in.append(buf, static_cast<size_t>(n));
      return n > 0;
    };
    size_t head_end = std::string::npos;
    while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
      if (!receive()) return;
    }
    Request r;
    size_t at = in.find("\r\n");
    r.line = in.substr(0, at);
    const size_t sp1 = r.line.find(' '), sp2 = r.line.find(' ', sp1 + 1);
    r.method = r.line.substr(0, sp1);
    r.target = sp1 == std::string::npos ? "" : r.line.substr(sp1 + 1, sp2 - sp1 - 1);
    while (at < head_end) {
      const size_t from = at + 2, end = in.find("\r\n", from), colon = in.find(':', from);
      at = end;
      if (colon >= end) continue;
      std::string value = in.substr(colon + 1, end - colon - 1);
      value.erase(0, value.find_first_not_of(" \t"));
      value.erase(value.find_last_not_of(" \t") + 1);
      r.headers[lower(in.substr(from, colon - from))] = value;
    }
    if (lower(r.header("expect")) == "100-continue" && !send_all(c, "HTTP/1.1 100 Continue\r\n\r\n")) return;
    const size_t length = std::strtoul(r.header("content-length").c_str(), nullptr, 10);
    while (in.size() < head_end + 4 + length) {
      if (!receive()) return;
    }
    r.body = in.substr(head_end + 4, length);
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      requests_.push_back(r);
    }
    Response a;
    try {
      a = handler_(r);
    } catch (const std::exception& e) {
      a = {500, "text/plain", e.what(), {}};
    }
    std::string out = "HTTP/1.1 " + std::to_string(a.status) +
                      " Test\r\nContent-Length: " + std::to_string(a.body.size()) + "\r\nConnection: close\r\n";
    if (!a.content_type.empty()) out += "Content-Type: " + a.content_type + "\r\n";
    for (const auto& [name, value] : a.headers) out += name + ": " + value + "\r\n";
    out += "\r\n";
    if (r.method != "HEAD") out += a.body;
    send_all(c, out);
  }

  Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<Request> requests_;
};

}  // namespace tessera::testing
