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
                .find("the template built, copied or scanned more than"),  // before the 64 MiB string
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a\nb' | indent(100000) }}").find("indent width 100000 is larger than the limit"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [1] | tojson(indent=5000) }}").find("indent width 5000"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' | replace }}").find("replace takes the old and the new string"), std::string::npos);
  EXPECT_NE(error_of("{{ [1] | tojson(separators=[1, 2]) }}").find("a pair of strings"), std::string::npos);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ChatTemplate, RepetitionWithHugeOrEmptyOperandsIsSizedBeforeItRuns) {
  // Python's semantics where they are cheap: an empty string or list, or a count <= 0, repeats to empty at once
  // (`"" * 2**62` used to loop 2**62 times); a size past the limits (or past 2**64, where it used to wrap around to
  // a small number) is refused before anything is built.
  EXPECT_EQ(render("{{ '' * 4611686018427387904 }}|{{ 4611686018427387904 * '' }}|{{ 'ab' * -3 }}|{{ 'ab' * 3 }}"),
            "|||ababab");
  EXPECT_EQ(render("{{ [] * 4611686018427387904 }} {{ [1, 2] * 2 }} {{ 2 * ['x'] }} {{ [1] * 0 }}"),
            "[] [1, 2, 1, 2] ['x', 'x'] []");
  for (const char* src : {"{{ 'ab' * 4611686018427387904 }}", "{{ 4611686018427387904 * 'abcd' }}",
                          "{{ 'ab' * 9223372036854775807 }}", "{{ 'x' * 67108865 }}"}) {
    const std::string err = error_of(src);
    EXPECT_TRUE(has(err, "[jinja] t.jinja:1: string too long: the result would be longer than the limit of 67108864"))
        << src << ": " << err;
  }
  for (const char* src :
       {"{{ [1] * 4611686018427387904 }}", "{{ [1, 2, 3] * 6148914691236517206 }}", "{{ range(1000) * 101 }}"}) {
    EXPECT_TRUE(has(error_of(src), "t.jinja:1: list too long: the result would have more than 100000 items")) << src;
  }
}

TEST(ChatTemplate, RangeCountsItemsWithoutOverflow) {
  EXPECT_EQ(render("{{ range(0, -5, -2)|list }} {{ range(5, 0)|list }} {{ range(3)|list }}"),
            "[0, -2, -4] [] [0, 1, 2]");
  // The last index is near INT64_MAX: stepping past it must end the range, not wrap around.
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 5)|list }}"),
            "[9223372036854775800, 9223372036854775805]");
  EXPECT_EQ(render("{{ range(-9223372036854775807 - 1, 9223372036854775807, 9223372036854775807)|list }}"),
            "[-9223372036854775808, -1, 9223372036854775806]");
  for (const char* src :
       {"{{ range(-9223372036854775807 - 1, 9223372036854775807)|length }}",
        "{{ range(9223372036854775807, -9223372036854775807 - 1, -1)|length }}", "{{ range(100001) }}"}) {
    EXPECT_TRUE(has(error_of(src), "has more items than the limit of 100000")) << src;
  }
}

TEST(ChatTemplate, FiltersThatBuildTextCheckTheSizeFirst) {
  // Each would build gigabytes (or wrap a size around): refused at the limit, naming the template and line. `x` (in
  // the context, looked up without a copy) is just over half the 64 MiB limit.
  const Json ctx = {{"x", std::string(33600000, 'a')}};
  for (const char* src :
       {"{{ ('a' * 1000000).replace('', 'b' * 1000) }}", "{{ ('a' * 1000)|replace('a', 'b' * 100000) }}",
        "{{ range(100000)|join('s' * 1000) }}", "{{ ('\n' * 100000)|indent(1000, blank=true) }}",
        "{{ '{}{}'.format(x, x) }}", "{{ x ~ x }}", "{{ x + x }}", "{{ [x, x] }}", "{{ ''.join([x, x]) }}",
        "{{ range(1000)|tojson(separators=[',' * 100000, ':']) }}"}) {
    const std::string err = error_of(src, ctx);
    EXPECT_TRUE(has(err, "[jinja] t.jinja:1: string too long")) << src << ": " << err;
  }
  EXPECT_EQ(render("{{ 'abc'.replace('', '-') }} {{ 'aXbX'|replace('X', '--') }} {{ 'a\n\nb'|indent(2) }}"),
            "-a-b-c- a--b-- a\n\n  b");
  EXPECT_EQ(render("{{ [1, 2]|tojson(indent=-1) }}"), "[\n1,\n2\n]");  // Python: " " * -1 is ""
}

TEST(ChatTemplate, RepeatedWorkCountsAgainstTheRenderNotJustTheStatements) {
  // Under the statement limit, each iteration builds 32 MB: the render stops at its budget, not after 32 GB.
  EXPECT_TRUE(has(error_of("{% for i in range(1000) %}{% set x = 'ab' * 16000000 %}{% endfor %}"),
                  "t.jinja:1: the template built, copied or scanned more than 268435456 bytes"));
  // Comparing two 33 MB strings costs little memory but the time of a scan: counted the same way.
  EXPECT_TRUE(has(error_of("{% for i in range(100000) %}{% if x == x %}{% endif %}{% endfor %}",
                           {{"x", std::string(33600000, 'a')}}),
                  "t.jinja:1: the template built, copied or scanned more than 268435456 bytes"));
  // An empty string repeated 2**62 times, a thousand times over: no loop of 2**62 steps.
  EXPECT_EQ(render("{% for i in range(1000) %}{{ '' * 4611686018427387904 }}{% endfor %}done"), "done");
  // Looking a large value up copies nothing (each of these 60000 lookups used to copy 30 MB).
  EXPECT_EQ(render("{% set x = 'a' * 30000000 %}{% set l = [x] %}{% for i in range(30) %}{% for j in range(1000) %}"
                   "{% if x and l %}{% endif %}{% endfor %}{% endfor %}done"),
            "done");
  // A list nested by a loop, one level an iteration: refused at the depth printing and copying can take.
  EXPECT_TRUE(has(error_of("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}"
                           "{% endfor %}"),
                  "a value nested more than 512 levels deep"));
}

TEST(ChatTemplate, IntegerEdgesAreErrorsOrPythonsAnswers) {
  EXPECT_TRUE(has(error_of("{{ (-9223372036854775807 - 1)|abs }}"), "t.jinja:1: integer overflow"));
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}"), "True");
  // Slice steps that would carry an index past INT64_MAX.
  EXPECT_EQ(render("{{ 'abc'[1::9223372036854775807] }} {{ [1, 2, 3][2::9223372036854775807] }} "
                   "{{ 'abc'[::-9223372036854775807 - 1] }} {{ 'abc'[-9223372036854775807 - 1:] }}"),
            "b [3] c abc");
}

}  // namespace
}  // namespace tessera::data::chat_template
