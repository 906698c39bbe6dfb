// ChatTemplate's refusals and bounds: a template is untrusted input (it comes in the
// model file), so a bad one is named by its line, and one that would run long, print
// without end or recurse without end stops with an error instead. What a good template
// prints is checked against Python's jinja2 (test_chat_template.py).
#include "serve/chat_template.h"

#include <gtest/gtest.h>

#include <string>

namespace npurt::serve {
namespace {

using nlohmann::ordered_json;

std::string error_of(const std::string& source, const ordered_json& variables = ordered_json::object()) {
  StatusOr<ChatTemplate> t = ChatTemplate::parse(source);
  if (!t.ok()) return t.status().message();
  StatusOr<std::string> text = t->render(variables);
  return text.ok() ? "" : text.status().message();
}

TEST(ChatTemplateTest, SyntaxErrorsNameTheirLine) {
  EXPECT_EQ(error_of("a\nb\n{% if x %}never closed"), "chat template, line 3: this 'if' is never closed by 'endif'");
  EXPECT_EQ(error_of("{{ 'ok' }}\n{{ x | }}"), "chat template, line 2: expected a name, found '}}'");
  EXPECT_EQ(error_of("\n\n\n{% macro m() %}{% call m() %}{% endcall %}{% endmacro %}"),
            "chat template, line 4: the tag 'call' is not supported");
  EXPECT_EQ(error_of("{% endfor %}"), "chat template, line 1: the tag 'endfor' is not supported here (no block is "
                                      "open that it closes)");
  EXPECT_EQ(error_of("x {# open"), "chat template, line 1: a comment ({#) is never closed");
  EXPECT_EQ(error_of("{{ x.99999999999999999999 }}"), "chat template, line 1: the index 99999999999999999999 is too large");
}

TEST(ChatTemplateTest, RenderErrorsNameTheirLineAndTheTemplateStaysUsable) {
  StatusOr<ChatTemplate> t = ChatTemplate::parse(
      "{% for m in messages %}\n{% if m.role != 'user' %}{{ raise_exception('only users: ' ~ m.role) }}{% endif %}"
      "{{ m.content }}\n{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  StatusOr<std::string> bad = t->render({{"messages", {{{"role", "robot"}, {"content", "x"}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "chat template, line 2: only users: robot");
  StatusOr<std::string> good = t->render({{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_EQ(*good, "hi\n");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "chat template, line 1: integer division or modulo by zero");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "chat template, line 1: integer overflow in '+'");
  EXPECT_EQ(error_of("{{ nothing.attr }}"), "chat template, line 1: 'attr' of an undefined value");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"), "chat template, line 1: unsupported operand types for +: int and str");
}

TEST(ChatTemplateTest, RunawayTemplatesStopWithAnError) {
  const std::string steps = error_of("{% for i in range(40000) %}{% for j in range(40000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(steps.find("more than 1000000 steps"), std::string::npos) << steps;
  const std::string output = error_of("{% for i in range(40000) %}{{ 'x' * 1000 }}{% endfor %}");
  EXPECT_NE(output.find("the output passes 4194304 bytes"), std::string::npos) << output;
  const std::string repeat = error_of("{{ 'x' * 100000000000 }}");
  EXPECT_NE(repeat.find("a repetition past"), std::string::npos) << repeat;
  const std::string recursion = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(recursion.find("macro calls nested more than 64 deep"), std::string::npos) << recursion;
  const std::string nesting = error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}");
  EXPECT_NE(nesting.find("nested more than 200 deep"), std::string::npos) << nesting;
  // Macros multiply how deep an evaluation goes: a chain of 200 additions per call.
  std::string adds;
  for (int i = 0; i < 200; ++i) adds += " + 1";
  const std::string deep =
      error_of("{% macro m(n) %}{% if n > 0 %}{{ (m(n - 1) | length)" + adds + " }}{% endif %}{% endmacro %}{{ m(64) }}");
  EXPECT_NE(deep.find("evaluation nested more than 400 deep"), std::string::npos) << deep;
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_NE(error_of(chain + " }}").find("a tag of more than 1000 tokens"), std::string::npos);
  const std::string blocks = error_of([] {
    std::string s;
    for (int i = 0; i < 300; ++i) s += "{% if true %}";
    return s;
  }());
  EXPECT_NE(blocks.find("nested more than 200 deep"), std::string::npos) << blocks;
  EXPECT_NE(error_of("{{ range(200000) }}").find("range: more than"), std::string::npos);
}

TEST(ChatTemplateTest, TemplatesCannotGrowValuesWithoutBound) {
  const std::string doubling = error_of(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  EXPECT_NE(doubling.find("would make more than 4194304 bytes"), std::string::npos) << doubling;
  const std::string lists = error_of(
      "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}");
  EXPECT_NE(lists.find("would make more than 4194304 bytes"), std::string::npos) << lists;
  const std::string big = error_of("{% set a = [[0] * 4000000] %}");
  EXPECT_NE(big.find("a repetition past 4194304 bytes"), std::string::npos) << big;
  // Many values, each within the bound: what making them costs ends the render.
  const std::string total = error_of("{% set ns = namespace(l=[]) %}{% for i in range(2000) %}"
                                      "{% set ns.l = ns.l + [[0] * 40000] %}{% endfor %}");
  EXPECT_NE(total.find("more than 1000000 steps"), std::string::npos) << total;
  const std::string nested = error_of(
      "{% set ns = namespace(x=[]) %}{% for i in range(40000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}");
  EXPECT_NE(nested.find("a list or dict nested more than 64 deep"), std::string::npos) << nested;
  const std::string shared = error_of(
      "{% set ns = namespace(x=1, y=1) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}"
      "{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}");
  EXPECT_NE(shared.find("a comparison of more than"), std::string::npos) << shared;
  EXPECT_NE(error_of("{% macro f(a=f()) %}{% endmacro %}{{ f() }}").find("macro calls nested more than 64 deep"),
            std::string::npos);
  EXPECT_EQ(error_of("{{ 1 ** 9223372036854775807 }}{{ '' * 9223372036854775807 }}{{ 'abc'[1::9223372036854775807] }}"),
            "");
  EXPECT_EQ(error_of("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}"), "");
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1) | abs }}").find("integer overflow"), std::string::npos);
  const std::string printed = error_of("{% set s = 'x' * 4000000 %}{{ [s, s, s] }}");
  EXPECT_NE(printed.find("the output passes"), std::string::npos) << printed;
  const std::string replaced = error_of("{{ ('x' * 4000).replace('', 'y' * 4000) }}");
  EXPECT_NE(replaced.find("the text would pass"), std::string::npos) << replaced;
  // A namespace that held itself would be a cycle of shared values that nothing frees.
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = [ns] %}"),
            "chat template, line 1: 'ns.me': a namespace cannot hold a namespace");
}

TEST(ChatTemplateTest, VariablesMustBeAnObject) {
  StatusOr<ChatTemplate> t = ChatTemplate::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(ordered_json::array()).ok());
}

}  // namespace
}  // namespace npurt::serve
