// data/chat_template: the whitespace rules and semantics chat templates depend on (tests/compat/test_chat_templates.py
// compares whole templates with transformers' apply_chat_template), and errors naming the template and line.
#include "tessera/data/chat_template.h"

#include <gtest/gtest.h>

#include <string>

#include "tessera/util/error.h"

namespace tessera::data::chat_template {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& source, const Json& context = Json::object()) {
  return Template(source, "t.jinja").render(context);
}

std::string error_of(const std::string& source, const Json& context = Json::object()) {
  try {
    render(source, context);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ChatTemplate, WhitespaceFollowsTrimAndLstripBlocks) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before one; `-` strips all
  // whitespace on its side, `+` keeps the indentation; one trailing newline of the template is dropped.
  EXPECT_EQ(render("{% if true %}\n  x\n{% endif %}\n"), "  x\n");
  EXPECT_EQ(render("a\n    {% if true %}b{% endif %}\nc"), "a\nbc");
  EXPECT_EQ(render("a  \n  {%- if true -%}  \n b {%- endif %}"), "ab");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(render("{{ 'x' }}\n{{ 'y' }}\n"), "x\ny");
  EXPECT_EQ(render("{# c #}\n  {# d #}\nz"), "z");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(ChatTemplate, ValuesPrintAsPythonAndNamespacesCarryAcrossLoops) {
  const Json ctx = {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}}})}};
  EXPECT_EQ(render("{{ true }} {{ none }} {{ [1, 'a', none] }} {{ {'k': 1.0} }} {{ undefined }}|"),
            "True None [1, 'a', None] {'k': 1.0} |");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set local = 1 %}"
                   "{% endfor %}{{ ns.n }}{{ local is defined }}",
                   ctx),
            "2False");
  EXPECT_EQ(
      render("{% for m in messages %}{{ m.content is defined }}{{ m['content'] | default('-') }}{% endfor %}", ctx),
      "TruehiFalse-");
  EXPECT_EQ(render("{{ messages[0].content ~ 1 }}{{ 7 // -2 }}{{ -7 % 3 }}{{ 1 / 4 }}", ctx), "hi1-420.25");
  EXPECT_EQ(render("{{ {'b': [1, {'c': 'é'}]} | tojson }}"), "{\"b\": [1, {\"c\": \"é\"}]}");
}

TEST(ChatTemplate, ErrorsNameTheTemplateAndLine) {
  EXPECT_NE(error_of("ok\n{{ raise_exception('Roles must alternate') }}").find("[jinja] t.jinja: Roles must alternate"),
            std::string::npos);
  EXPECT_NE(error_of("a\nb\n{% macro f() %}{% endmacro %}").find("t.jinja:3: unsupported tag 'macro'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ x.y }}").find("t.jinja:1: 'x' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand types for +: 'str' and 'int'"), std::string::npos);
  EXPECT_NE(error_of("{% for x in y %}").find("expected 'endfor'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unclosed '{{'"), std::string::npos);
  EXPECT_NE(error_of("{{ [1] | frob }}").find("unknown filter 'frob'"), std::string::npos);
  EXPECT_NE(error_of("{% set x = [] %}{{ x.append(1) }}").find("immutable"), std::string::npos);
}

TEST(ChatTemplate, HostileTemplatesHitLimitsNotTheMachine) {
  // A tokenizer_config.json is downloaded data: nested loops, doubling strings and huge indents end in an error.
  EXPECT_NE(error_of("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(10) %}"
                     "{% endfor %}{% endfor %}{% endfor %}")
                .find("t.jinja:1: the template ran more than 1000000 statements"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}")
                .find("string too long"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a\nb' | indent(100000) }}").find("indent width 100000 is larger than the limit"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [1] | tojson(indent=5000) }}").find("indent width 5000"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' | replace }}").find("replace takes the old and the new string"), std::string::npos);
  EXPECT_NE(error_of("{{ [1] | tojson(separators=[1, 2]) }}").find("a pair of strings"), std::string::npos);
}

}  // namespace
}  // namespace tessera::data::chat_template
