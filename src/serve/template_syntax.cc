#include "serve/template_syntax.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace npurt::serve::tmpl {
namespace {

// ---- tokens ----

struct Token {
  enum class Type : uint8_t { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = Type::kEnd;
  std::string text;  // text, name, operator, string value, number spelling
  int line = 0;
};

Status error_at(int line, const std::string& what) {
  return invalid_argument("chat template, line " + std::to_string(line) + ": " + what);
}

// Jinja reads every newline sequence as "\n" and drops one newline at the end.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Jinja strips with Python's \s: Unicode whitespace.
std::string_view rstrip(std::string_view s) { return strip_whitespace(s, false, true); }
std::string_view lstrip(std::string_view s) { return strip_whitespace(s, true, false); }

// Appends the UTF-8 of code point cp.
void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | cp >> 12);
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | cp >> 18);
    out += static_cast<char>(0x80 | (cp >> 12 & 0x3f));
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

constexpr size_t kMaxTagTokens = 1000;

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  StatusOr<std::vector<Token>> run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-': the text's leading whitespace goes
    while (pos < src_.size()) {
      const size_t open = next_tag(pos);
      std::string_view text(src_.data() + pos, open - pos);
      size_t text_start = pos;
      if (strip_next) {
        const std::string_view kept = lstrip(text);
        text_start += text.size() - kept.size();
        text = kept;
      }
      if (open == src_.size()) {
        emit_text(text);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (sign == '-') {
        text = rstrip(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes the line's
        // leading spaces with it.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        const bool line_starting = nl != std::string_view::npos || text_start == 0 || src_[text_start - 1] == '\n';
        const std::string_view tail = text.substr(l_pos);
        const bool blank = !tail.empty() && lstrip(tail).empty();
        if (line_starting && blank) text = text.substr(0, l_pos);
      }
      emit_text(text);
      line_ += count_lines(pos, open);
      size_t p = open + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      char end_sign = '\0';
      if (kind == '#') {
        NPURT_ASSIGN_OR_RETURN(p, skip_comment(p, &end_sign));
      } else {
        tokens_.push_back({kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", line_});
        NPURT_ASSIGN_OR_RETURN(p, lex_tag(p, kind == '{' ? '}' : '%', &end_sign));
        tokens_.push_back({kind == '{' ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", line_});
      }
      strip_next = end_sign == '-';
      // trim_blocks: the newline right after a block or comment tag goes.
      if (!strip_next && end_sign != '+' && kind != '{' && p < src_.size() && src_[p] == '\n') {
        ++line_;
        ++p;
      }
      pos = p;
    }
    tokens_.push_back({Token::Type::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  // Where text from `pos` ends: the next "{{", "{%" or "{#", or the end.
  size_t next_tag(size_t pos) const {
    for (size_t i = pos; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  int count_lines(size_t from, size_t to) const {
    int n = 0;
    for (size_t i = from; i < to; ++i) n += src_[i] == '\n';
    return n;
  }

  void emit_text(std::string_view text) {
    if (text.empty()) return;
    tokens_.push_back({Token::Type::kText, std::string(text), line_});
  }

  StatusOr<size_t> skip_comment(size_t p, char* end_sign) {
    const size_t close = src_.find("#}", p);
    if (close == std::string::npos) return error_at(line_, "a comment ({#) is never closed");
    line_ += count_lines(p, close);
    if (close > p && (src_[close - 1] == '-' || src_[close - 1] == '+')) *end_sign = src_[close - 1];
    return close + 2;
  }

  // Tokens of a tag's inside up to its closer ("}}" or "%}"); returns where text resumes.
  // A tag holds at most kMaxTagTokens: that bounds how deep a chain like 1+1+...+1 nests
  // (the tree is walked recursively), as kMaxDepth bounds parentheses and blocks.
  StatusOr<size_t> lex_tag(size_t p, char closer, char* end_sign) {
    const size_t first = tokens_.size();
    int open_brackets = 0;  // "}}" inside {{ {'a': {'b': 1}} }} closes a dict, not the tag
    const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                         "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "="};
    while (true) {
      while (p < src_.size() && is_space(src_[p])) line_ += src_[p++] == '\n';
      if (p >= src_.size()) return error_at(line_, std::string("a tag is never closed (expected '") + closer + "}')");
      // The closer, maybe with its whitespace sign right before it.
      const bool sign = src_[p] == '-' || (src_[p] == '+' && closer == '%');
      if (open_brackets == 0 && sign && p + 2 < src_.size() && src_[p + 1] == closer && src_[p + 2] == '}') {
        *end_sign = src_[p];
        return p + 3;
      }
      if (open_brackets == 0 && src_[p] == closer && p + 1 < src_.size() && src_[p + 1] == '}') return p + 2;
      if (tokens_.size() - first >= kMaxTagTokens) {
        return error_at(line_, "a tag of more than " + std::to_string(kMaxTagTokens) + " tokens");
      }
      const char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t start = p;
        while (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
        tokens_.push_back({Token::Type::kName, src_.substr(start, p - start), line_});
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        NPURT_ASSIGN_OR_RETURN(p, lex_number(p));
        continue;
      }
      if (c == '\'' || c == '"') {
        NPURT_ASSIGN_OR_RETURN(p, lex_string(p));
        continue;
      }
      bool matched = false;
      for (const char* op : ops) {
        const size_t n = std::strlen(op);
        if (src_.compare(p, n, op) == 0) {
          tokens_.push_back({Token::Type::kOp, op, line_});
          p += n;
          matched = true;
          if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++open_brackets;
          if (n == 1 && (*op == ')' || *op == ']' || *op == '}') && open_brackets > 0) --open_brackets;
          break;
        }
      }
      if (!matched) return error_at(line_, std::string("unexpected character '") + c + "' in a tag");
    }
  }

  // Digits with '_' between them, as Jinja reads numbers: an integer, or a float with a
  // fraction and/or an exponent. Right after '.', only digits (x.0.1 is x[0][1]).
  StatusOr<size_t> lex_number(size_t p) {
    const bool attribute = !tokens_.empty() && tokens_.back().type == Token::Type::kOp && tokens_.back().text == ".";
    std::string digits;
    auto run = [&](size_t& q) {  // one run of digits with single '_' between them
      const size_t start = q;
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                 (src_[q] == '_' && q > start && q + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[q + 1]))))) {
        if (src_[q] != '_') digits += src_[q];
        ++q;
      }
      return q > start;
    };
    run(p);
    bool real = false;
    if (!attribute && p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
      real = true;
      digits += src_[p++];
      run(p);
    }
    if (!attribute && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      std::string exponent = "e";
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) exponent += src_[q++];
      const size_t mark = digits.size();
      if (run(q)) {
        exponent += digits.substr(mark);
        digits.resize(mark);
        digits += exponent;
        real = true;
        p = q;
      } else {
        digits.resize(mark);
      }
    }
    tokens_.push_back({real ? Token::Type::kFloat : Token::Type::kInt, digits, line_});
    return p;
  }

  // A quoted string with Python's escapes; returns the position after its quote.
  StatusOr<size_t> lex_string(size_t p) {
    const char quote = src_[p++];
    const int start_line = line_;
    std::string value;
    while (true) {
      if (p >= src_.size()) return error_at(start_line, "a string is never closed");
      const char c = src_[p++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (p >= src_.size()) return error_at(start_line, "a string is never closed");
      const char e = src_[p++];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {  // up to three octal digits
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
          }
          append_utf8(cp, value);
          break;
        }
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': ++line_; break;  // a backslash at the end of a line joins the lines
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + digits > src_.size()) return error_at(line_, std::string("a truncated \\") + e + " escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < digits; ++k) {
            const char h = src_[p + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return error_at(line_, std::string("a bad \\") + e + " escape");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          if (cp > 0x10ffff) return error_at(line_, "an escape past U+10FFFF");
          p += digits;
          append_utf8(cp, value);
          break;
        }
        default:  // Python keeps an unknown escape as written
          value += '\\';
          value += e;
      }
    }
    tokens_.push_back({Token::Type::kString, std::move(value), start_line});
    return p;
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

// ---- the parser ----

constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  StatusOr<Body> parse() {
    NPURT_ASSIGN_OR_RETURN(Body body, parse_body({}));
    if (peek().type != Token::Type::kEnd) return error_at(peek().line, "unexpected '" + block_word() + "'");
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  Token take() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().type == Token::Type::kOp && peek().text == op; }
  bool at_name(const char* name) const { return peek().type == Token::Type::kName && peek().text == name; }
  bool accept_op(const char* op) {
    if (!at_op(op)) return false;
    ++i_;
    return true;
  }
  bool accept_name(const char* name) {
    if (!at_name(name)) return false;
    ++i_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::Type::kEnd: return "the end of the template";
      case Token::Type::kVarEnd: return "'}}'";
      case Token::Type::kBlockEnd: return "'%}'";
      case Token::Type::kText: return "text";
      case Token::Type::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  Status expect_op(const char* op) {
    if (accept_op(op)) return ok_status();
    return error_at(peek().line, std::string("expected '") + op + "', found " + describe(peek()));
  }
  Status expect(Token::Type type, const char* what) {
    if (peek().type == type) {
      ++i_;
      return ok_status();
    }
    return error_at(peek().line, std::string("expected ") + what + ", found " + describe(peek()));
  }
  StatusOr<std::string> expect_name() {
    if (peek().type != Token::Type::kName) return error_at(peek().line, "expected a name, found " + describe(peek()));
    return take().text;
  }
  // The keyword of the block tag at the cursor ("" if not at one).
  std::string block_word() const {
    if (peek().type != Token::Type::kBlockBegin || peek(1).type != Token::Type::kName) return "";
    return peek(1).text;
  }

  Status deeper(int line) {
    if (++depth_ > kMaxDepth) return error_at(line, "nested more than " + std::to_string(kMaxDepth) + " deep");
    return ok_status();
  }

  // Nodes up to the end or a block tag whose keyword is one of `stops` (left unread).
  StatusOr<Body> parse_body(std::initializer_list<const char*> stops) {
    Body body;
    while (peek().type != Token::Type::kEnd) {
      const Token& t = peek();
      if (t.type == Token::Type::kText) {
        body.push_back(node(Node::Kind::kText, t.line));
        body.back().text = t.text;
        ++i_;
        continue;
      }
      if (t.type == Token::Type::kVarBegin) {
        Node n = node(Node::Kind::kOutput, t.line);
        ++i_;
        NPURT_ASSIGN_OR_RETURN(n.expr, parse_expr());
        NPURT_RETURN_IF_ERROR(expect(Token::Type::kVarEnd, "'}}'"));
        body.push_back(std::move(n));
        continue;
      }
      if (t.type != Token::Type::kBlockBegin) return error_at(t.line, "unexpected " + describe(t));
      const std::string word = block_word();
      for (const char* s : stops) {
        if (word == s) return body;
      }
      NPURT_ASSIGN_OR_RETURN(Node n, parse_statement());
      body.push_back(std::move(n));
    }
    return body;
  }

  StatusOr<Node> parse_statement() {
    const int line = take().line;  // {%
    if (peek().type != Token::Type::kName) return error_at(line, "a block tag without a keyword");
    const std::string word = take().text;
    NPURT_RETURN_IF_ERROR(deeper(line));
    StatusOr<Node> n = word == "if"         ? parse_if(line)
                       : word == "for"      ? parse_for(line)
                       : word == "set"      ? parse_set(line)
                       : word == "macro"    ? parse_macro(line)
                       : word == "break"    ? simple(Node::Kind::kBreak, line)
                       : word == "continue" ? simple(Node::Kind::kContinue, line)
                       : StatusOr<Node>(error_at(line, "the tag '" + word + "' is not supported" +
                                                           (word.rfind("end", 0) == 0 || word == "else" || word == "elif"
                                                                ? " here (no block is open that it closes)"
                                                                : "")));
    --depth_;
    return n;
  }

  StatusOr<Node> simple(Node::Kind kind, int line) {
    NPURT_RETURN_IF_ERROR(expect(Token::Type::kBlockEnd, "'%}'"));
    return node(kind, line);
  }

  // After "{% word" of a closing or middle tag: its "%}".
  Status close_tag(const char* word) {
    NPURT_RETURN_IF_ERROR(expect(Token::Type::kBlockBegin, "'{%'"));
    if (!accept_name(word)) return error_at(peek().line, std::string("expected '") + word + "'");
    return expect(Token::Type::kBlockEnd, "'%}'");
  }

  StatusOr<Node> parse_if(int line) {
    Node n = node(Node::Kind::kIf, line);
    NPURT_ASSIGN_OR_RETURN(ExprPtr cond, parse_expr());
    NPURT_RETURN_IF_ERROR(expect(Token::Type::kBlockEnd, "'%}'"));
    while (true) {
      NPURT_ASSIGN_OR_RETURN(Body body, parse_body({"elif", "else", "endif"}));
      n.branches.emplace_back(std::move(cond), std::move(body));
      const std::string word = block_word();
      if (word == "elif") {
        i_ += 2;
        NPURT_ASSIGN_OR_RETURN(cond, parse_expr());
        NPURT_RETURN_IF_ERROR(expect(Token::Type::kBlockEnd, "'%}'"));
        continue;
      }
      if (word == "else") {
        NPURT_RETURN_IF_ERROR(close_tag("else"));
        NPURT_ASSIGN_OR_RETURN(n.otherwise, parse_body({"endif"}));
      }
      if (block_word() != "endif") return error_at(line, "this 'if' is never closed by 'endif'");
      NPURT_RETURN_IF_ERROR(close_tag("endif"));
      return n;
    }
  }

  StatusOr<Node> parse_for(int line) {
    Node n = node(Node::Kind::kFor, line);
    do {
      NPURT_ASSIGN_OR_RETURN(std::string name, expect_name());
      n.targets.push_back(std::move(name));
    } while (accept_op(","));
    if (!accept_name("in")) return error_at(peek().line, "expected 'in' in a for tag, found " + describe(peek()));
    NPURT_ASSIGN_OR_RETURN(n.expr, parse_or());
    if (accept_name("if")) {
      NPURT_ASSIGN_OR_RETURN(n.condition, parse_expr());
    }
    if (at_name("recursive")) return error_at(line, "recursive loops are not supported");
    NPURT_RETURN_IF_ERROR(expect(Token::Type::kBlockEnd, "'%}'"));
    NPURT_ASSIGN_OR_RETURN(n.body, parse_body({"else", "endfor"}));
    if (block_word() == "else") {
      NPURT_RETURN_IF_ERROR(close_tag("else"));
      NPURT_ASSIGN_OR_RETURN(n.otherwise, parse_body({"endfor"}));
    }
    if (block_word() != "endfor") return error_at(line, "this 'for' is never closed by 'endfor'");
    NPURT_RETURN_IF_ERROR(close_tag("endfor"));
    return n;
  }

  StatusOr<Node> parse_macro(int line) {
    Node n = node(Node::Kind::kMacro, line);
    NPURT_ASSIGN_OR_RETURN(std::string name, expect_name());
    n.targets.push_back(std::move(name));
    NPURT_RETURN_IF_ERROR(expect_op("("));
    while (!at_op(")")) {
      NPURT_ASSIGN_OR_RETURN(std::string param, expect_name());
      n.params.push_back(std::move(param));
      ExprPtr fallback;
      if (accept_op("=")) {
        NPURT_ASSIGN_OR_RETURN(fallback, parse_expr());
      }
      n.defaults.push_back(std::move(fallback));
      if (!accept_op(",")) break;
    }
    NPURT_RETURN_IF_ERROR(expect_op(")"));
    NPURT_RETURN_IF_ERROR(expect(Token::Type::kBlockEnd, "'%}'"));
    NPURT_ASSIGN_OR_RETURN(n.body, parse_body({"endmacro"}));
    if (block_word() != "endmacro") return error_at(line, "this 'macro' is never closed by 'endmacro'");
    NPURT_RETURN_IF_ERROR(close_tag("endmacro"));
    return n;
  }

  StatusOr<Node> parse_set(int line) {
    Node n = node(Node::Kind::kSet, line);
    NPURT_ASSIGN_OR_RETURN(std::string name, expect_name());
    n.targets.push_back(std::move(name));
    if (accept_op(".")) {
      NPURT_ASSIGN_OR_RETURN(n.attribute, expect_name());
    }
    if (at_op(",")) return error_at(line, "setting several names at once is not supported");
    if (!accept_op("=")) return error_at(line, "block assignments ({% set x %}...{% endset %}) are not supported");
    NPURT_ASSIGN_OR_RETURN(n.expr, parse_expr());
    NPURT_RETURN_IF_ERROR(expect(Token::Type::kBlockEnd, "'%}'"));
    return n;
  }

  static Node node(Node::Kind kind, int line) {
    Node n;
    n.kind = kind;
    n.line = line;
    return n;
  }

  // ---- expressions, loosest first (Jinja's precedence) ----

  static ExprPtr make(Expr::Kind kind, int line, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->name = std::move(name);
    return e;
  }
  static ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    ExprPtr e = make(Expr::Kind::kBinary, a->line, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  StatusOr<ExprPtr> parse_expr() {
    NPURT_RETURN_IF_ERROR(deeper(peek().line));
    StatusOr<ExprPtr> e = parse_conditional();
    --depth_;
    return e;
  }

  StatusOr<ExprPtr> parse_conditional() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr value, parse_or());
    while (accept_name("if")) {
      ExprPtr e = make(Expr::Kind::kConditional, value->line);
      NPURT_ASSIGN_OR_RETURN(ExprPtr cond, parse_or());
      ExprPtr otherwise;
      if (accept_name("else")) {
      NPURT_ASSIGN_OR_RETURN(otherwise, parse_expr());
    }
      e->args.push_back(std::move(value));
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(otherwise));
      value = std::move(e);
    }
    return value;
  }

  StatusOr<ExprPtr> parse_or() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr a, parse_and());
    while (accept_name("or")) {
      NPURT_ASSIGN_OR_RETURN(ExprPtr b, parse_and());
      a = binary("or", std::move(a), std::move(b));
    }
    return a;
  }

  StatusOr<ExprPtr> parse_and() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr a, parse_not());
    while (accept_name("and")) {
      NPURT_ASSIGN_OR_RETURN(ExprPtr b, parse_not());
      a = binary("and", std::move(a), std::move(b));
    }
    return a;
  }

  StatusOr<ExprPtr> parse_not() {
    if (at_name("not")) {
      const int line = take().line;
      NPURT_RETURN_IF_ERROR(deeper(line));
      StatusOr<ExprPtr> inner = parse_not();
      --depth_;
      NPURT_RETURN_IF_ERROR(inner.status());
      ExprPtr e = make(Expr::Kind::kUnary, line, "not");
      e->args.push_back(std::move(inner).value());
      return e;
    }
    return parse_compare();
  }

  // Python's comparisons chain: a < b < c is (a < b) and (b < c), b read once.
  StatusOr<ExprPtr> parse_compare() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr chain;
    while (true) {
      std::string op;
      if (peek().type == Token::Type::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = take().text;
      } else if (accept_name("in")) {
        op = "in";
      } else if (at_name("not") && peek(1).type == Token::Type::kName && peek(1).text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!chain) {
        chain = make(Expr::Kind::kCompare, first->line);
        chain->args.push_back(std::move(first));
      }
      NPURT_ASSIGN_OR_RETURN(ExprPtr next, parse_math1());
      chain->keys.push_back(std::move(op));
      chain->args.push_back(std::move(next));
    }
    return chain ? std::move(chain) : std::move(first);
  }

  StatusOr<ExprPtr> parse_math1() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr a, parse_concat());
    while (at_op("+") || at_op("-")) {
      const std::string op = take().text;
      NPURT_ASSIGN_OR_RETURN(ExprPtr b, parse_concat());
      a = binary(op, std::move(a), std::move(b));
    }
    return a;
  }

  StatusOr<ExprPtr> parse_concat() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr a, parse_math2());
    while (accept_op("~")) {
      NPURT_ASSIGN_OR_RETURN(ExprPtr b, parse_math2());
      a = binary("~", std::move(a), std::move(b));
    }
    return a;
  }

  StatusOr<ExprPtr> parse_math2() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr a, parse_pow());
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = take().text;
      NPURT_ASSIGN_OR_RETURN(ExprPtr b, parse_pow());
      a = binary(op, std::move(a), std::move(b));
    }
    return a;
  }

  StatusOr<ExprPtr> parse_pow() {
    NPURT_ASSIGN_OR_RETURN(ExprPtr a, parse_unary(true));
    while (accept_op("**")) {
      NPURT_ASSIGN_OR_RETURN(ExprPtr b, parse_unary(true));
      a = binary("**", std::move(a), std::move(b));
    }
    return a;
  }

  StatusOr<ExprPtr> parse_unary(bool with_filters) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Token op = take();
      NPURT_RETURN_IF_ERROR(deeper(op.line));
      StatusOr<ExprPtr> inner = parse_unary(false);
      --depth_;
      NPURT_RETURN_IF_ERROR(inner.status());
      e = make(Expr::Kind::kUnary, op.line, op.text);
      e->args.push_back(std::move(inner).value());
    } else {
      NPURT_ASSIGN_OR_RETURN(e, parse_primary());
      NPURT_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    }
    if (!with_filters) return e;
    return parse_filters(std::move(e));
  }

  StatusOr<ExprPtr> parse_primary() {
    const Token t = take();
    switch (t.type) {
      case Token::Type::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
        return make(Expr::Kind::kName, t.line, t.text);
      }
      case Token::Type::kString: {
        std::string s = t.text;
        while (peek().type == Token::Type::kString) s += take().text;  // "a" "b" is "ab"
        return literal(Value::string(std::move(s)), t.line);
      }
      case Token::Type::kInt: {
        errno = 0;
        const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) return error_at(t.line, "the integer " + t.text + " is too large");
        return literal(Value::integer(v), t.line);
      }
      case Token::Type::kFloat: return literal(Value::real(std::strtod(t.text.c_str(), nullptr)), t.line);
      case Token::Type::kOp:
        if (t.text == "(") {
          if (accept_op(")")) return make(Expr::Kind::kList, t.line);  // (): an empty tuple
          NPURT_ASSIGN_OR_RETURN(ExprPtr inner, parse_expr());
          if (!at_op(",")) {
            NPURT_RETURN_IF_ERROR(expect_op(")"));
            return inner;
          }
          // A tuple: a list here.
          ExprPtr list = make(Expr::Kind::kList, t.line);
          list->args.push_back(std::move(inner));
          while (accept_op(",") && !at_op(")")) {
            NPURT_ASSIGN_OR_RETURN(ExprPtr item, parse_expr());
            list->args.push_back(std::move(item));
          }
          NPURT_RETURN_IF_ERROR(expect_op(")"));
          return list;
        }
        if (t.text == "[") {
          ExprPtr list = make(Expr::Kind::kList, t.line);
          while (!at_op("]")) {
            NPURT_ASSIGN_OR_RETURN(ExprPtr item, parse_expr());
            list->args.push_back(std::move(item));
            if (!accept_op(",")) break;
          }
          NPURT_RETURN_IF_ERROR(expect_op("]"));
          return list;
        }
        if (t.text == "{") {
          ExprPtr dict = make(Expr::Kind::kDict, t.line);
          while (!at_op("}")) {
            if (peek().type != Token::Type::kString) return error_at(peek().line, "dict keys must be strings");
            dict->keys.push_back(take().text);
            NPURT_RETURN_IF_ERROR(expect_op(":"));
            NPURT_ASSIGN_OR_RETURN(ExprPtr item, parse_expr());
            dict->args.push_back(std::move(item));
            if (!accept_op(",")) break;
          }
          NPURT_RETURN_IF_ERROR(expect_op("}"));
          return dict;
        }
        break;
      default: break;
    }
    return error_at(t.line, "expected a value, found " + describe(t));
  }

  static ExprPtr literal(Value v, int line) {
    ExprPtr e = make(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }

  StatusOr<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      if (accept_op(".")) {
        const Token name = take();
        if (name.type != Token::Type::kName && name.type != Token::Type::kInt) {
          return error_at(name.line, "expected an attribute name after '.', found " + describe(name));
        }
        ExprPtr a = make(name.type == Token::Type::kInt ? Expr::Kind::kIndex : Expr::Kind::kAttr, name.line, name.text);
        a->args.push_back(std::move(e));
        if (name.type == Token::Type::kInt) {
          errno = 0;
          const long long index = std::strtoll(name.text.c_str(), nullptr, 10);
          if (errno == ERANGE) return error_at(name.line, "the index " + name.text + " is too large");
          a->args.push_back(literal(Value::integer(index), name.line));
        }
        e = std::move(a);
      } else if (at_op("[")) {
        NPURT_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e)));
      } else if (at_op("(")) {
        NPURT_ASSIGN_OR_RETURN(e, parse_call(std::move(e), Expr::Kind::kCall, ""));
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> parse_subscript(ExprPtr target) {
    const int line = take().line;  // [
    ExprPtr parts[3];
    int colons = 0;
    while (!at_op("]")) {
      if (accept_op(":")) {
        if (++colons > 2) return error_at(line, "a slice has at most two ':'");
        continue;
      }
      if (parts[colons]) return error_at(peek().line, "expected ']' or ':', found " + describe(peek()));
      NPURT_ASSIGN_OR_RETURN(parts[colons], parse_expr());
    }
    NPURT_RETURN_IF_ERROR(expect_op("]"));
    if (colons == 0) {
      if (!parts[0]) return error_at(line, "an empty subscript");
      ExprPtr e = make(Expr::Kind::kIndex, line);
      e->args.push_back(std::move(target));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    ExprPtr e = make(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(target));
    for (ExprPtr& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // "(" args ")" after a callee, a filter name or a test name.
  StatusOr<ExprPtr> parse_call(ExprPtr target, Expr::Kind kind, std::string name) {
    const int line = take().line;  // (
    ExprPtr e = make(kind, line, std::move(name));
    e->args.push_back(std::move(target));
    while (!at_op(")")) {
      if (peek().type == Token::Type::kName && peek(1).type == Token::Type::kOp && peek(1).text == "=") {
        std::string key = take().text;
        ++i_;
        NPURT_ASSIGN_OR_RETURN(ExprPtr v, parse_expr());
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!e->kwargs.empty()) return error_at(peek().line, "a positional argument after a keyword argument");
        NPURT_ASSIGN_OR_RETURN(ExprPtr v, parse_expr());
        e->args.push_back(std::move(v));
      }
      if (!accept_op(",")) break;
    }
    NPURT_RETURN_IF_ERROR(expect_op(")"));
    return e;
  }

  StatusOr<ExprPtr> parse_filters(ExprPtr e) {
    while (true) {
      if (accept_op("|")) {
        NPURT_ASSIGN_OR_RETURN(std::string name, expect_name());
        while (accept_op(".")) {  // dotted filter names are one name
          NPURT_ASSIGN_OR_RETURN(std::string part, expect_name());
          name += "." + part;
        }
        if (at_op("(")) {
          NPURT_ASSIGN_OR_RETURN(e, parse_call(std::move(e), Expr::Kind::kFilter, name));
        } else {
          ExprPtr f = make(Expr::Kind::kFilter, e->line, name);
          f->args.push_back(std::move(e));
          e = std::move(f);
        }
      } else if (accept_name("is")) {
        const bool negated = accept_name("not");
        NPURT_ASSIGN_OR_RETURN(std::string name, expect_name());
        ExprPtr test;
        if (at_op("(")) {
          NPURT_ASSIGN_OR_RETURN(test, parse_call(std::move(e), Expr::Kind::kTest, name));
        } else {
          test = make(Expr::Kind::kTest, e->line, name);
          test->args.push_back(std::move(e));
          if (test_argument_follows()) {
            NPURT_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
            NPURT_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
            test->args.push_back(std::move(arg));
          }
        }
        test->negated = negated;
        e = std::move(test);
      } else if (at_op("(")) {
        NPURT_ASSIGN_OR_RETURN(e, parse_call(std::move(e), Expr::Kind::kCall, ""));
      } else {
        return e;
      }
    }
  }

  // `x is sameas none`, `x is divisibleby 3`: one argument without parentheses.
  bool test_argument_follows() const {
    const Token& t = peek();
    if (t.type == Token::Type::kString || t.type == Token::Type::kInt || t.type == Token::Type::kFloat) return true;
    if (t.type == Token::Type::kOp) return t.text == "[" || t.text == "{";
    if (t.type != Token::Type::kName) return false;
    for (const char* kw : {"and", "or", "else", "if", "in", "is", "not"}) {
      if (t.text == kw) return false;
    }
    return true;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<Body> parse_template(std::string_view source) {
  Lexer lexer(normalize_newlines(source));
  NPURT_ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.run());
  return Parser(std::move(tokens)).parse();
}

}  // namespace npurt::serve::tmpl
