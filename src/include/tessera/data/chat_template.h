// Chat templates: Jinja templates as Hugging Face tokenizers carry them (tokenizer_config.json's `chat_template`),
// rendered the way transformers' apply_chat_template renders them: jinja2's ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, loop controls, the `generation` block, and the globals raise_exception, strftime_now
// and a Python-style tojson (ensure_ascii=False).
//
// The subset real chat templates use:
//   statements   if / elif / else, for (one or two targets, `if` filter, else, loop.index/index0/first/last/length/
//                revindex/revindex0/previtem/nextitem), set (a name, a namespace attribute, or several names), break,
//                continue, generation; comments; whitespace control (`-`, `+`)
//   expressions  literals (strings, numbers, true/false/none in either case, lists, tuples, dicts), names, `.attr`,
//                `[key]`, slices, calls, `|filter`, `is [not] test`, not/and/or, == != < <= > >= in, not in,
//                + - * / // % ** ~, unary -, `a if c else b`
//   filters      trim, tojson (indent, separators, sort_keys, ensure_ascii), length/count, string, upper, lower,
//                capitalize, title, default/d, first, last, join, replace, int, float, list, items, reverse, unique,
//                select/reject, selectattr/rejectattr, map(attribute=...), abs, round, safe, dictsort, indent
//   tests        defined, undefined, none, string, number, integer, float, boolean, true, false, mapping, iterable,
//                sequence, callable, equalto/eq/==, ne/!=, gt, ge, lt, le, in, odd, even, divisibleby, lower, upper
//   methods      str: strip, lstrip, rstrip, split, rsplit, startswith, endswith, upper, lower, title, capitalize,
//                replace, find, count, join, format (positional {}); dict: items, keys, values, get
//   globals      namespace, range, dict, raise_exception, strftime_now
// Values print as Python's str() prints them (True, None, ['a', 'b'], {'k': 1}); an undefined value prints as "".
// Tuples are lists here: a printed tuple (rare in templates) shows as [1, 2] where Python shows (1, 2).
// Anything outside the subset (macros, call blocks, includes, ...) is an error naming the template, line and
// construct, at parse time where possible.
// A template is untrusted data (it comes in a downloaded tokenizer_config.json), so a render is bounded and past a
// bound it is an error naming the template and line, never a hang or an exhausted machine: 1,000,000 statements and
// loop iterations, strings of 64 MiB (sizes are computed before anything is built, without wrapping around), lists of
// 100,000 items from range, + and *, values nested 512 deep, and 256 MiB of text and values built, copied or scanned
// by the whole render. Values are shared, not copied, when a name is looked up or a list item or dict value taken.
//
// The interpreter lives in src/data/chat_template/: value (Python semantics), lexer, parser, renderer, filters.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace tessera::data::chat_template {

namespace detail {
struct Program;
}

class Template {
 public:
  // Parses `source`. Errors (tessera::Error, component "jinja") read "{name}:{line}: {what}".
  Template(std::string_view source, std::string name = "template");
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (a JSON object, e.g. messages, bos_token, add_generation_prompt).
  // raise_exception(message) in the template throws tessera::Error "{name}: {message}"; other runtime errors (an
  // attribute of an undefined value, a type that an operator or filter does not take) name the line.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::string name_;
  std::unique_ptr<detail::Program> program_;
};

}  // namespace tessera::data::chat_template
