#include "npurt/isa/assembler.h"

#include <array>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "isa/asm_line.h"
#include "isa/mnemonics.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/isa.h"

namespace npurt::isa {
namespace {

constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();

// ---------------------------------------------------------------------------
// Operands

StatusOr<uint8_t> sub_op(LineReader& in, std::span<const std::string_view> names, std::string_view what) {
  in.skip_spaces();
  const size_t column = in.column();
  const std::string_view w = in.word();
  if (const std::optional<uint8_t> code = mnemonics::find(names, w)) return *code;
  return in.error_at_column(column, "unknown " + std::string(what) + " '" + std::string(w) + "' (one of " +
                                        mnemonics::listed(names) + ")");
}

StatusOr<uint8_t> dtype_code(LineReader& in) {
  in.skip_spaces();
  const size_t start = in.pos();
  const std::string_view w = in.word();
  for (int code = 0; code < 256; ++code) {
    const auto c = static_cast<uint8_t>(code);
    if (dtype_is_valid(c) && dtype_name(static_cast<DType>(c)) == w) return c;
  }
  LineReader at(in.text(), in.line(), start);
  return at.expected("a dtype (f32, bf16, f16, i32, q8_0, q4_0, q5_0, q4_K, q5_K, q6_K)");
}

// A memory operand's argument: argN, or const for the image's constants.
StatusOr<uint8_t> memory_arg(LineReader& in) {
  if (in.accept("const")) return kConstArg;
  StatusOr<uint8_t> arg = in.arg_index();
  if (arg.ok()) return arg;
  return in.expected("an argument arg0..arg" + std::to_string(kMaxArgs - 1) + " or const");
}

// An instruction index (a loop target).
StatusOr<int64_t> target(LineReader& in) {
  NPURT_RETURN_IF_ERROR(in.expect("->"));
  NPURT_ASSIGN_OR_RETURN(const uint64_t index, in.unsigned_number(kU32Max, "an instruction index"));
  return static_cast<int64_t>(index);
}

// A TDEF dimension: 0..65535, or a register (whose immediate field stays zero).
Status tdef_dim(LineReader& in, uint8_t& reg, uint16_t& imm) {
  in.skip_spaces();
  if (in.pos() < in.text().size() && in.text()[in.pos()] == 'r') {
    NPURT_ASSIGN_OR_RETURN(reg, in.scalar_reg());
    return ok_status();
  }
  NPURT_ASSIGN_OR_RETURN(const uint64_t value, in.unsigned_number(65535, "a tile dimension (or register)"));
  imm = static_cast<uint16_t>(value);
  reg = kNoReg;
  return ok_status();
}

// One of `words`, next on the line; returns its index.
StatusOr<size_t> one_of(LineReader& in, std::initializer_list<std::string_view> words, std::string_view what) {
  size_t i = 0;
  for (const std::string_view w : words) {
    if (in.accept(w)) return i;
    ++i;
  }
  return in.expected(what);
}

// ---------------------------------------------------------------------------
// Operands of each instruction, in the order disassemble() prints them

Status none(LineReader&, Insn&) { return ok_status(); }

Status loop(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.scalar_reg());
  NPURT_ASSIGN_OR_RETURN(i.imm, target(in));
  return ok_status();
}

Status endloop(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.imm, target(in));
  return ok_status();
}

Status li(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.scalar_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.imm, in.signed_number());
  return ok_status();
}

Status reg_reg(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.scalar_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.b, in.scalar_reg());
  return ok_status();
}

Status reg3(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(reg_reg(in, i));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.c, in.scalar_reg());
  return ok_status();
}

Status reg_reg_imm(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(reg_reg(in, i));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.imm, in.signed_number());
  return ok_status();
}

Status special(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.scalar_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.sub, sub_op(in, mnemonics::kSpecial, "special value"));
  const auto which = static_cast<Special>(i.sub);
  if (which == Special::kArgValue || which == Special::kArgBytes) {
    NPURT_ASSIGN_OR_RETURN(i.imm, in.arg_index());
  }
  return ok_status();
}

Status tdef(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.sub, dtype_code(in));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  uint16_t rows = 0, cols = 0;
  NPURT_RETURN_IF_ERROR(tdef_dim(in, i.b, rows));
  NPURT_RETURN_IF_ERROR(in.expect("x"));
  NPURT_RETURN_IF_ERROR(tdef_dim(in, i.c, cols));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_RETURN_IF_ERROR(in.expect("local"));
  NPURT_ASSIGN_OR_RETURN(const uint64_t offset, in.unsigned_number(kU32Max, "a local byte offset"));
  i.d = kNoReg;
  if (in.accept("+")) {
    NPURT_ASSIGN_OR_RETURN(i.d, in.scalar_reg());
  }
  i.imm = tdef_imm(static_cast<uint32_t>(offset), rows, cols);
  return ok_status();
}

// "t3, arg1[r4]": the tile and the address every GM instruction starts with.
Status tile_and_address(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.b, memory_arg(in));
  NPURT_RETURN_IF_ERROR(in.expect("["));
  NPURT_ASSIGN_OR_RETURN(i.c, in.scalar_reg());
  NPURT_RETURN_IF_ERROR(in.expect("]"));
  return in.expect(",");
}

// "t3, arg1[r4], <stride_word> r5, bf16"; the stride is optional unless `required`.
Status strided(LineReader& in, Insn& i, std::string_view stride_word, bool required) {
  NPURT_RETURN_IF_ERROR(tile_and_address(in, i));
  i.d = kNoReg;
  if (in.accept(stride_word)) {
    NPURT_ASSIGN_OR_RETURN(i.d, in.scalar_reg());
    NPURT_RETURN_IF_ERROR(in.expect(","));
  } else if (required) {
    return in.expected("'" + std::string(stride_word) + "'");
  }
  NPURT_ASSIGN_OR_RETURN(i.sub, dtype_code(in));
  return ok_status();
}

// ", <word>" at the end of an instruction sets `flag`; nothing leaves it clear.
Status optional_flag(LineReader& in, Insn& i, std::string_view word, uint8_t flag) {
  if (!in.accept(",")) return ok_status();
  NPURT_RETURN_IF_ERROR(in.expect(word));
  i.flags = flag;
  return ok_status();
}

Status tld_tst(LineReader& in, Insn& i) { return strided(in, i, "stride", false); }

Status tldq(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(strided(in, i, "stride_bytes", true));
  return optional_flag(in, i, "trans", kTransB);
}

Status tgather(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.b, memory_arg(in));
  NPURT_RETURN_IF_ERROR(in.expect("["));
  NPURT_ASSIGN_OR_RETURN(i.c, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect("]"));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_RETURN_IF_ERROR(in.expect("pitch_bytes"));
  NPURT_ASSIGN_OR_RETURN(i.d, in.scalar_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.sub, dtype_code(in));
  return ok_status();
}

Status tile_reg(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.b, in.scalar_reg());
  return ok_status();
}

Status tile_tile(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.b, in.tile_reg());
  return ok_status();
}

Status tile3(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(tile_tile(in, i));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.c, in.tile_reg());
  return ok_status();
}

Status tbin(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(tile3(in, i));
  if (!in.accept(",")) return ok_status();
  NPURT_ASSIGN_OR_RETURN(const size_t which, one_of(in, {"bcast_row", "bcast_col"}, "bcast_row or bcast_col"));
  i.flags = which == 0 ? kBcastRow : kBcastCol;
  return ok_status();
}

Status tsop(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(tile_tile(in, i));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.c, in.scalar_reg());
  return ok_status();
}

Status tbcast(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(tile_tile(in, i));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(const size_t which, one_of(in, {"row", "col"}, "row or col"));
  i.flags = which == 0 ? kBcastRow : kBcastCol;
  return ok_status();
}

Status tmma(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(tile3(in, i));
  while (in.accept(",")) {
    const size_t column = (in.skip_spaces(), in.column());
    NPURT_ASSIGN_OR_RETURN(const size_t which, one_of(in, {"trans_b", "accumulate"}, "trans_b or accumulate"));
    const uint8_t flag = which == 0 ? kTransB : kAccumulate;
    if (i.flags & flag) return in.error_at_column(column, "flag given twice");
    i.flags |= flag;
  }
  return ok_status();
}

Status tget(LineReader& in, Insn& i) {
  NPURT_ASSIGN_OR_RETURN(i.a, in.scalar_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.b, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect("["));
  NPURT_ASSIGN_OR_RETURN(i.c, in.scalar_reg());
  return in.expect("]");
}

Status tmv(LineReader& in, Insn& i) {
  NPURT_RETURN_IF_ERROR(tile_and_address(in, i));
  NPURT_RETURN_IF_ERROR(in.expect("stride_bytes"));
  NPURT_ASSIGN_OR_RETURN(i.d, in.scalar_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.e, in.tile_reg());
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(i.sub, dtype_code(in));
  return optional_flag(in, i, "accumulate", kAccumulate);
}

// ---------------------------------------------------------------------------
// Mnemonics

using Operands = Status (*)(LineReader&, Insn&);

struct Form {
  std::string_view name;
  Opcode op;
  Operands operands;
  std::span<const std::string_view> subs;  // names after '.', empty: none
  std::string_view sub_what;
};

const Form* find_form(std::string_view name) {
  static const std::array<Form, 28> kForms = {{
      {"nop", Opcode::kNop, none, {}, ""},
      {"exit", Opcode::kExit, none, {}, ""},
      {"barrier", Opcode::kBarrier, none, {}, ""},
      {"loop", Opcode::kLoop, loop, {}, ""},
      {"endloop", Opcode::kEndLoop, endloop, {}, ""},
      {"li", Opcode::kLi, li, {}, ""},
      {"mov", Opcode::kMov, reg_reg, {}, ""},
      {"special", Opcode::kSpecial, special, {}, ""},
      {"alu", Opcode::kAlu, reg3, mnemonics::kAlu, "alu operation"},
      {"alui", Opcode::kAluI, reg_reg_imm, mnemonics::kAlu, "alui operation"},
      {"falu", Opcode::kFalu, reg3, mnemonics::kFalu, "falu operation"},
      {"i2f", Opcode::kI2F, reg_reg, {}, ""},
      {"f2i", Opcode::kF2I, reg_reg, {}, ""},
      {"tdef", Opcode::kTdef, tdef, {}, ""},
      {"tld", Opcode::kTld, tld_tst, {}, ""},
      {"tst", Opcode::kTst, tld_tst, {}, ""},
      {"tldq", Opcode::kTldq, tldq, {}, ""},
      {"tgather", Opcode::kTgather, tgather, {}, ""},
      {"tfill", Opcode::kTfill, tile_reg, {}, ""},
      {"tcvt", Opcode::kTcvt, tile_tile, {}, ""},
      {"tbin", Opcode::kTbin, tbin, mnemonics::kBin, "tbin operation"},
      {"tun", Opcode::kTun, tile_tile, mnemonics::kUn, "tun operation"},
      {"tsop", Opcode::kTsop, tsop, mnemonics::kBin, "tsop operation"},
      {"tred", Opcode::kTred, tile_tile, mnemonics::kRed, "tred reduction"},
      {"tbcast", Opcode::kTbcast, tbcast, {}, ""},
      {"tmma", Opcode::kTmma, tmma, {}, ""},
      {"tget", Opcode::kTget, tget, {}, ""},
      {"tmv", Opcode::kTmv, tmv, {}, ""},
  }};
  for (const Form& f : kForms) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// Lines

// The order lines come in; each kind may repeat, none may come back after a later one.
enum class Section : uint8_t { kNone, kHeader, kArgs, kCode, kConstants };

constexpr std::array<std::string_view, 5> kSectionNames = {"", "header", "argument", "instruction",
                                                           "constants"};

// A number of the header line and where it is, for the checks against the body.
struct Count {
  uint64_t value = 0;
  size_t column = 0;
};

struct Header {
  int line = 0;
  std::string name;
  Count args, insns, local, constants;
  bool barrier = false;
  size_t barrier_column = 0;  // where ", barrier" is or would go
};

// Where a line's item starts.
struct Place {
  int line = 0;
  size_t column = 0;
};

struct ArgLine {
  Place place;
  ArgSpec spec;
};

// What the text says, line by line.
struct Listing {
  Section section = Section::kNone;
  Header header;
  std::vector<ArgLine> args;
  std::vector<Insn> code;
  std::vector<Place> code_places;  // of each instruction's mnemonic
  std::vector<uint8_t> constants;
  int lines = 0;
};

std::string padded(uint64_t value, const char* format) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, static_cast<unsigned long long>(value));
  return buf;
}

StatusOr<Count> count(LineReader& in, std::string_view what) {
  in.skip_spaces();
  Count c;
  c.column = in.column();
  NPURT_ASSIGN_OR_RETURN(c.value, in.unsigned_number(kU32Max, what));
  return c;
}

// Singular or plural: the listing always says "args", a person may write "1 arg".
Status noun(LineReader& in, std::string_view plural) {
  if (in.accept(plural) || in.accept(plural.substr(0, plural.size() - 1))) return ok_status();
  return in.expected("'" + std::string(plural) + "'");
}

// kernel "NAME": 3 args, 10 insns, local 2048 B, constants 0 B[, barrier]
Status read_header(LineReader& in, Header& h) {
  h.line = in.line();
  NPURT_RETURN_IF_ERROR(in.expect("kernel"));
  NPURT_ASSIGN_OR_RETURN(h.name, in.quoted());
  NPURT_RETURN_IF_ERROR(in.expect(":"));
  NPURT_ASSIGN_OR_RETURN(h.args, count(in, "an argument count"));
  NPURT_RETURN_IF_ERROR(noun(in, "args"));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_ASSIGN_OR_RETURN(h.insns, count(in, "an instruction count"));
  NPURT_RETURN_IF_ERROR(noun(in, "insns"));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_RETURN_IF_ERROR(in.expect("local"));
  NPURT_ASSIGN_OR_RETURN(h.local, count(in, "local bytes"));
  NPURT_RETURN_IF_ERROR(in.expect("B"));
  NPURT_RETURN_IF_ERROR(in.expect(","));
  NPURT_RETURN_IF_ERROR(in.expect("constants"));
  NPURT_ASSIGN_OR_RETURN(h.constants, count(in, "constant bytes"));
  NPURT_RETURN_IF_ERROR(in.expect("B"));
  h.barrier_column = in.column();
  if (in.accept(",")) {
    NPURT_RETURN_IF_ERROR(in.expect("barrier"));
    h.barrier = true;
  }
  return in.expect_end();
}

// "in buffer bf16", after the colon that ends an argument's name.
Status read_arg_tail(LineReader& in, ArgSpec& spec) {
  in.skip_spaces();
  const size_t access_column = in.column();
  NPURT_ASSIGN_OR_RETURN(const size_t access, one_of(in, {"in", "out", "inout"}, "in, out or inout"));
  NPURT_ASSIGN_OR_RETURN(const size_t kind, one_of(in, {"buffer", "scalar"}, "buffer or scalar"));
  NPURT_ASSIGN_OR_RETURN(const uint8_t dtype, dtype_code(in));
  NPURT_RETURN_IF_ERROR(in.expect_end());
  spec.access = static_cast<Access>(access + 1);  // kIn, kOut, kInOut are 1, 2, 3
  spec.kind = kind == 0 ? ArgKind::kBuffer : ArgKind::kScalar;
  spec.dtype = static_cast<DType>(dtype);
  if (spec.kind == ArgKind::kScalar && spec.access != Access::kIn) {
    return in.error_at_column(access_column, "a scalar argument is always 'in'");
  }
  return ok_status();
}

// arg2 NAME: in scalar i32
Status read_arg(LineReader& in, Listing& l) {
  in.skip_spaces();
  const Place place{in.line(), in.column()};
  NPURT_ASSIGN_OR_RETURN(const uint8_t index, in.arg_index());
  if (index != l.args.size()) {
    return in.error_at_column(place.column, "arg" + std::to_string(index) + " out of order: expected arg" +
                                                std::to_string(l.args.size()));
  }
  const std::string_view text = in.text();
  if (in.pos() >= text.size() || text[in.pos()] != ' ') return in.expected("a space, then the argument's name");
  const size_t name_begin = in.pos() + 1;
  // Names may hold ':' (and '#' or ';') themselves; the colon that ends the name is
  // the last one the rest of the line parses after.
  Status first_error = in.error_at_column(text.size() + 1, "expected ': ACCESS KIND DTYPE' after the name");
  bool tried = false;
  for (size_t colon = text.rfind(':'); colon != std::string_view::npos && colon >= name_begin;
       colon = colon == 0 ? std::string_view::npos : text.rfind(':', colon - 1)) {
    LineReader tail(text, in.line(), colon + 1);
    ArgLine arg{place, {}};
    const Status s = read_arg_tail(tail, arg.spec);
    if (s.ok()) {
      NPURT_ASSIGN_OR_RETURN(arg.spec.name, in.unescape(name_begin, colon));
      l.args.push_back(std::move(arg));
      return ok_status();
    }
    if (!tried) first_error = s;
    tried = true;
  }
  return first_error;
}

StatusOr<Insn> read_instruction(LineReader& in) {
  in.skip_spaces();
  const size_t column = in.column();
  const std::string_view word = in.word();
  if (word.empty()) return in.expected("a mnemonic");
  const size_t dot = word.find('.');
  const Form* form = find_form(word.substr(0, dot));
  if (form == nullptr || (dot != std::string_view::npos && form->subs.empty())) {
    return in.error_at_column(column, "unknown mnemonic '" + std::string(word) + "'");
  }
  Insn insn;
  insn.op = static_cast<uint8_t>(form->op);
  if (!form->subs.empty()) {
    if (dot == std::string_view::npos) {
      return in.error_at_column(column, "'" + std::string(word) + "' needs an operation: " + std::string(word) +
                                            ".OP");
    }
    LineReader sub(in.text(), in.line(), column + dot);  // the byte after the dot
    NPURT_ASSIGN_OR_RETURN(insn.sub, sub_op(sub, form->subs, form->sub_what));
  }
  NPURT_RETURN_IF_ERROR(form->operands(in, insn));
  NPURT_RETURN_IF_ERROR(in.expect_end());
  return insn;
}

// 0007:   tst t0, arg1[r1], stride r2, bf16
Status read_insn(LineReader& in, Listing& l) {
  in.skip_spaces();
  const size_t column = in.column();
  NPURT_ASSIGN_OR_RETURN(const uint64_t index, in.unsigned_number(kU32Max, "an instruction index"));
  if (index != l.code.size()) {
    return in.error_at_column(column, "instruction index " + padded(index, "%04llu") +
                                          " out of sequence: expected " + padded(l.code.size(), "%04llu"));
  }
  NPURT_RETURN_IF_ERROR(in.expect(":"));
  in.skip_spaces();
  const Place place{in.line(), in.column()};
  NPURT_ASSIGN_OR_RETURN(const Insn insn, read_instruction(in));
  l.code.push_back(insn);
  l.code_places.push_back(place);
  return ok_status();
}

// const 0010: 00 11 22 ... (at most 16 bytes)
Status read_constants(LineReader& in, Listing& l) {
  NPURT_RETURN_IF_ERROR(in.expect("const"));
  in.skip_spaces();
  const size_t column = in.column();
  NPURT_ASSIGN_OR_RETURN(const uint64_t offset, in.hex_number(kU32Max, "a constants offset in hex"));
  if (offset != l.constants.size()) {
    return in.error_at_column(column, "constants offset " + padded(offset, "%04llx") +
                                          " out of sequence: expected " + padded(l.constants.size(), "%04llx"));
  }
  NPURT_RETURN_IF_ERROR(in.expect(":"));
  size_t bytes = 0;
  while (!in.at_end()) {
    if (bytes == mnemonics::kConstBytesPerLine) {
      return in.error("more than " + std::to_string(mnemonics::kConstBytesPerLine) + " bytes on a constants line");
    }
    NPURT_ASSIGN_OR_RETURN(const uint64_t byte, in.hex_number(0xFF, "a byte in hex (00..ff)"));
    l.constants.push_back(static_cast<uint8_t>(byte));
    ++bytes;
  }
  if (bytes == 0) return in.expected("a byte in hex (00..ff)");
  if (l.constants.size() > kMaxImageBytes) {
    return in.error_at_column(column, "constants exceed the " + std::to_string(kMaxImageBytes) +
                                          "-byte image limit");
  }
  return ok_status();
}

// What a line holds, from how it starts.
StatusOr<Section> classify(LineReader& in) {
  in.skip_spaces();
  const std::string_view rest = in.text().substr(in.pos());
  if (rest.substr(0, 6) == "kernel") return Section::kHeader;
  if (rest.substr(0, 5) == "const") return Section::kConstants;
  if (rest.substr(0, 3) == "arg") return Section::kArgs;
  if (rest[0] >= '0' && rest[0] <= '9') return Section::kCode;
  return in.expected("a header, argument, instruction or constants line");
}

Status read_line(LineReader in, Listing& l) {
  if (in.at_end()) return ok_status();  // blank, or a comment
  const size_t column = in.column();
  NPURT_ASSIGN_OR_RETURN(const Section s, classify(in));
  if (l.section == Section::kNone && s != Section::kHeader) {
    return in.expected("the header line 'kernel \"NAME\": ...'");
  }
  if (s == Section::kHeader && l.section != Section::kNone) {
    return in.error_at_column(column, "a second header line (the first is line " +
                                          std::to_string(l.header.line) + ")");
  }
  if (s < l.section) {
    return in.error_at_column(column, "an " + std::string(kSectionNames[static_cast<size_t>(s)]) +
                                          " line after the " +
                                          std::string(kSectionNames[static_cast<size_t>(l.section)]) +
                                          " lines (the order is header, arguments, instructions, constants)");
  }
  l.section = s;
  switch (s) {
    case Section::kHeader: return read_header(in, l.header);
    case Section::kArgs: return read_arg(in, l);
    case Section::kCode: return read_insn(in, l);
    case Section::kConstants: return read_constants(in, l);
    case Section::kNone: break;
  }
  return ok_status();
}

StatusOr<Listing> read_listing(std::string_view text) {
  Listing l;
  size_t begin = 0;
  while (true) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF files
    ++l.lines;
    NPURT_RETURN_IF_ERROR(read_line(LineReader(line, l.lines), l));
    if (end == text.size()) break;
    begin = end + 1;
  }
  return l;
}

// ---------------------------------------------------------------------------
// Checks and the image

Status check_count(const Header& h, const Count& c, uint64_t actual, std::string_view what) {
  if (c.value == actual) return ok_status();
  return error_at(h.line, c.column, "the header says " + std::to_string(c.value) + " " + std::string(what) +
                                        ", the listing has " + std::to_string(actual));
}

Status check_barrier(const Listing& l) {
  const Header& h = l.header;
  for (size_t i = 0; i < l.code.size(); ++i) {
    if (l.code[i].op != static_cast<uint8_t>(Opcode::kBarrier)) continue;
    if (h.barrier) return ok_status();
    return error_at(h.line, h.barrier_column,
                    "instruction " + padded(i, "%04llu") + " (line " + std::to_string(l.code_places[i].line) +
                        ") is a barrier: the header must end with ', barrier'");
  }
  if (!h.barrier) return ok_status();
  return error_at(h.line, h.barrier_column, "the header says barrier, but no instruction is one");
}

// The header's counts are checked, not inferred: a listing edited without updating
// its header is more likely a mistake than an intent.
Status check_header(const Listing& l) {
  if (l.section == Section::kNone) {
    return error_at(l.lines, 1, "no header line: the text must start with 'kernel \"NAME\": ...'");
  }
  const Header& h = l.header;
  NPURT_RETURN_IF_ERROR(check_count(h, h.args, l.args.size(), "args"));
  NPURT_RETURN_IF_ERROR(check_count(h, h.insns, l.code.size(), "insns"));
  NPURT_RETURN_IF_ERROR(check_count(h, h.constants, l.constants.size(), "constant bytes"));
  return check_barrier(l);
}

// Reads a decimal number after `word` at the start of `s` ("insn 12 (TLD)").
bool number_after(std::string_view s, std::string_view word, uint64_t& n) {
  if (s.substr(0, word.size()) != word) return false;
  size_t i = word.size();
  n = 0;
  for (; i < s.size() && i < word.size() + 10 && s[i] >= '0' && s[i] <= '9'; ++i) {
    n = n * 10 + static_cast<uint64_t>(s[i] - '0');
  }
  return i > word.size();
}

// Where an error of KernelBuilder::build belongs: the instruction or argument it
// names ("insn 12 (TLD): ...", "arg 3: ..."), else the header line.
Place place_of(const Listing& l, std::string_view message) {
  const std::string context = "kernel \"" + l.header.name + "\": ";
  if (message.substr(0, context.size()) == context) message.remove_prefix(context.size());
  uint64_t n = 0;
  if (number_after(message, "insn ", n) && n < l.code.size()) return l.code_places[n];
  if (number_after(message, "arg ", n) && n < l.args.size()) return l.args[n].place;
  return {l.header.line, 1};
}

StatusOr<Image> build(const Listing& l, uint32_t max_local_bytes) {
  const Header& h = l.header;
  KernelBuilder b(h.name);
  for (const ArgLine& a : l.args) {
    if (a.spec.kind == ArgKind::kScalar) {
      b.arg_scalar(a.spec.name, a.spec.dtype);
    } else {
      b.arg_buffer(a.spec.name, a.spec.access, a.spec.dtype);
    }
  }
  for (const Insn& insn : l.code) b.emit(insn);
  // One chunk, so no alignment padding is added: the bytes are the listing's.
  if (!l.constants.empty()) b.add_constants(l.constants);
  b.reserve_local(static_cast<uint32_t>(h.local.value));
  StatusOr<Image> image = b.build(max_local_bytes);
  if (!image.ok()) {
    const Place p = place_of(l, image.status().message());
    return Status(image.status().code(), "line " + std::to_string(p.line) + ", column " +
                                             std::to_string(p.column) + ": " + image.status().message());
  }
  if (image->layout().local_bytes != h.local.value) {
    return error_at(h.line, h.local.column,
                    "the header says local " + std::to_string(h.local.value) + " B, but the static tiles need " +
                        std::to_string(image->layout().local_bytes) + " B");
  }
  return image;
}

}  // namespace

StatusOr<Image> assemble(std::string_view text, uint32_t max_local_bytes) {
  NPURT_ASSIGN_OR_RETURN(const Listing listing, read_listing(text));
  NPURT_RETURN_IF_ERROR(check_header(listing));
  return build(listing, max_local_bytes);
}

StatusOr<std::vector<uint8_t>> assemble_bytes(std::string_view text) {
  NPURT_ASSIGN_OR_RETURN(const Image image, assemble(text, std::numeric_limits<uint32_t>::max()));
  return std::vector<uint8_t>(image.bytes().begin(), image.bytes().end());
}

}  // namespace npurt::isa
