// libFuzzer target: data::chat_template::Template on arbitrary bytes as a chat template, rendered with a conversation
// that has system, user, assistant and tool messages. Any exception other than tessera::Error, any crash or sanitizer
// report is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/data/chat_template.h"
#include "tessera/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi 😀"},
                 {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                 {"role": "tool", "content": "{\"y\": 2.5}"}, {"role": "assistant", "content": "Done."}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  try {
    const tessera::data::chat_template::Template tpl(std::string_view(reinterpret_cast<const char*>(data), size),
                                                     "fuzz");
    tpl.render(context);
  } catch (const tessera::Error&) {
  }
  return 0;
}
