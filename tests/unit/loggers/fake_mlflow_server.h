// A stand-in for an MLflow tracking server on loopback, for tests of what the `mlflow` logger sends: it answers the
// REST calls the logger makes (experiments/get-by-name, runs/create, runs/log-batch, runs/get, runs/update, artifact
// PUTs, the model registry) with fixed answers and records every request. One thread; one request per connection (the
// client opens a connection per request). tests/compat/test_mlflow.py tests against the real server.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::testing {

class FakeMlflowServer {
 public:
  struct Request {
    std::string method;
    std::string target;         // path and query
    std::string authorization;  // the Authorization header, if any
    std::string body;
  };

  // `artifact_uri`: what runs/get says the run's artifact location is.
  explicit FakeMlflowServer(std::string artifact_uri = "mlflow-artifacts:/1/run1/artifacts")
      : artifact_uri_(std::move(artifact_uri)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("fake mlflow server: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeMlflowServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  FakeMlflowServer(const FakeMlflowServer&) = delete;
  FakeMlflowServer& operator=(const FakeMlflowServer&) = delete;

  int port() const { return port_; }
  std::vector<Request> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      handle(c);
      ::close(c);
    }
  }

  static std::string lower(std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  }

  void handle(int c) {
    std::string data;
    size_t header_end = std::string::npos;
    size_t length = 0;
    char buf[65536];
    while (true) {
      if (header_end != std::string::npos && data.size() >= header_end + 4 + length) break;
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) return;
      const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (n <= 0) return;
      data.append(buf, static_cast<size_t>(n));
      if (header_end == std::string::npos && (header_end = data.find("\r\n\r\n")) != std::string::npos) {
        const std::string head = lower(data.substr(0, header_end));
        const std::string kLength = "\r\ncontent-length:";
        if (const size_t at = head.find(kLength); at != std::string::npos)
          length = std::stoul(head.substr(at + kLength.size()));
      }
    }
    Request r;
    const std::string head = data.substr(0, header_end);
    const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
    r.method = head.substr(0, sp1);
    r.target = head.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string kAuthorization = "\r\nauthorization:";
    if (const size_t at = lower(head).find(kAuthorization); at != std::string::npos) {
      const size_t from = at + kAuthorization.size();
      const size_t end = head.find("\r\n", from);
      r.authorization = head.substr(from, end == std::string::npos ? std::string::npos : end - from);
      while (!r.authorization.empty() && r.authorization.front() == ' ') r.authorization.erase(0, 1);
    }
    r.body = data.substr(header_end + 4, length);
    int status = 200;
    nlohmann::json answer = nlohmann::json::object();
    if (r.target.find("experiments/get-by-name") != std::string::npos) {
      answer = {{"experiment", {{"experiment_id", "1"}}}};
    } else if (r.target.find("runs/create") != std::string::npos) {
      answer = {{"run", {{"info", {{"run_id", "run1"}}}}}};
    } else if (r.target.find("runs/get") != std::string::npos) {
      answer = {
          {"run",
           {{"info", {{"run_id", "run1"}, {"artifact_uri", artifact_uri_}}}, {"data", nlohmann::json::object()}}}};
    } else if (r.target.find("registered-models/get") != std::string::npos) {
      status = 404;
      answer = {{"error_code", "RESOURCE_DOES_NOT_EXIST"}, {"message", "no such model"}};
    } else if (r.target.find("model-versions/create") != std::string::npos) {
      answer = {{"model_version", {{"version", "1"}}}};
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(std::move(r));
    }
    const std::string body = answer.dump();
    const std::string response =
        "HTTP/1.1 " + std::to_string(status) + (status == 200 ? " OK" : " Not Found") +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n\r\n" + body;
    size_t sent = 0;
    while (sent < response.size()) {
      const ssize_t n = ::send(c, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  std::string artifact_uri_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<Request> requests_;
};

}  // namespace tessera::testing
