// A chat template's syntax tree: the Jinja subset that models' chat templates use
// (text, {{ expressions }}, if / for / set / macro / break / continue, comments,
// whitespace control), read with the settings chat templates are written for (trim_blocks and
// lstrip_blocks on). Untrusted input: every refusal names the line.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npurt/base/status.h"
#include "serve/template_value.h"

namespace npurt::serve::tmpl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,      // value
    kName,         // name
    kList,         // [args...]
    kDict,         // {keys[i]: args[i]}
    kAttr,         // args[0].name
    kIndex,        // args[0][args[1]]
    kSlice,        // args[0][args[1]:args[2]:args[3]] (null parts are absent)
    kCall,         // args[0](args[1..], kwargs)
    kFilter,       // args[0] | name(args[1..], kwargs)
    kTest,         // args[0] is [not] name(args[1..])
    kUnary,        // name ("not", "-", "+") args[0]
    kBinary,       // args[0] name args[1]
    kCompare,      // args[0] keys[0] args[1] keys[1] args[2] ...: Python's chained comparison
    kConditional,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::string> keys;                             // kDict; kCompare: the operators
  std::vector<std::pair<std::string, ExprPtr>> kwargs;       // kCall, kFilter
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind : uint8_t { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue, kMacro };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;                                // kText
  ExprPtr expr;                                    // kOutput, kSet (the value), kFor (the iterable)
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (condition, body) for if and each elif
  Body otherwise;                                  // kIf, kFor: the else body
  std::vector<std::string> targets;                // kFor: loop variables; kSet, kMacro: the name
  std::vector<std::string> params;                 // kMacro: parameter names
  std::vector<ExprPtr> defaults;                   // kMacro: per parameter, its default or null
  std::string attribute;                           // kSet: `set ns.attribute = ...`
  ExprPtr condition;                               // kFor: `for x in xs if condition`
  Body body;                                       // kFor, kMacro
};

// The tree of `source`, or the first error ("line N: ...").
StatusOr<Body> parse_template(std::string_view source);

}  // namespace npurt::serve::tmpl
