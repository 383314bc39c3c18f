// Exceptions shared by every Tessera layer, and the exit codes the command-line tools map them to.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

// Exit codes of the tools: success, runtime failure, usage or configuration error.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntimeError = 1;
inline constexpr int kExitUsageError = 2;

// Base class of Tessera's exceptions. what() reads "[component] message", e.g.
// "[recipe] recipes/x.yaml:12: optimizer.lr: expected a number, got \"fast\"".
class Error : public std::runtime_error {
 public:
  Error(std::string component, const std::string& message);
  const std::string& component() const { return component_; }
  // The message without the "[component] " prefix.
  const std::string& message() const { return message_; }
  virtual int exit_code() const { return kExitRuntimeError; }

 private:
  std::string component_;
  std::string message_;
};

// An error in what the user asked for (a recipe, a command-line flag): the tools exit with kExitUsageError.
class ConfigError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitUsageError; }
};

}  // namespace tessera
