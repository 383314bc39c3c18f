// libFuzzer target: the recipe loader's own layer on arbitrary bytes as a recipe file: YAML into config::Value (with
// origins and duplicate-key checks), a command-line override, OmegaConf-style ${...} interpolation, then typed reads
// of every key through config::Section (int, double, bool, string, duration, lists) and the JSON view. The component
// schemas above it only read through Section. Anything but tessera::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessera/config/reader.h"
#include "tessera/config/time.h"
#include "tessera/config/value.h"
#include "tessera/util/error.h"

#include <nlohmann/json.hpp>

namespace {

using tessera::config::Section;
using tessera::config::Value;

// Reads each key of `s` every way a component parser might, recursing into mappings. Each read may throw
// ConfigError (a wrong type); that is the expected outcome, so each is tried on its own.
void read_all(Section& s, int depth) {
  for (const auto& key : s.keys()) {
    auto attempt = [&](auto&& read) {
      try {
        read();
      } catch (const tessera::Error&) {
      }
    };
    attempt([&] { (void)s.get_optional_int(key); });
    attempt([&] { (void)s.get_optional_double(key); });
    attempt([&] { (void)s.get_bool(key, false); });
    attempt([&] { (void)s.get_optional_string(key); });
    attempt([&] { (void)s.get_time(key, tessera::config::Time::batches(1)); });
    attempt([&] { (void)s.get_doubles(key, {}); });
    attempt([&] { (void)s.get_strings(key, {}); });
    attempt([&] { (void)s.get_choice(key, "a", {"a", "b"}); });
    if (depth < 8) {
      attempt([&] {
        auto sub = s.section(key);
        read_all(sub, depth + 1);
      });
    }
  }
  try {
    s.finish({"known_but_unsupported"});
  } catch (const tessera::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    Value root = tessera::config::parse_yaml(text, {.file = "fuzz.yaml"});
    try {
      tessera::config::apply_override(root, "optimizer.betas.1=0.95");
    } catch (const tessera::Error&) {
    }
    tessera::config::resolve_interpolations(root);
    (void)root.to_json().dump();
    (void)root.brief();
    tessera::config::ParseContext ctx("fuzz.yaml");
    Section top(&root, "", ctx);
    read_all(top, 0);
    try {
      ctx.throw_if_unsupported();
    } catch (const tessera::Error&) {
    }
  } catch (const tessera::Error&) {
  }
  return 0;
}
