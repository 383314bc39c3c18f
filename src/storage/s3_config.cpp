// Where the S3 client's settings and credentials come from: the environment variables and the ~/.aws files that the
// AWS CLI and boto3 read, with the same precedence.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "tessera/storage/aws_files.h"
#include "tessera/storage/s3.h"
#include "tessera/util/error.h"

namespace tessera::storage {
namespace {

constexpr const char* kS3ConfigComponent = "s3";
using aws::env;

int positive_env(const char* name, int fallback) {
  const std::string v = env(name);
  if (v.empty()) return fallback;
  try {
    const int n = std::stoi(v);
    if (n > 0) return n;
  } catch (const std::exception&) {
  }
  throw ConfigError(kS3ConfigComponent, fmt::format("{}={}: expected a positive integer", name, v));
}

}  // namespace

namespace aws {
namespace {

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

std::string home_file(const char* variable, const char* fallback) {
  std::string path = env(variable);
  if (!path.empty()) return path;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/" + fallback;
}

}  // namespace

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string config_file() {
  return home_file("AWS_CONFIG_FILE", ".aws/config");
}

std::string credentials_file() {
  return home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
}

std::map<std::string, std::string> ini_section(const std::string& path, const std::string& section) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      inside = trim(line.substr(1, line.size() - 2)) == section;
      continue;
    }
    const size_t eq = line.find('=');
    if (!inside || indented || eq == std::string::npos) continue;
    out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

std::string profile_name() {
  std::string p = env("AWS_PROFILE");
  if (p.empty()) p = env("AWS_DEFAULT_PROFILE");
  return p.empty() ? "default" : p;
}

// ~/.aws/config names profiles "[profile NAME]" except "[default]".
std::map<std::string, std::string> config_profile(const std::string& name) {
  return ini_section(config_file(), name == "default" ? name : "profile " + name);
}

std::string region() {
  std::string r = env("AWS_REGION");
  if (r.empty()) r = env("AWS_DEFAULT_REGION");
  if (r.empty()) {
    const auto profile = config_profile(profile_name());
    if (profile.count("region")) r = profile.at("region");
  }
  return r.empty() ? "us-east-1" : r;
}

}  // namespace aws

S3Config S3Config::from_environment() {
  S3Config c;
  const auto profile = aws::config_profile(aws::profile_name());
  for (const char* name : {"S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    c.endpoint = env(name);
    if (!c.endpoint.empty()) break;
  }
  if (c.endpoint.empty() && profile.count("endpoint_url")) c.endpoint = profile.at("endpoint_url");
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  if (!c.endpoint.empty() && c.endpoint.rfind("http://", 0) != 0 && c.endpoint.rfind("https://", 0) != 0) {
    throw ConfigError(kS3ConfigComponent, fmt::format("endpoint {}: expected an http:// or https:// URL", c.endpoint));
  }
  c.region = aws::region();
  const std::string style = env("TESSERA_S3_ADDRESSING_STYLE");
  if (style == "path") {
    c.addressing = Addressing::kPath;
  } else if (style == "virtual") {
    c.addressing = Addressing::kVirtual;
  } else if (!style.empty() && style != "auto") {
    throw ConfigError(kS3ConfigComponent,
                      fmt::format("TESSERA_S3_ADDRESSING_STYLE={}: expected auto, path or virtual", style));
  }
  c.max_attempts = positive_env("TESSERA_S3_MAX_ATTEMPTS", c.max_attempts);
  c.part_size = static_cast<uint64_t>(positive_env("TESSERA_S3_PART_SIZE_MB", 8)) << 20;
  if (c.part_size < (5ULL << 20))
    throw ConfigError(kS3ConfigComponent, "TESSERA_S3_PART_SIZE_MB: S3's minimum part is 5 MB");
  c.multipart_threshold = c.part_size;
  c.parallelism = positive_env("TESSERA_S3_PARALLELISM", c.parallelism);
  c.stall_timeout_s = positive_env("TESSERA_S3_STALL_TIMEOUT_S", static_cast<int>(c.stall_timeout_s));
  std::string checksums = env("AWS_REQUEST_CHECKSUM_CALCULATION");
  for (char& ch : checksums) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (checksums == "when_required") {
    c.request_checksums = false;
  } else if (!checksums.empty() && checksums != "when_supported") {
    throw ConfigError(kS3ConfigComponent, fmt::format("AWS_REQUEST_CHECKSUM_CALCULATION={}: expected when_supported or "
                                                      "when_required",
                                                      checksums));
  }
  return c;
}

}  // namespace tessera::storage
