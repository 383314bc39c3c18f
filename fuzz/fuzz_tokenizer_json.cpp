// libFuzzer target: Tokenizer::from_json on arbitrary bytes, then encode/decode with whatever loaded. Any exception
// other than tessera::Error, any crash or sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessera/data/tokenizer.h"
#include "tessera/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = tessera::data::Tokenizer::from_json(input, "fuzz.json");
    const auto ids = tok.encode("Hello, world! 😀 <|endoftext|> \xff 12345  \n\n x");
    tok.decode(ids, false);
    tok.decode({0, 1, 2, 3, 255, 1000, -1}, true);
  } catch (const tessera::Error&) {
  }
  return 0;
}
