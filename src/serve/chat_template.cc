#include "serve/chat_template.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "serve/template_builtins.h"
#include "serve/template_syntax.h"

namespace npurt::serve {

using tmpl::Args;
using tmpl::Body;
using tmpl::Expr;
using tmpl::List;
using tmpl::Node;
using tmpl::Value;

static_assert(ChatTemplate::kMaxOutputBytes == tmpl::kMaxTextBytes);

namespace {

Status at_line(int line, const Status& s) {
  return Status(s.code(), "chat template, line " + std::to_string(line) + ": " + s.message());
}

// Python's integer arithmetic, refusing what would overflow.
StatusOr<Value> integer_op(const std::string& op, int64_t a, int64_t b) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") overflow = __builtin_add_overflow(a, b, &r);
  if (op == "-") overflow = __builtin_sub_overflow(a, b, &r);
  if (op == "*") overflow = __builtin_mul_overflow(a, b, &r);
  if (op == "//" || op == "%") {
    if (b == 0) return invalid_argument("integer division or modulo by zero");
    if (a == INT64_MIN && b == -1) return invalid_argument("integer overflow");
    int64_t q = a / b, m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
      --q;
      m += b;
    }
    r = op == "//" ? q : m;
  }
  if (overflow) return invalid_argument("integer overflow in '" + op + "'");
  return Value::integer(r);
}

StatusOr<Value> float_op(const std::string& op, double a, double b) {
  if (op == "+") return Value::real(a + b);
  if (op == "-") return Value::real(a - b);
  if (op == "*") return Value::real(a * b);
  if (b == 0) return invalid_argument("float division by zero");
  if (op == "/") return Value::real(a / b);
  // CPython's float divmod: from fmod, so 1.0 // 0.1 is 9.0 as in Python.
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  double floordiv = 0;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return Value::real(op == "//" ? floordiv : mod);
}

// Python's int ** int for a non-negative exponent, refusing what would overflow.
StatusOr<Value> integer_power(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {
    if ((exponent & 1) != 0 && __builtin_mul_overflow(result, base, &result)) {
      return invalid_argument("integer overflow in '**'");
    }
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) return invalid_argument("integer overflow in '**'");
  }
  return Value::integer(result);
}

StatusOr<Value> repeat(const Value& seq, int64_t times) {
  const size_t unit = seq.is(Value::Kind::kString) ? seq.as_string().size() : seq.as_list().size();
  if (unit == 0 || times <= 0) return seq.is(Value::Kind::kString) ? Value::string("") : Value::list({});
  const size_t item_bytes = seq.is(Value::Kind::kString) ? 1 : sizeof(Value);
  if (static_cast<uint64_t>(times) > tmpl::kMaxTextBytes / (unit * item_bytes)) {
    return invalid_argument("a repetition past " + std::to_string(tmpl::kMaxTextBytes) + " bytes or items");
  }
  if (seq.is(Value::Kind::kString)) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value::string(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value::list(std::move(out));
}

StatusOr<Value> arithmetic(const std::string& op, const Value& a, const Value& b) {
  using K = Value::Kind;
  if ((op == "~" || op == "+") && a.footprint() + b.footprint() > tmpl::kMaxTextBytes) {
    return invalid_argument("'" + op + "' would make more than " + std::to_string(tmpl::kMaxTextBytes) + " bytes or items");
  }
  if (op == "~") {
    std::string joined = a.str() + b.str();
    if (joined.size() > tmpl::kMaxTextBytes) return invalid_argument("'~' would make more than " + std::to_string(tmpl::kMaxTextBytes) + " bytes");
    return Value::string(std::move(joined));
  }
  if (a.is_number() && b.is_number()) {
    if (op == "/") return float_op(op, a.as_double(), b.as_double());
    if (op == "**") {
      if (a.as_double() == 0 && b.as_double() < 0) return invalid_argument("0 cannot be raised to a negative power");
      if (a.is(K::kFloat) || b.is(K::kFloat) || b.as_int() < 0) return Value::real(std::pow(a.as_double(), b.as_double()));
      return integer_power(a.as_int(), b.as_int());
    }
    if (a.is(K::kFloat) || b.is(K::kFloat)) return float_op(op, a.as_double(), b.as_double());
    return integer_op(op, a.as_int(), b.as_int());
  }
  if (op == "+" && a.kind() == b.kind() && a.is(K::kString)) return Value::string(a.as_string() + b.as_string());
  if (op == "+" && a.kind() == b.kind() && a.is(K::kList)) {
    List out = a.as_list();
    out.insert(out.end(), b.as_list().begin(), b.as_list().end());
    return Value::list(std::move(out));
  }
  const auto integral = [](const Value& v) { return v.is(K::kInt) || v.is(K::kBool); };
  if (op == "*" && (a.is(K::kString) || a.is(K::kList)) && integral(b)) return repeat(a, b.as_int());
  if (op == "*" && (b.is(K::kString) || b.is(K::kList)) && integral(a)) return repeat(b, a.as_int());
  if (a.is(K::kUndefined) || b.is(K::kUndefined)) return invalid_argument("'" + op + "' of an undefined value");
  return invalid_argument(std::string("unsupported operand types for ") + op + ": " + a.type_name() + " and " + b.type_name());
}

StatusOr<bool> contains(const Value& haystack, const Value& needle) {
  if (haystack.is(Value::Kind::kUndefined)) return false;  // Jinja iterates it as empty
  if (haystack.is(Value::Kind::kString)) {
    if (!needle.is(Value::Kind::kString)) return invalid_argument(std::string("'in <string>' needs a string, not ") + needle.type_name());
    return tmpl::find_text(haystack.as_string(), needle.as_string()) != std::string::npos;
  }
  if (haystack.is(Value::Kind::kDict)) {
    return needle.is(Value::Kind::kString) && haystack.as_dict().find(needle.as_string()) != nullptr;
  }
  if (!haystack.is(Value::Kind::kList)) return invalid_argument(std::string("'in' a ") + haystack.type_name());
  for (const Value& v : haystack.as_list()) {
    NPURT_ASSIGN_OR_RETURN(bool same, v.equals(needle));
    if (same) return true;
  }
  return false;
}

StatusOr<Value> compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==" || op == "!=") {
    NPURT_ASSIGN_OR_RETURN(bool same, a.equals(b));
    return Value::boolean(same == (op == "=="));
  }
  if (op == "in" || op == "not in") {
    NPURT_ASSIGN_OR_RETURN(bool in, contains(b, a));
    return Value::boolean(in == (op == "in"));
  }
  tmpl::Args args;
  args.positional.push_back(b);
  const std::string test = op == "<" ? "lt" : op == "<=" ? "le" : op == ">" ? "gt" : "ge";
  NPURT_ASSIGN_OR_RETURN(bool r, tmpl::apply_test(test, a, args));
  return Value::boolean(r);
}

// Python's index of a sequence of `n` (negatives from the end), or -1 out of range.
int64_t wrap_index(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  return i >= 0 && i < static_cast<int64_t>(n) ? i : -1;
}

class Renderer {
 public:
  explicit Renderer(const nlohmann::ordered_json& variables) {
    scopes_.emplace_back();
    for (const auto& [k, v] : variables.items()) scopes_.back()[k] = Value::from_json(v);
  }

  StatusOr<std::string> run(const Body& body) {
    NPURT_RETURN_IF_ERROR(exec(body));
    return std::move(out_);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Status step(int line, uint64_t cost = 1) {
    steps_ += cost;
    if (steps_ > ChatTemplate::kMaxSteps) {
      return at_line(line, invalid_argument("more than " + std::to_string(ChatTemplate::kMaxSteps) + " steps"));
    }
    return ok_status();
  }

  // What making or reading a value of `bytes` costs: a step per kBytesPerStep, so work
  // and memory over a render stay bounded along with its steps.
  Status charge(size_t bytes, int line) { return bytes < kBytesPerStep ? ok_status() : step(line, bytes / kBytesPerStep); }

  // Statements and expressions in progress, nested (macros make it more than the
  // parser's bound): the walk is recursive, so this bounds its stack.
  class Nested {
   public:
    explicit Nested(int& depth) : depth_(depth) { ++depth_; }
    ~Nested() { --depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    int& depth_;
  };
  Status check_nesting(int line) const {
    if (nesting_ <= kMaxNesting) return ok_status();
    return at_line(line, invalid_argument("evaluation nested more than " + std::to_string(kMaxNesting) + " deep"));
  }

  Status exec(const Body& body) {
    for (const Node& n : body) {
      NPURT_RETURN_IF_ERROR(exec(n));
      if (flow_ != Flow::kNormal) return ok_status();
    }
    return ok_status();
  }

  Status exec(const Node& n) {
    const Nested nested(nesting_);
    NPURT_RETURN_IF_ERROR(check_nesting(n.line));
    NPURT_RETURN_IF_ERROR(step(n.line));
    switch (n.kind) {
      case Node::Kind::kText: return write(n.text, n.line);
      case Node::Kind::kOutput: {
        NPURT_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        return write(v.str(), n.line);
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          NPURT_ASSIGN_OR_RETURN(Value c, eval(*cond));
          if (c.truthy()) return exec(body);
        }
        return exec(n.otherwise);
      case Node::Kind::kFor: return exec_for(n);
      case Node::Kind::kSet: return exec_set(n);
      case Node::Kind::kMacro: {
        // What the macro sees besides the template's variables: the names visible where
        // it is defined (a loop's variable, say), as they are now.
        Macro m{&n, {}};
        for (size_t k = 1; k < scopes_.size(); ++k) {
          for (const auto& [name, v] : scopes_[k]) m.closure[name] = v;
        }
        macros_[n.targets[0]] = std::move(m);
        return ok_status();
      }
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loops_ == 0) return at_line(n.line, invalid_argument("'break' or 'continue' outside a loop"));
        flow_ = n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
        return ok_status();
    }
    return ok_status();
  }

  Status write(const std::string& s, int line) {
    if (out_.size() + s.size() > ChatTemplate::kMaxOutputBytes) {
      return at_line(line, invalid_argument("the output passes " + std::to_string(ChatTemplate::kMaxOutputBytes) + " bytes"));
    }
    out_ += s;
    return ok_status();
  }

  Status exec_set(const Node& n) {
    NPURT_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
    const std::string& name = n.targets[0];
    if (n.attribute.empty()) {
      scopes_.back()[name] = std::move(v);
      return ok_status();
    }
    const Value target = lookup(name);
    if (!target.is(Value::Kind::kDict) || !target.as_dict().is_namespace) {
      return at_line(n.line, invalid_argument("'" + name + "." + n.attribute + "' can be set only on a namespace()"));
    }
    // A namespace holding a namespace could hold itself: a cycle nothing frees.
    if (v.holds_namespace()) {
      return at_line(n.line, invalid_argument("'" + name + "." + n.attribute + "': a namespace cannot hold a namespace"));
    }
    target.mutable_dict().set(n.attribute, std::move(v));
    return ok_status();
  }

  Status exec_for(const Node& n) {
    NPURT_ASSIGN_OR_RETURN(Value iterable, eval(*n.expr));
    if (iterable.is(Value::Kind::kString)) {  // a Value per character
      NPURT_RETURN_IF_ERROR(charge(iterable.as_string().size() * sizeof(Value), n.line));
    }
    StatusOr<List> all = tmpl::items_of(iterable);
    if (!all.ok()) return at_line(n.line, all.status());
    // Jinja filters first, so `loop` counts only the items that pass.
    List items;
    for (Value& item : *all) {
      if (n.condition) {
        scopes_.emplace_back();
        Status bound = bind(n, item);
        StatusOr<Value> pass = bound.ok() ? eval(*n.condition) : StatusOr<Value>(bound);
        scopes_.pop_back();
        NPURT_RETURN_IF_ERROR(pass.status());
        if (!pass->truthy()) continue;
      }
      items.push_back(std::move(item));
    }
    if (items.empty()) {
      scopes_.emplace_back();
      const Status s = exec(n.otherwise);
      scopes_.pop_back();
      return s;
    }
    // Each pass has a scope of its own: what the body sets lasts until the pass ends
    // (Jinja's rule; namespace() objects carry values across).
    ++loops_;
    Status s = ok_status();
    for (size_t i = 0; i < items.size() && s.ok(); ++i) {
      scopes_.emplace_back();
      s = step(n.line);
      if (s.ok()) s = bind(n, items[i]);
      if (s.ok()) {
        scopes_.back()["loop"] = loop_value(items, i);
        s = exec(n.body);
      }
      scopes_.pop_back();
      const Flow f = flow_;
      flow_ = Flow::kNormal;
      if (f == Flow::kBreak) break;
    }
    --loops_;
    return s;
  }

  Status bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return ok_status();
    }
    StatusOr<List> parts = tmpl::items_of(item);
    if (!parts.ok() || parts->size() != n.targets.size()) {
      return at_line(n.line, invalid_argument("cannot unpack a " + std::string(item.type_name()) + " into " +
                                               std::to_string(n.targets.size()) + " names"));
    }
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back()[n.targets[k]] = (*parts)[k];
    return ok_status();
  }

  static Value loop_value(const List& items, size_t i) {
    const auto n = static_cast<int64_t>(items.size()), at = static_cast<int64_t>(i);
    tmpl::Dict d;
    d.set("index0", Value::integer(at));
    d.set("index", Value::integer(at + 1));
    d.set("revindex0", Value::integer(n - at - 1));
    d.set("revindex", Value::integer(n - at));
    d.set("first", Value::boolean(i == 0));
    d.set("last", Value::boolean(at == n - 1));
    d.set("length", Value::integer(n));
    if (i > 0) d.set("previtem", items[i - 1]);
    if (at + 1 < n) d.set("nextitem", items[i + 1]);
    return Value::dict(std::move(d));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }

  StatusOr<Value> eval(const Expr& e) {
    const Nested nested(nesting_);
    NPURT_RETURN_IF_ERROR(check_nesting(e.line));
    StatusOr<Value> v = eval_inner(e);
    if (v.ok()) {
      if (v->footprint() > tmpl::kMaxTextBytes) {
        return at_line(e.line, invalid_argument("a value of more than " + std::to_string(tmpl::kMaxTextBytes) + " bytes"));
      }
      if (v->depth() > tmpl::kMaxValueDepth) {
        return at_line(e.line, invalid_argument("a list or dict nested more than " +
                                                std::to_string(tmpl::kMaxValueDepth) + " deep"));
      }
      NPURT_RETURN_IF_ERROR(charge(v->footprint(), e.line));
      return v;
    }
    if (v.status().message().rfind("chat template, line ", 0) == 0) return v;
    return at_line(e.line, v.status());
  }

  StatusOr<Args> eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) {
      NPURT_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
      a.positional.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      NPURT_ASSIGN_OR_RETURN(Value v, eval(*x));
      a.keyword.emplace_back(k, std::move(v));
    }
    return a;
  }

  // The value that `x.name` or `x[key]` reads; undefined when absent.
  static StatusOr<Value> member(const Value& target, const Value& key, const std::string& spelled) {
    if (target.is(Value::Kind::kUndefined)) return invalid_argument("'" + spelled + "' of an undefined value");
    if (target.is(Value::Kind::kDict)) {
      if (!key.is(Value::Kind::kString)) return Value();
      const Value* v = target.as_dict().find(key.as_string());
      return v != nullptr ? *v : Value();
    }
    if (!key.is(Value::Kind::kInt)) return Value();
    if (target.is(Value::Kind::kList)) {
      const int64_t i = wrap_index(key.as_int(), target.as_list().size());
      return i < 0 ? Value() : target.as_list()[static_cast<size_t>(i)];
    }
    if (target.is(Value::Kind::kString)) {
      const std::string& s = target.as_string();
      const int64_t i = wrap_index(key.as_int(), tmpl::length_of(target));
      if (i < 0) return Value();
      size_t at = 0;  // the byte where character i starts
      for (int64_t seen = -1; at < s.size(); ++at) {
        if ((static_cast<unsigned char>(s[at]) & 0xc0) != 0x80 && ++seen == i) break;
      }
      size_t end = at + 1;
      while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xc0) == 0x80) ++end;
      return Value::string(s.substr(at, end - at));
    }
    return Value();
  }

  StatusOr<Value> slice(const Expr& e) {
    NPURT_ASSIGN_OR_RETURN(Value target, eval(*e.args[0]));
    int64_t part[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      NPURT_ASSIGN_OR_RETURN(Value v, eval(*e.args[k + 1]));
      if (v.is(Value::Kind::kNone)) continue;
      if (!v.is(Value::Kind::kInt)) return invalid_argument("slice bounds must be integers");
      part[k] = v.as_int();
      given[k] = true;
    }
    if (part[2] == 0) return invalid_argument("a slice step of 0");
    const bool is_string = target.is(Value::Kind::kString);
    if (!is_string && !target.is(Value::Kind::kList)) return invalid_argument(std::string("a ") + target.type_name() + " cannot be sliced");
    if (is_string) NPURT_RETURN_IF_ERROR(charge(target.size() * sizeof(Value), e.line));
    NPURT_ASSIGN_OR_RETURN(List items, tmpl::items_of(target));
    const auto n = static_cast<int64_t>(items.size());
    const int64_t step = part[2];
    // Python's slice.indices().
    auto clamp = [&](int64_t v, bool is_given, int64_t fallback) {
      if (!is_given) return fallback;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(part[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(part[1], given[1], step > 0 ? n : -1);
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      out.push_back(items[static_cast<size_t>(i)]);
      if (__builtin_add_overflow(i, step, &i)) break;  // a step past INT64's end leaves the sequence
    }
    if (!is_string) return Value::list(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value::string(std::move(s));
  }

  // A macro or a global function by name (defined, though not a value here).
  bool names_a_callable(const Expr& e) const {
    if (e.kind != Expr::Kind::kName || !lookup(e.name).is(Value::Kind::kUndefined)) return false;
    return macros_.count(e.name) != 0 || tmpl::is_global_function(e.name);
  }

  StatusOr<Value> call(const Expr& e) {
    const Expr& callee = *e.args[0];
    NPURT_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    if (callee.kind == Expr::Kind::kAttr) {
      NPURT_ASSIGN_OR_RETURN(Value target, eval(*callee.args[0]));
      if (target.is(Value::Kind::kUndefined)) return invalid_argument("'" + callee.name + "()' of an undefined value");
      return tmpl::call_method(target, callee.name, a);
    }
    if (callee.kind == Expr::Kind::kName && lookup(callee.name).is(Value::Kind::kUndefined)) {
      if (const auto m = macros_.find(callee.name); m != macros_.end()) return call_macro(m->second, a);
      return tmpl::call_global(callee.name, a);
    }
    return invalid_argument("only methods and the global functions can be called");
  }

  // A macro's output as a string. It sees the template's variables and its own
  // parameters, not its caller's locals (Jinja's rule).
  struct Macro {
    const Node* node;
    std::unordered_map<std::string, Value> closure;
  };

  StatusOr<Value> call_macro(const Macro& macro, const Args& a) {
    const Node& m = *macro.node;
    if (macro_depth_ >= kMaxMacroDepth) {
      return invalid_argument("macro calls nested more than " + std::to_string(kMaxMacroDepth) + " deep");
    }
    if (a.positional.size() > m.params.size()) {
      return invalid_argument("the macro '" + m.targets[0] + "' takes " + std::to_string(m.params.size()) + " arguments");
    }
    ++macro_depth_;  // before the defaults: a default may call the macro again
    std::unordered_map<std::string, Value> locals = macro.closure;
    Status s = ok_status();
    for (size_t i = 0; i < m.params.size() && s.ok(); ++i) {
      const Value* given = a.get(m.params[i], i);
      if (given != nullptr) {
        locals[m.params[i]] = *given;
      } else if (m.defaults[i]) {
        StatusOr<Value> d = eval(*m.defaults[i]);
        if (d.ok()) {
          locals[m.params[i]] = std::move(d).value();
        } else {
          s = d.status();
        }
      }
    }
    std::string caller_out;
    if (s.ok()) {
      // It sees the template's variables, its closure and its parameters, not its
      // caller's locals (Jinja's rule), and writes to a text of its own.
      std::vector<std::unordered_map<std::string, Value>> caller_scopes = {scopes_[0], std::move(locals)};
      std::swap(scopes_, caller_scopes);
      std::swap(out_, caller_out);
      const int caller_loops = loops_;
      loops_ = 0;
      s = exec(m.body);
      loops_ = caller_loops;
      flow_ = Flow::kNormal;
      std::swap(out_, caller_out);
      std::swap(scopes_, caller_scopes);
    }
    --macro_depth_;
    NPURT_RETURN_IF_ERROR(s);
    return Value::string(std::move(caller_out));
  }

  StatusOr<Value> eval_inner(const Expr& e) {
    NPURT_RETURN_IF_ERROR(step(e.line));
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kList: {
        List items;
        for (const auto& x : e.args) {
          NPURT_ASSIGN_OR_RETURN(Value v, eval(*x));
          items.push_back(std::move(v));
        }
        return Value::list(std::move(items));
      }
      case Expr::Kind::kDict: {
        tmpl::Dict d;
        for (size_t i = 0; i < e.args.size(); ++i) {
          NPURT_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
          d.set(e.keys[i], std::move(v));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::kAttr: {
        NPURT_ASSIGN_OR_RETURN(Value target, eval(*e.args[0]));
        return member(target, Value::string(e.name), e.name);
      }
      case Expr::Kind::kIndex: {
        NPURT_ASSIGN_OR_RETURN(Value target, eval(*e.args[0]));
        NPURT_ASSIGN_OR_RETURN(Value key, eval(*e.args[1]));
        return member(target, key, "[" + key.repr() + "]");
      }
      case Expr::Kind::kSlice: return slice(e);
      case Expr::Kind::kCall: return call(e);
      case Expr::Kind::kFilter: {
        NPURT_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        NPURT_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
        return tmpl::apply_filter(e.name, v, a);
      }
      case Expr::Kind::kTest: {
        if ((e.name == "defined" || e.name == "undefined") && names_a_callable(*e.args[0])) {
          return Value::boolean((e.name == "defined") != e.negated);
        }
        NPURT_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        NPURT_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
        NPURT_ASSIGN_OR_RETURN(bool r, tmpl::apply_test(e.name, v, a));
        return Value::boolean(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        NPURT_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (!v.is_number()) return invalid_argument("unary '" + e.name + "' of a " + v.type_name());
        if (e.name == "+") return v.is(Value::Kind::kFloat) ? v : Value::integer(v.as_int());
        if (v.is(Value::Kind::kFloat)) return Value::real(-v.as_double());
        return integer_op("-", 0, v.as_int());
      }
      case Expr::Kind::kBinary: {
        NPURT_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
        if (e.name == "and") return a.truthy() ? eval(*e.args[1]) : a;
        if (e.name == "or") return a.truthy() ? a : eval(*e.args[1]);
        NPURT_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
        return arithmetic(e.name, a, b);
      }
      case Expr::Kind::kCompare: {  // a < b < c: each pair, stopping at the first false
        NPURT_ASSIGN_OR_RETURN(Value left, eval(*e.args[0]));
        Value result = Value::boolean(true);
        for (size_t i = 1; i < e.args.size(); ++i) {
          NPURT_ASSIGN_OR_RETURN(Value right, eval(*e.args[i]));
          NPURT_ASSIGN_OR_RETURN(result, compare_op(e.keys[i - 1], left, right));
          if (!result.truthy()) return result;
          left = std::move(right);
        }
        return result;
      }
      case Expr::Kind::kConditional: {
        NPURT_ASSIGN_OR_RETURN(Value c, eval(*e.args[1]));
        if (c.truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value();
      }
    }
    return internal_error("unknown expression kind");
  }

  static constexpr int kMaxMacroDepth = 64;
  static constexpr int kMaxNesting = 400;
  static constexpr size_t kBytesPerStep = 64;

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::unordered_map<std::string, Macro> macros_;
  int nesting_ = 0;
  int macro_depth_ = 0;
  std::string out_;
  uint64_t steps_ = 0;
  int loops_ = 0;
  Flow flow_ = Flow::kNormal;
};

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  NPURT_ASSIGN_OR_RETURN(Body body, tmpl::parse_template(source));
  return ChatTemplate(std::make_shared<const Body>(std::move(body)));
}

StatusOr<std::string> ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) return invalid_argument("chat template: the variables must be a JSON object");
  return Renderer(variables).run(*body_);
}

}  // namespace npurt::serve
