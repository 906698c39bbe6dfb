#include "npurt/isa/disasm.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <string_view>
#include <vector>

#include "isa/mnemonics.h"

namespace npurt::isa {
namespace {

// Looks `index` up in a name table; "?" for a value the table does not have, which a
// verified image never contains but costs nothing to survive.
template <size_t N>
std::string_view lookup(const std::array<std::string_view, N>& names, uint8_t index) {
  return index < N ? names[index] : std::string_view("?");
}

std::string reg(uint8_t r) { return "r" + std::to_string(r); }
std::string tile(uint8_t t) { return "t" + std::to_string(t); }
std::string dtype(uint8_t code) { return std::string(dtype_name(static_cast<DType>(code))); }
std::string arg(uint8_t a) { return a == kConstArg ? std::string("const") : "arg" + std::to_string(a); }

std::string index4(int64_t i) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%04lld", static_cast<long long>(i));
  return buf;
}

// Printable ASCII as is, everything else (including '"' and '\\') escaped, so a name
// can never break the one-line-per-item shape of the listing.
std::string escaped(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out += ch;
      continue;
    }
    char buf[5];
    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
    out += buf;
  }
  return out;
}

std::string tdef_dim(uint8_t r, uint16_t imm) { return r == kNoReg ? std::to_string(imm) : reg(r); }

std::string tdef_text(const Insn& i) {
  std::string s = "tdef " + tile(i.a) + ", " + dtype(i.sub) + ", " + tdef_dim(i.b, tdef_rows(i.imm)) + " x " +
                  tdef_dim(i.c, tdef_cols(i.imm)) + ", local " + std::to_string(tdef_offset(i.imm));
  if (i.d != kNoReg) s += " + " + reg(i.d);
  return s;
}

// tld/tst/tldq: "<op> t3, arg1[r4], <stride_label> r5, bf16".
std::string memory_text(std::string_view op, const Insn& i, std::string_view stride_label) {
  std::string s = std::string(op) + " " + tile(i.a) + ", " + arg(i.b) + "[" + reg(i.c) + "]";
  if (i.d != kNoReg) s += ", " + std::string(stride_label) + " " + reg(i.d);
  return s + ", " + dtype(i.sub);
}

std::string special_text(const Insn& i) {
  std::string s = "special " + reg(i.a) + ", " + std::string(lookup(mnemonics::kSpecial, i.sub));
  const auto which = static_cast<Special>(i.sub);
  if (which == Special::kArgValue || which == Special::kArgBytes) s += " arg" + std::to_string(i.imm);
  return s;
}

std::string bcast_suffix(uint8_t flags) {
  if (flags == kBcastRow) return ", bcast_row";
  if (flags == kBcastCol) return ", bcast_col";
  return "";
}

std::string tmma_text(const Insn& i) {
  std::string s = "tmma " + tile(i.a) + ", " + tile(i.b) + ", " + tile(i.c);
  if (i.flags & kTransB) s += ", trans_b";
  if (i.flags & kAccumulate) s += ", accumulate";
  return s;
}

std::string dotted(std::string_view op, std::string_view sub) {
  return std::string(op) + "." + std::string(sub);
}

std::string insn_text(const Insn& i) {
  switch (static_cast<Opcode>(i.op)) {
    case Opcode::kNop: return "nop";
    case Opcode::kExit: return "exit";
    case Opcode::kBarrier: return "barrier";
    case Opcode::kLoop: return "loop " + reg(i.a) + " -> " + index4(i.imm);
    case Opcode::kEndLoop: return "endloop -> " + index4(i.imm);
    case Opcode::kLi: return "li " + reg(i.a) + ", " + std::to_string(i.imm);
    case Opcode::kMov: return "mov " + reg(i.a) + ", " + reg(i.b);
    case Opcode::kSpecial: return special_text(i);
    case Opcode::kAlu:
      return dotted("alu", lookup(mnemonics::kAlu, i.sub)) + " " + reg(i.a) + ", " + reg(i.b) + ", " +
             reg(i.c);
    case Opcode::kAluI:
      return dotted("alui", lookup(mnemonics::kAlu, i.sub)) + " " + reg(i.a) + ", " + reg(i.b) + ", " +
             std::to_string(i.imm);
    case Opcode::kFalu:
      return dotted("falu", lookup(mnemonics::kFalu, i.sub)) + " " + reg(i.a) + ", " + reg(i.b) + ", " +
             reg(i.c);
    case Opcode::kI2F: return "i2f " + reg(i.a) + ", " + reg(i.b);
    case Opcode::kF2I: return "f2i " + reg(i.a) + ", " + reg(i.b);
    case Opcode::kTdef: return tdef_text(i);
    case Opcode::kTld: return memory_text("tld", i, "stride");
    case Opcode::kTst: return memory_text("tst", i, "stride");
    case Opcode::kTldq: return memory_text("tldq", i, "stride_bytes") + (i.flags & kTransB ? ", trans" : "");
    case Opcode::kTgather:
      return "tgather " + tile(i.a) + ", " + arg(i.b) + "[" + tile(i.c) + "], pitch_bytes " + reg(i.d) +
             ", " + dtype(i.sub);
    case Opcode::kTfill: return "tfill " + tile(i.a) + ", " + reg(i.b);
    case Opcode::kTcvt: return "tcvt " + tile(i.a) + ", " + tile(i.b);
    case Opcode::kTbin:
      return dotted("tbin", lookup(mnemonics::kBin, i.sub)) + " " + tile(i.a) + ", " + tile(i.b) + ", " +
             tile(i.c) + bcast_suffix(i.flags);
    case Opcode::kTun:
      return dotted("tun", lookup(mnemonics::kUn, i.sub)) + " " + tile(i.a) + ", " + tile(i.b);
    case Opcode::kTsop:
      return dotted("tsop", lookup(mnemonics::kBin, i.sub)) + " " + tile(i.a) + ", " + tile(i.b) + ", " +
             reg(i.c);
    case Opcode::kTred:
      return dotted("tred", lookup(mnemonics::kRed, i.sub)) + " " + tile(i.a) + ", " + tile(i.b);
    case Opcode::kTbcast:
      return "tbcast " + tile(i.a) + ", " + tile(i.b) + (i.flags == kBcastRow ? ", row" : ", col");
    case Opcode::kTmma: return tmma_text(i);
    case Opcode::kTmv:
      return "tmv " + tile(i.a) + ", " + arg(i.b) + "[" + reg(i.c) + "], stride_bytes " + reg(i.d) + ", " +
             tile(i.e) + ", " + dtype(i.sub) + ((i.flags & kAccumulate) ? ", accumulate" : "");
    case Opcode::kTget: return "tget " + reg(i.a) + ", " + tile(i.b) + "[" + reg(i.c) + "]";
    case Opcode::kOpcodeEnd: break;
  }
  return "unknown opcode " + std::to_string(i.op);
}

std::string header_text(const Image& image) {
  const ImageLayout& l = image.layout();
  std::string s = "kernel \"" + escaped(image.name()) + "\": " + std::to_string(image.args().size()) +
                  " args, " + std::to_string(image.code().size()) + " insns, local " +
                  std::to_string(l.local_bytes) + " B, constants " + std::to_string(l.const_bytes) + " B";
  if (image.uses_barrier()) s += ", barrier";
  return s + "\n";
}

std::string args_text(const Image& image) {
  std::string s;
  for (size_t i = 0; i < image.args().size(); ++i) {
    const ArgSpec& a = image.args()[i];
    s += "  arg" + std::to_string(i) + " " + escaped(a.name) + ": " + std::string(access_name(a.access)) +
         (a.kind == ArgKind::kBuffer ? " buffer " : " scalar ") + dtype(static_cast<uint8_t>(a.dtype)) + "\n";
  }
  return s;
}

// "  const 0010: 00 11 ..": 16 bytes a line, the offset of its first byte in hex.
std::string constants_text(std::span<const uint8_t> bytes) {
  std::string s;
  for (size_t offset = 0; offset < bytes.size(); offset += mnemonics::kConstBytesPerLine) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "  const %04zx:", offset);
    s += buf;
    const size_t end = std::min(bytes.size(), offset + mnemonics::kConstBytesPerLine);
    for (size_t i = offset; i < end; ++i) {
      std::snprintf(buf, sizeof(buf), " %02x", bytes[i]);
      s += buf;
    }
    s += "\n";
  }
  return s;
}

}  // namespace

std::string disassemble(const Image& image) {
  std::string out = header_text(image) + args_text(image);
  const std::span<const Insn> code = image.code();
  size_t depth = 0;
  for (size_t pc = 0; pc < code.size(); ++pc) {
    const Insn& insn = code[pc];
    if (insn.op == static_cast<uint8_t>(Opcode::kEndLoop) && depth > 0) --depth;
    out +=
        "  " + index4(static_cast<int64_t>(pc)) + ": " + std::string(2 * depth, ' ') + insn_text(insn) + "\n";
    if (insn.op == static_cast<uint8_t>(Opcode::kLoop)) ++depth;
  }
  return out + constants_text(image.constants());
}

StatusOr<std::string> disassemble_bytes(std::span<const uint8_t> bytes) {
  NPURT_ASSIGN_OR_RETURN(const Image image,
                         Image::from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.end()),
                                           std::numeric_limits<uint32_t>::max()));
  return disassemble(image);
}

}  // namespace npurt::isa
