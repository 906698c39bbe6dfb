#include "npurt/isa/verifier.h"

#include <algorithm>
#include <array>
#include <bitset>
#include <optional>
#include <string>
#include <vector>

#include "npurt/isa/image.h"

namespace npurt::isa {

// ---------------------------------------------------------------------------
// ByteReader

bool ByteReader::in_bounds(uint64_t offset, uint64_t size, std::string_view what) {
  // offset and size come from 32-bit fields or small constants, so the 64-bit sum
  // cannot wrap; compare without forming offset + size first anyway.
  if (offset <= bytes_.size() && size <= bytes_.size() - offset) return true;
  if (status_.ok()) {
    status_ = invalid_argument(std::string(what) + ": bytes [" + std::to_string(offset) + ", +" +
                               std::to_string(size) + ") lie outside the " + std::to_string(bytes_.size()) +
                               "-byte image");
  }
  return false;
}

std::span<const uint8_t> ByteReader::slice(uint64_t offset, uint64_t size, std::string_view what) {
  if (!in_bounds(offset, size, what)) return {};
  return bytes_.subspan(static_cast<size_t>(offset), static_cast<size_t>(size));
}

// ---------------------------------------------------------------------------
// Context-free instruction structure

namespace {

// What an operand byte (a..e) holds for a given opcode.
enum class Opd : uint8_t {
  kUnused,    // must be zero
  kReg,       // scalar register, required
  kOptReg,    // scalar register or kNoReg
  kTile,      // tile register
  kLoadArg,   // memory operand read by the instruction: arg index or kConstArg
  kStoreArg,  // memory operand written by the instruction: arg index only
};

// What the sub-op byte holds.
enum class SubKind : uint8_t {
  kUnused,     // must be zero
  kSpecial,    // Special
  kAlu,        // AluOp
  kFalu,       // FaluOp
  kBin,        // BinOp
  kUn,         // UnOp
  kRed,        // RedOp
  kPlainType,  // a plain DType (tile or GM element type)
  kQuantType,  // a block-quantized DType
  kAnyType,    // any DType
};

// What the flags byte may hold.
enum class FlagKind : uint8_t {
  kUnused,         // must be zero
  kBcastOptional,  // kBcastNone, kBcastRow or kBcastCol
  kBcastRequired,  // kBcastRow or kBcastCol
  kMma,            // any combination of kTransB | kAccumulate
  kAccumulate,     // zero or kAccumulate
  kTransOptional,  // zero or kTransB
};

// What the immediate holds.
enum class ImmKind : uint8_t {
  kUnused,      // must be zero
  kAny,         // a free 64-bit value
  kLoopTarget,  // instruction index < num_insns
  kSpecialArg,  // arg index for kArgValue/kArgBytes, zero otherwise
  kTdef,        // packed offset/rows/cols; rows/cols fields zero when taken from registers
};

struct OpSpec {
  std::array<Opd, 5> opd;
  SubKind sub = SubKind::kUnused;
  FlagKind flags = FlagKind::kUnused;
  ImmKind imm = ImmKind::kUnused;
};

constexpr Opd U = Opd::kUnused, R = Opd::kReg, OR = Opd::kOptReg, T = Opd::kTile, LA = Opd::kLoadArg,
              SA = Opd::kStoreArg;

// The operand rules of isa.h, one row per opcode. nullptr: not an opcode.
const OpSpec* op_spec(uint8_t op) {
  static constexpr OpSpec kNone{{U, U, U, U, U}};
  static constexpr OpSpec kLoop{{R, U, U, U, U}, SubKind::kUnused, FlagKind::kUnused, ImmKind::kLoopTarget};
  static constexpr OpSpec kEndLoop{
      {U, U, U, U, U}, SubKind::kUnused, FlagKind::kUnused, ImmKind::kLoopTarget};
  static constexpr OpSpec kLi{{R, U, U, U, U}, SubKind::kUnused, FlagKind::kUnused, ImmKind::kAny};
  static constexpr OpSpec kRegReg{{R, R, U, U, U}};
  static constexpr OpSpec kSpecial{
      {R, U, U, U, U}, SubKind::kSpecial, FlagKind::kUnused, ImmKind::kSpecialArg};
  static constexpr OpSpec kAlu{{R, R, R, U, U}, SubKind::kAlu};
  static constexpr OpSpec kAluI{{R, R, U, U, U}, SubKind::kAlu, FlagKind::kUnused, ImmKind::kAny};
  static constexpr OpSpec kFalu{{R, R, R, U, U}, SubKind::kFalu};
  static constexpr OpSpec kTdef{{T, OR, OR, OR, U}, SubKind::kPlainType, FlagKind::kUnused, ImmKind::kTdef};
  static constexpr OpSpec kTld{{T, LA, R, OR, U}, SubKind::kPlainType};
  static constexpr OpSpec kTst{{T, SA, R, OR, U}, SubKind::kPlainType};
  static constexpr OpSpec kTldq{{T, LA, R, R, U}, SubKind::kQuantType, FlagKind::kTransOptional};
  static constexpr OpSpec kTgather{{T, LA, T, R, U}, SubKind::kAnyType};
  static constexpr OpSpec kTfill{{T, R, U, U, U}};
  static constexpr OpSpec kTileTile{{T, T, U, U, U}};
  static constexpr OpSpec kTbin{{T, T, T, U, U}, SubKind::kBin, FlagKind::kBcastOptional};
  static constexpr OpSpec kTun{{T, T, U, U, U}, SubKind::kUn};
  static constexpr OpSpec kTsop{{T, T, R, U, U}, SubKind::kBin};
  static constexpr OpSpec kTred{{T, T, U, U, U}, SubKind::kRed};
  static constexpr OpSpec kTbcast{{T, T, U, U, U}, SubKind::kUnused, FlagKind::kBcastRequired};
  static constexpr OpSpec kTmma{{T, T, T, U, U}, SubKind::kUnused, FlagKind::kMma};
  static constexpr OpSpec kTget{{R, T, R, U, U}};
  static constexpr OpSpec kTmv{{T, LA, R, R, T}, SubKind::kAnyType, FlagKind::kAccumulate};
  switch (static_cast<Opcode>(op)) {
    case Opcode::kNop:
    case Opcode::kExit:
    case Opcode::kBarrier: return &kNone;
    case Opcode::kLoop: return &kLoop;
    case Opcode::kEndLoop: return &kEndLoop;
    case Opcode::kLi: return &kLi;
    case Opcode::kMov:
    case Opcode::kI2F:
    case Opcode::kF2I: return &kRegReg;
    case Opcode::kSpecial: return &kSpecial;
    case Opcode::kAlu: return &kAlu;
    case Opcode::kAluI: return &kAluI;
    case Opcode::kFalu: return &kFalu;
    case Opcode::kTdef: return &kTdef;
    case Opcode::kTld: return &kTld;
    case Opcode::kTst: return &kTst;
    case Opcode::kTldq: return &kTldq;
    case Opcode::kTgather: return &kTgather;
    case Opcode::kTfill: return &kTfill;
    case Opcode::kTcvt: return &kTileTile;
    case Opcode::kTbin: return &kTbin;
    case Opcode::kTun: return &kTun;
    case Opcode::kTsop: return &kTsop;
    case Opcode::kTred: return &kTred;
    case Opcode::kTbcast: return &kTbcast;
    case Opcode::kTmma: return &kTmma;
    case Opcode::kTget: return &kTget;
    case Opcode::kTmv: return &kTmv;
    case Opcode::kOpcodeEnd: break;
  }
  return nullptr;
}

// Static messages per operand letter, so a core can report them without formatting.
using PerOperand = std::array<const char*, 5>;
constexpr PerOperand kUnusedNonzero = {
    "operand a: unused operand byte is not zero", "operand b: unused operand byte is not zero",
    "operand c: unused operand byte is not zero", "operand d: unused operand byte is not zero",
    "operand e: unused operand byte is not zero"};
constexpr PerOperand kRegRequired = {"operand a: kNoReg where a scalar register is required",
                                     "operand b: kNoReg where a scalar register is required",
                                     "operand c: kNoReg where a scalar register is required",
                                     "operand d: kNoReg where a scalar register is required",
                                     "operand e: kNoReg where a scalar register is required"};
constexpr PerOperand kRegRange = {
    "operand a: scalar register out of range r0..r31", "operand b: scalar register out of range r0..r31",
    "operand c: scalar register out of range r0..r31", "operand d: scalar register out of range r0..r31",
    "operand e: scalar register out of range r0..r31"};
constexpr PerOperand kTileRange = {
    "operand a: tile register out of range t0..t15", "operand b: tile register out of range t0..t15",
    "operand c: tile register out of range t0..t15", "operand d: tile register out of range t0..t15",
    "operand e: tile register out of range t0..t15"};
constexpr PerOperand kArgRange = {
    "operand a: arg index out of range 0..31", "operand b: arg index out of range 0..31",
    "operand c: arg index out of range 0..31", "operand d: arg index out of range 0..31",
    "operand e: arg index out of range 0..31"};
constexpr PerOperand kStoreToConst = {
    "operand a: store into the constant section", "operand b: store into the constant section",
    "operand c: store into the constant section", "operand d: store into the constant section",
    "operand e: store into the constant section"};

InsnIssue check_operand(Opd kind, int index, uint8_t v) {
  const auto i = static_cast<size_t>(index);
  switch (kind) {
    case Opd::kUnused:
      if (v != 0) return {kUnusedNonzero[i], v};
      return {};
    case Opd::kReg:
      if (v == kNoReg) return {kRegRequired[i], v};
      if (v >= kNumScalarRegs) return {kRegRange[i], v};
      return {};
    case Opd::kOptReg:
      if (v != kNoReg && v >= kNumScalarRegs) return {kRegRange[i], v};
      return {};
    case Opd::kTile:
      if (v >= kNumTileRegs) return {kTileRange[i], v};
      return {};
    case Opd::kLoadArg:
      if (v != kConstArg && v >= kMaxArgs) return {kArgRange[i], v};
      return {};
    case Opd::kStoreArg:
      if (v == kConstArg) return {kStoreToConst[i], v};
      if (v >= kMaxArgs) return {kArgRange[i], v};
      return {};
  }
  return {};
}

InsnIssue check_sub(SubKind kind, uint8_t sub) {
  const auto below = [sub](auto end) { return sub < static_cast<uint8_t>(end); };
  const auto type = static_cast<DType>(sub);
  switch (kind) {
    case SubKind::kUnused:
      if (sub != 0) return {"sub-op: unused sub-op is not zero", sub};
      return {};
    case SubKind::kSpecial:
      if (!below(Special::kEnd)) return {"sub-op: not a Special value", sub};
      return {};
    case SubKind::kAlu:
      if (!below(AluOp::kEnd)) return {"sub-op: not an AluOp", sub};
      return {};
    case SubKind::kFalu:
      if (!below(FaluOp::kEnd)) return {"sub-op: not a FaluOp", sub};
      return {};
    case SubKind::kBin:
      if (!below(BinOp::kEnd)) return {"sub-op: not a BinOp", sub};
      return {};
    case SubKind::kUn:
      if (!below(UnOp::kEnd)) return {"sub-op: not a UnOp", sub};
      return {};
    case SubKind::kRed:
      if (!below(RedOp::kEnd)) return {"sub-op: not a RedOp", sub};
      return {};
    case SubKind::kPlainType:
      if (!dtype_is_valid(sub) || !dtype_is_plain(type)) return {"sub-op: dtype is not a plain type", sub};
      return {};
    case SubKind::kQuantType:
      if (!dtype_is_valid(sub) || !dtype_is_quantized(type)) {
        return {"sub-op: dtype is not a quantized type", sub};
      }
      return {};
    case SubKind::kAnyType:
      if (!dtype_is_valid(sub)) return {"sub-op: not a dtype", sub};
      return {};
  }
  return {};
}

InsnIssue check_flags(FlagKind kind, uint8_t flags) {
  switch (kind) {
    case FlagKind::kUnused:
      if (flags != 0) return {"flags: must be zero for this opcode", flags};
      return {};
    case FlagKind::kBcastOptional:
      if (flags > kBcastCol) return {"flags: not kBcastNone, kBcastRow or kBcastCol", flags};
      return {};
    case FlagKind::kBcastRequired:
      if (flags != kBcastRow && flags != kBcastCol) return {"flags: not kBcastRow or kBcastCol", flags};
      return {};
    case FlagKind::kMma:
      if ((flags & ~(kTransB | kAccumulate)) != 0) {
        return {"flags: bits other than kTransB|kAccumulate", flags};
      }
      return {};
    case FlagKind::kAccumulate:
      if ((flags & ~kAccumulate) != 0) return {"flags: bits other than kAccumulate", flags};
      return {};
    case FlagKind::kTransOptional:
      if ((flags & ~kTransB) != 0) return {"flags: bits other than kTransB", flags};
      return {};
  }
  return {};
}

InsnIssue check_imm(ImmKind kind, const Insn& insn, uint32_t num_insns) {
  const int64_t imm = insn.imm;
  switch (kind) {
    case ImmKind::kUnused:
      if (imm != 0) return {"imm: unused immediate is not zero", imm};
      return {};
    case ImmKind::kAny: return {};
    case ImmKind::kLoopTarget:
      if (imm < 0 || imm >= static_cast<int64_t>(num_insns)) return {"imm: loop target out of range", imm};
      return {};
    case ImmKind::kSpecialArg: {
      const bool names_arg = insn.sub == static_cast<uint8_t>(Special::kArgValue) ||
                             insn.sub == static_cast<uint8_t>(Special::kArgBytes);
      if (!names_arg && imm != 0) return {"imm: must be zero for this Special", imm};
      if (names_arg && (imm < 0 || imm >= kMaxArgs)) return {"imm: arg index out of range 0..31", imm};
      return {};
    }
    case ImmKind::kTdef:
      // Fields superseded by a register must be zero: one encoding per program.
      if (insn.b != kNoReg && tdef_rows(imm) != 0) {
        return {"imm: rows field set but rows come from a register", imm};
      }
      if (insn.c != kNoReg && tdef_cols(imm) != 0) {
        return {"imm: cols field set but cols come from a register", imm};
      }
      return {};
  }
  return {};
}

// Per opcode, the operand, sub-op and flag byte values its rules accept, built once
// from the same checks: a valid instruction (nearly every one a core fetches) passes
// with a few table lookups, and only a rejected one runs the checks again for the
// reason.
struct Accepts {
  bool known = false;
  std::array<std::bitset<256>, 5> operand;
  std::bitset<256> sub, flags;
  ImmKind imm = ImmKind::kUnused;
};

const std::array<Accepts, 256>& accepts_table() {
  static const std::array<Accepts, 256> table = [] {
    std::array<Accepts, 256> t{};
    for (int op = 0; op < 256; ++op) {
      const OpSpec* spec = op_spec(static_cast<uint8_t>(op));
      if (spec == nullptr) continue;
      Accepts& a = t[static_cast<size_t>(op)];
      a.known = true;
      a.imm = spec->imm;
      for (int v = 0; v < 256; ++v) {
        const auto byte = static_cast<uint8_t>(v);
        for (int i = 0; i < 5; ++i) {
          a.operand[static_cast<size_t>(i)][byte] = check_operand(spec->opd[static_cast<size_t>(i)], i, byte).ok();
        }
        a.sub[byte] = check_sub(spec->sub, byte).ok();
        a.flags[byte] = check_flags(spec->flags, byte).ok();
      }
    }
    return t;
  }();
  return table;
}

bool structure_accepted(const Insn& insn, uint32_t num_insns) {
  const Accepts& a = accepts_table()[insn.op];
  if (!a.known || !a.operand[0][insn.a] || !a.operand[1][insn.b] || !a.operand[2][insn.c] || !a.operand[3][insn.d] ||
      !a.operand[4][insn.e] || !a.sub[insn.sub] || !a.flags[insn.flags]) {
    return false;
  }
  if (a.imm == ImmKind::kAny) return true;
  if (a.imm == ImmKind::kUnused) return insn.imm == 0;
  return check_imm(a.imm, insn, num_insns).ok();
}

}  // namespace

InsnIssue check_insn_structure(const Insn& insn, uint32_t num_insns) {
  if (structure_accepted(insn, num_insns)) return {};
  const OpSpec* spec = op_spec(insn.op);
  if (spec == nullptr) return {"unknown opcode", insn.op};
  const std::array<uint8_t, 5> operands = {insn.a, insn.b, insn.c, insn.d, insn.e};
  for (int i = 0; i < 5; ++i) {
    InsnIssue issue = check_operand(spec->opd[static_cast<size_t>(i)], i, operands[static_cast<size_t>(i)]);
    if (!issue.ok()) return issue;
  }
  if (InsnIssue issue = check_sub(spec->sub, insn.sub); !issue.ok()) return issue;
  if (InsnIssue issue = check_flags(spec->flags, insn.flags); !issue.ok()) return issue;
  return check_imm(spec->imm, insn, num_insns);
}

const char* insn_structure_error(const Insn& insn, uint32_t num_insns) {
  return check_insn_structure(insn, num_insns).what;
}

RegisterUse register_use(const Insn& insn) {
  const OpSpec* spec = op_spec(insn.op);
  if (spec == nullptr) return {};
  // Every opcode with a scalar register in operand a, except LOOP (its count), writes it.
  const bool writes_a = spec->opd[0] == Opd::kReg && static_cast<Opcode>(insn.op) != Opcode::kLoop;
  const std::array<uint8_t, 5> operands = {insn.a, insn.b, insn.c, insn.d, insn.e};
  RegisterUse use;
  for (size_t i = 0; i < operands.size(); ++i) {
    const Opd kind = spec->opd[i];
    if ((kind != Opd::kReg && kind != Opd::kOptReg) || operands[i] >= kNumScalarRegs) continue;
    uint32_t& mask = i == 0 && writes_a ? use.writes : use.reads;
    mask |= 1u << operands[i];
  }
  return use;
}

uint32_t registers_read_first(std::span<const Insn> code) {
  // written[d]: registers surely written at loop depth d (0: outside every loop).
  std::array<uint32_t, kMaxLoopDepth + 1> written{};
  size_t depth = 0;
  uint32_t read_first = 0;
  for (const Insn& insn : code) {
    const RegisterUse use = register_use(insn);
    read_first |= use.reads & ~written[depth];
    written[depth] |= use.writes;
    if (static_cast<Opcode>(insn.op) == Opcode::kLoop && depth < kMaxLoopDepth) {
      ++depth;
      written[depth] = written[depth - 1];
    } else if (static_cast<Opcode>(insn.op) == Opcode::kEndLoop && depth > 0) {
      --depth;  // the body's writes may not have happened
    }
  }
  return read_first;
}

// ---------------------------------------------------------------------------
// Whole-image verification

namespace {

std::string quoted(std::span<const uint8_t> s) { return "\"" + std::string(s.begin(), s.end()) + "\""; }

struct Section {
  const char* name;
  uint64_t offset;
  uint64_t size;
};

// Sections are already known to lie inside total_bytes (read_image_layout); here we
// only make sure no byte belongs to two of them.
Status check_sections_disjoint(const ImageHeader& h) {
  std::vector<Section> sections = {
      {"header", 0, sizeof(ImageHeader)},
      {"args", h.args_offset, uint64_t{h.num_args} * sizeof(ArgRecord)},
      {"strings", h.strings_offset, h.strings_bytes},
      {"code", h.code_offset, h.code_bytes},
      {"constants", h.const_offset, h.const_bytes},
  };
  // An empty section occupies no bytes and cannot overlap anything.
  std::erase_if(sections, [](const Section& s) { return s.size == 0; });
  std::stable_sort(sections.begin(), sections.end(),
                   [](const Section& x, const Section& y) { return x.offset < y.offset; });
  for (size_t i = 1; i < sections.size(); ++i) {
    const Section& prev = sections[i - 1];
    const Section& next = sections[i];
    if (prev.offset + prev.size <= next.offset) continue;
    return invalid_argument(std::string("image sections overlap: ") + prev.name + " [" +
                            std::to_string(prev.offset) + ", " + std::to_string(prev.offset + prev.size) +
                            ") and " + next.name + " [" + std::to_string(next.offset) + ", " +
                            std::to_string(next.offset + next.size) + ")");
  }
  return ok_status();
}

Status check_string_range(const ImageHeader& h, const std::string& what, uint32_t offset, uint32_t bytes) {
  if (uint64_t{offset} + bytes <= h.strings_bytes) return ok_status();
  return invalid_argument(what + " [name_offset " + std::to_string(offset) + ", name_bytes " +
                          std::to_string(bytes) + ") lies outside the strings section of " +
                          std::to_string(h.strings_bytes) + " bytes");
}

Status check_arg_record(const ImageHeader& h, uint32_t i, const ArgRecord& rec) {
  const std::string where = "arg " + std::to_string(i);
  if (rec.kind > static_cast<uint8_t>(ArgKind::kScalar)) {
    return invalid_argument(where + ": kind " + std::to_string(rec.kind) +
                            " is not buffer (0) or scalar (1)");
  }
  if (rec.access < static_cast<uint8_t>(Access::kIn) || rec.access > static_cast<uint8_t>(Access::kInOut)) {
    return invalid_argument(where + ": access " + std::to_string(rec.access) +
                            " is not in (1), out (2) or inout (3)");
  }
  if (!dtype_is_valid(rec.dtype)) {
    return invalid_argument(where + ": dtype " + std::to_string(rec.dtype) + " is not a dtype");
  }
  if (rec.reserved0 != 0 || rec.reserved1 != 0) {
    return invalid_argument(where + ": reserved fields must be zero (reserved0 " +
                            std::to_string(rec.reserved0) + ", reserved1 " + std::to_string(rec.reserved1) +
                            ")");
  }
  if (rec.kind == static_cast<uint8_t>(ArgKind::kScalar)) {
    const auto dtype = static_cast<DType>(rec.dtype);
    if (dtype != DType::kF32 && dtype != DType::kI32) {
      return invalid_argument(where + ": scalar dtype " + std::string(dtype_name(dtype)) +
                              " is not f32 or i32");
    }
    if (rec.access != static_cast<uint8_t>(Access::kIn)) {
      return invalid_argument(where + ": scalar access " + std::to_string(rec.access) + " is not in (1)");
    }
  }
  return check_string_range(h, where + ": name", rec.name_offset, rec.name_bytes);
}

// Reads and checks every argument record.
StatusOr<std::vector<ArgRecord>> read_arg_records(ByteReader& reader, const ImageHeader& h) {
  std::vector<ArgRecord> records;
  records.reserve(h.num_args);
  for (uint32_t i = 0; i < h.num_args; ++i) {
    const auto rec =
        reader.read<ArgRecord>(uint64_t{h.args_offset} + uint64_t{i} * sizeof(ArgRecord), "arg record");
    NPURT_RETURN_IF_ERROR(reader.status());
    NPURT_RETURN_IF_ERROR(check_arg_record(h, i, rec));
    records.push_back(rec);
  }
  return records;
}

// Walks the code once, checking each instruction in the context of the image.
class CodeVerifier {
 public:
  CodeVerifier(ByteReader& reader, const ImageHeader& h, std::span<const uint8_t> strings,
               const std::vector<ArgRecord>& args, uint32_t max_local_bytes)
      : reader_(reader),
        h_(h),
        strings_(strings),
        args_(args),
        max_local_bytes_(max_local_bytes),
        num_insns_(h.code_bytes / static_cast<uint32_t>(kInsnBytes)) {}

  Status run() {
    for (uint32_t i = 0; i < num_insns_; ++i) {
      const auto insn =
          reader_.read<Insn>(uint64_t{h_.code_offset} + uint64_t{i} * kInsnBytes, "instruction");
      NPURT_RETURN_IF_ERROR(reader_.status());
      NPURT_RETURN_IF_ERROR(check(i, insn));
    }
    if (!open_loops_.empty()) {
      const OpenLoop& loop = open_loops_.back();
      return invalid_argument(prefix(loop.index, Opcode::kLoop) +
                              "loop runs past the end of code (end index " + std::to_string(loop.end) +
                              " never closes it)");
    }
    return check_barrier_flag();
  }

 private:
  struct OpenLoop {
    uint32_t index;  // of the LOOP
    int64_t end;     // its imm: where it says its ENDLOOP is
  };

  static std::string prefix(uint32_t index, Opcode op) {
    return "insn " + std::to_string(index) + " (" + std::string(opcode_name(static_cast<uint8_t>(op))) +
           "): ";
  }

  Status check(uint32_t i, const Insn& insn) {
    const InsnIssue issue = check_insn_structure(insn, num_insns_);
    if (!issue.ok()) {
      return invalid_argument("insn " + std::to_string(i) + " (" + std::string(opcode_name(insn.op)) +
                              "): " + issue.what + " (got " + std::to_string(issue.value) + ")");
    }
    const auto op = static_cast<Opcode>(insn.op);
    switch (op) {
      case Opcode::kBarrier:
        if (!first_barrier_) first_barrier_ = i;
        return ok_status();
      case Opcode::kLoop: return open_loop(i, insn);
      case Opcode::kEndLoop: return close_loop(i, insn);
      case Opcode::kSpecial: return check_special(i, insn);
      case Opcode::kTdef: return check_tdef(i, insn);
      case Opcode::kTld:
      case Opcode::kTldq:
      case Opcode::kTgather:
      case Opcode::kTmv: return check_memory(i, op, insn.b, /*store=*/false);
      case Opcode::kTst: return check_memory(i, op, insn.b, /*store=*/true);
      default: return ok_status();
    }
  }

  Status open_loop(uint32_t i, const Insn& insn) {
    if (open_loops_.size() >= static_cast<size_t>(kMaxLoopDepth)) {
      return invalid_argument(prefix(i, Opcode::kLoop) + "loop nesting depth exceeds " +
                              std::to_string(kMaxLoopDepth));
    }
    if (insn.imm <= static_cast<int64_t>(i)) {
      return invalid_argument(prefix(i, Opcode::kLoop) + "imm: end index " + std::to_string(insn.imm) +
                              " is not after the LOOP");
    }
    open_loops_.push_back({i, insn.imm});
    return ok_status();
  }

  Status close_loop(uint32_t i, const Insn& insn) {
    if (open_loops_.empty()) {
      return invalid_argument(prefix(i, Opcode::kEndLoop) + "no open LOOP to close (imm " +
                              std::to_string(insn.imm) + ")");
    }
    const OpenLoop loop = open_loops_.back();
    open_loops_.pop_back();
    if (insn.imm != static_cast<int64_t>(loop.index)) {
      return invalid_argument(prefix(i, Opcode::kEndLoop) + "imm: start index " + std::to_string(insn.imm) +
                              " is not the innermost open LOOP (insn " + std::to_string(loop.index) + ")");
    }
    if (loop.end != static_cast<int64_t>(i)) {
      return invalid_argument(prefix(loop.index, Opcode::kLoop) + "imm: end index " +
                              std::to_string(loop.end) + " but the matching ENDLOOP is insn " +
                              std::to_string(i));
    }
    return ok_status();
  }

  Status check_special(uint32_t i, const Insn& insn) const {
    const auto which = static_cast<Special>(insn.sub);
    if (which != Special::kArgValue && which != Special::kArgBytes) return ok_status();
    if (insn.imm < static_cast<int64_t>(args_.size())) return ok_status();
    return invalid_argument(prefix(i, Opcode::kSpecial) + "imm: arg index " + std::to_string(insn.imm) +
                            " >= num_args " + std::to_string(args_.size()));
  }

  std::string arg_label(uint8_t index) const {
    const ArgRecord& rec = args_[index];
    return "arg " + std::to_string(index) + " " + quoted(strings_.subspan(rec.name_offset, rec.name_bytes));
  }

  Status check_memory(uint32_t i, Opcode op, uint8_t arg, bool store) const {
    // Structure already rules out kConstArg for stores.
    if (arg == kConstArg) return ok_status();
    if (arg >= args_.size()) {
      return invalid_argument(prefix(i, op) + "operand b: arg index " + std::to_string(arg) +
                              " >= num_args " + std::to_string(args_.size()));
    }
    const ArgRecord& rec = args_[arg];
    if (rec.kind != static_cast<uint8_t>(ArgKind::kBuffer)) {
      return invalid_argument(prefix(i, op) + "operand b: " + arg_label(arg) + " is a scalar, not a buffer");
    }
    if (store && rec.access == static_cast<uint8_t>(Access::kIn)) {
      return invalid_argument(prefix(i, op) + "operand b: store into `in` " + arg_label(arg));
    }
    if (!store && rec.access == static_cast<uint8_t>(Access::kOut)) {
      return invalid_argument(prefix(i, op) + "operand b: load from `out` " + arg_label(arg) +
                              " (an out argument may not be read)");
    }
    return ok_status();
  }

  // Without an offset register a tile's offset is static and must be aligned to its
  // element size; with an immediate shape as well its extent is static, and the
  // header's local_bytes must cover it so the device can reserve it up front.
  Status check_tdef(uint32_t i, const Insn& insn) const {
    if (insn.d != kNoReg) return ok_status();
    const auto dtype = static_cast<DType>(insn.sub);
    const uint64_t begin = tdef_offset(insn.imm);
    if (begin % dtype_size(dtype) != 0) {
      return invalid_argument(prefix(i, Opcode::kTdef) + "imm: local offset " + std::to_string(begin) +
                              " is not a multiple of the " + std::string(dtype_name(dtype)) +
                              " element size " + std::to_string(dtype_size(dtype)));
    }
    if (insn.b != kNoReg || insn.c != kNoReg) return ok_status();
    const uint64_t size = uint64_t{tdef_rows(insn.imm)} * tdef_cols(insn.imm) * dtype_size(dtype);
    const uint64_t end = begin + size;
    const std::string range =
        "tile at local bytes [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
    if (end > max_local_bytes_) {
      return resource_exhausted(prefix(i, Opcode::kTdef) + range + " exceeds the device's " +
                                std::to_string(max_local_bytes_) + " bytes of local memory");
    }
    if (end > h_.local_bytes) {
      return invalid_argument(prefix(i, Opcode::kTdef) + range + " exceeds header local_bytes " +
                              std::to_string(h_.local_bytes));
    }
    return ok_status();
  }

  Status check_barrier_flag() const {
    const bool flagged = (h_.flags & kImageUsesBarrier) != 0;
    if (first_barrier_ && !flagged) {
      return invalid_argument("code has a BARRIER (insn " + std::to_string(*first_barrier_) +
                              ") but header flag kImageUsesBarrier is not set (flags " +
                              std::to_string(h_.flags) + ")");
    }
    if (!first_barrier_ && flagged) {
      return invalid_argument("header flag kImageUsesBarrier is set (flags " + std::to_string(h_.flags) +
                              ") but code has no BARRIER");
    }
    return ok_status();
  }

  ByteReader& reader_;
  const ImageHeader& h_;
  std::span<const uint8_t> strings_;
  const std::vector<ArgRecord>& args_;
  uint32_t max_local_bytes_;
  uint32_t num_insns_;
  std::vector<OpenLoop> open_loops_;
  std::optional<uint32_t> first_barrier_;
};

}  // namespace

Status verify_image(std::span<const uint8_t> bytes, uint32_t max_local_bytes) {
  NPURT_ASSIGN_OR_RETURN(const ImageLayout layout, read_image_layout(bytes));
  if (bytes.size() != layout.total_bytes) {
    return invalid_argument("image is " + std::to_string(bytes.size()) + " bytes but header total_bytes is " +
                            std::to_string(layout.total_bytes));
  }
  ByteReader reader(bytes);
  const auto h = reader.read<ImageHeader>(0, "image header");
  NPURT_RETURN_IF_ERROR(reader.status());
  NPURT_RETURN_IF_ERROR(check_sections_disjoint(h));
  NPURT_RETURN_IF_ERROR(check_string_range(h, "kernel name", h.name_offset, h.name_bytes));
  const std::span<const uint8_t> strings = reader.slice(h.strings_offset, h.strings_bytes, "strings section");
  NPURT_RETURN_IF_ERROR(reader.status());
  NPURT_ASSIGN_OR_RETURN(const std::vector<ArgRecord> args, read_arg_records(reader, h));
  // Code first: a tile that does not fit is reported with its instruction, which
  // says more than the header total it caused.
  NPURT_RETURN_IF_ERROR(CodeVerifier(reader, h, strings, args, max_local_bytes).run());
  if (h.local_bytes > max_local_bytes) {
    return resource_exhausted("header local_bytes " + std::to_string(h.local_bytes) +
                              " exceeds the device's " + std::to_string(max_local_bytes) +
                              " bytes of local memory");
  }
  return ok_status();
}

}  // namespace npurt::isa
