#include "npurt/isa/builder.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "npurt/base/math.h"

namespace npurt::isa {
namespace {

constexpr uint8_t u8(auto e) { return static_cast<uint8_t>(e); }

// Placeholder target of a LOOP whose loop_end() has not been seen; out of range for
// any code, so an unclosed loop can never pass verification by accident.
constexpr int64_t kOpenLoopTarget = -1;

uint8_t opt(std::optional<Reg> r) { return r ? r->index : kNoReg; }

// Byte positions of every section, computed once so build() can check the total
// before build_unverified() writes 32-bit fields.
struct Placement {
  uint64_t args_offset = sizeof(ImageHeader);
  uint64_t strings_offset = 0;
  uint64_t strings_bytes = 0;
  uint64_t code_offset = 0;
  uint64_t code_bytes = 0;
  uint64_t const_offset = 0;
  uint64_t const_bytes = 0;
  uint64_t total_bytes = 0;
};

Placement place(const std::string& name, const std::vector<ArgSpec>& args, size_t num_insns,
                size_t const_bytes) {
  Placement p;
  p.strings_offset = p.args_offset + args.size() * sizeof(ArgRecord);
  p.strings_bytes = name.size();
  for (const ArgSpec& a : args) p.strings_bytes += a.name.size();
  p.code_offset = round_up(p.strings_offset + p.strings_bytes, 16);
  p.code_bytes = num_insns * kInsnBytes;
  p.const_offset = round_up(p.code_offset + p.code_bytes, 16);
  p.const_bytes = const_bytes;
  p.total_bytes = p.const_offset + p.const_bytes;
  return p;
}

template <typename T>
void put(std::vector<uint8_t>& out, uint64_t offset, const T& value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

}  // namespace

KernelBuilder::KernelBuilder(std::string name) : name_(std::move(name)) {}

void KernelBuilder::fail(std::string message) {
  if (first_error_.ok()) first_error_ = invalid_argument("kernel \"" + name_ + "\": " + message);
}

uint8_t KernelBuilder::add_arg(std::string name, ArgKind kind, Access access, DType dtype) {
  if (args_.size() >= static_cast<size_t>(kMaxArgs)) {
    fail("more than " + std::to_string(kMaxArgs) + " arguments (adding \"" + name + "\")");
  }
  args_.push_back(ArgSpec{std::move(name), kind, access, dtype});
  return static_cast<uint8_t>(args_.size() - 1);
}

uint8_t KernelBuilder::arg_buffer(std::string name, Access access, DType dtype) {
  return add_arg(std::move(name), ArgKind::kBuffer, access, dtype);
}

uint8_t KernelBuilder::arg_scalar(std::string name, DType dtype) {
  return add_arg(std::move(name), ArgKind::kScalar, Access::kIn, dtype);
}

uint32_t KernelBuilder::add_constants(std::span<const uint8_t> bytes) {
  constants_.resize(round_up(constants_.size(), 16), 0);
  const size_t offset = constants_.size();
  constants_.insert(constants_.end(), bytes.begin(), bytes.end());
  if (constants_.size() > kMaxImageBytes) {
    fail("constants exceed " + std::to_string(kMaxImageBytes) + " bytes");
  }
  return static_cast<uint32_t>(std::min<size_t>(offset, std::numeric_limits<uint32_t>::max()));
}

void KernelBuilder::reserve_local(uint32_t bytes) { reserved_local_ = std::max(reserved_local_, bytes); }

uint32_t KernelBuilder::emit(const Insn& insn) {
  code_.push_back(insn);
  return static_cast<uint32_t>(code_.size() - 1);
}

// ---- control ----

void KernelBuilder::nop() { emit(make_insn(Opcode::kNop)); }
void KernelBuilder::exit() { emit(make_insn(Opcode::kExit)); }
void KernelBuilder::barrier() { emit(make_insn(Opcode::kBarrier)); }

void KernelBuilder::loop_begin(Reg count) {
  open_loops_.push_back(emit(make_insn(Opcode::kLoop, count.index, 0, 0, 0, 0, 0, kOpenLoopTarget)));
}

void KernelBuilder::loop_end() {
  if (open_loops_.empty()) {
    fail("loop_end() at insn " + std::to_string(code_.size()) + " without a loop_begin()");
    return;
  }
  const uint32_t start = open_loops_.back();
  open_loops_.pop_back();
  const uint32_t end = emit(make_insn(Opcode::kEndLoop, 0, 0, 0, 0, 0, 0, start));
  code_[start].imm = end;
}

// ---- scalar ----

void KernelBuilder::li(Reg dst, int64_t value) {
  emit(make_insn(Opcode::kLi, dst.index, 0, 0, 0, 0, 0, value));
}
void KernelBuilder::mov(Reg dst, Reg src) { emit(make_insn(Opcode::kMov, dst.index, src.index)); }

void KernelBuilder::special(Reg dst, Special which, int64_t arg_index) {
  emit(make_insn(Opcode::kSpecial, dst.index, 0, 0, 0, u8(which), 0, arg_index));
}

void KernelBuilder::alu(AluOp op, Reg dst, Reg lhs, Reg rhs) {
  emit(make_insn(Opcode::kAlu, dst.index, lhs.index, rhs.index, 0, u8(op)));
}

void KernelBuilder::alui(AluOp op, Reg dst, Reg lhs, int64_t imm) {
  emit(make_insn(Opcode::kAluI, dst.index, lhs.index, 0, 0, u8(op), 0, imm));
}

void KernelBuilder::falu(FaluOp op, Reg dst, Reg lhs, Reg rhs) {
  emit(make_insn(Opcode::kFalu, dst.index, lhs.index, rhs.index, 0, u8(op)));
}

void KernelBuilder::i2f(Reg dst, Reg src) { emit(make_insn(Opcode::kI2F, dst.index, src.index)); }
void KernelBuilder::f2i(Reg dst, Reg src) { emit(make_insn(Opcode::kF2I, dst.index, src.index)); }

// ---- tiles ----

void KernelBuilder::tdef(Tile t, DType dtype, Dim rows, Dim cols, uint32_t local_offset,
                         std::optional<Reg> offset_reg) {
  const auto encodable = [](const Dim& d) {
    return d.reg != kNoReg || (d.imm >= 0 && d.imm <= std::numeric_limits<uint16_t>::max());
  };
  if (!encodable(rows) || !encodable(cols)) {
    fail("tdef at insn " + std::to_string(code_.size()) + ": shape " + std::to_string(rows.imm) + " x " +
         std::to_string(cols.imm) + " does not fit 16-bit immediates");
  }
  // A dimension taken from a register leaves its immediate field zero.
  const auto field = [](const Dim& d) { return static_cast<uint16_t>(d.reg == kNoReg ? d.imm : 0); };
  emit(make_insn(Opcode::kTdef, t.index, rows.reg, cols.reg, opt(offset_reg), u8(dtype), 0,
            tdef_imm(local_offset, field(rows), field(cols))));
}

void KernelBuilder::tld(Tile dst, uint8_t arg, Reg offset, DType gm_dtype, std::optional<Reg> row_stride) {
  emit(make_insn(Opcode::kTld, dst.index, arg, offset.index, opt(row_stride), u8(gm_dtype)));
}

void KernelBuilder::tst(Tile src, uint8_t arg, Reg offset, DType gm_dtype, std::optional<Reg> row_stride) {
  emit(make_insn(Opcode::kTst, src.index, arg, offset.index, opt(row_stride), u8(gm_dtype)));
}

void KernelBuilder::tldq(Tile dst, uint8_t arg, Reg offset, Reg row_stride_bytes, DType quant_dtype,
                         bool transposed) {
  emit(make_insn(Opcode::kTldq, dst.index, arg, offset.index, row_stride_bytes.index, u8(quant_dtype),
            transposed ? kTransB : uint8_t{0}));
}

void KernelBuilder::tgather(Tile dst, uint8_t arg, Tile indices, Reg row_pitch_bytes, DType gm_dtype) {
  emit(make_insn(Opcode::kTgather, dst.index, arg, indices.index, row_pitch_bytes.index, u8(gm_dtype)));
}

void KernelBuilder::tfill(Tile dst, Reg value) { emit(make_insn(Opcode::kTfill, dst.index, value.index)); }
void KernelBuilder::tcvt(Tile dst, Tile src) { emit(make_insn(Opcode::kTcvt, dst.index, src.index)); }

void KernelBuilder::tbin(BinOp op, Tile dst, Tile lhs, Tile rhs, uint8_t bcast) {
  emit(make_insn(Opcode::kTbin, dst.index, lhs.index, rhs.index, 0, u8(op), bcast));
}

void KernelBuilder::tun(UnOp op, Tile dst, Tile src) {
  emit(make_insn(Opcode::kTun, dst.index, src.index, 0, 0, u8(op)));
}

void KernelBuilder::tsop(BinOp op, Tile dst, Tile src, Reg scalar) {
  emit(make_insn(Opcode::kTsop, dst.index, src.index, scalar.index, 0, u8(op)));
}

void KernelBuilder::tred(RedOp op, Tile dst, Tile src) {
  emit(make_insn(Opcode::kTred, dst.index, src.index, 0, 0, u8(op)));
}

void KernelBuilder::tbcast(Tile dst, Tile src, uint8_t bcast) {
  emit(make_insn(Opcode::kTbcast, dst.index, src.index, 0, 0, 0, bcast));
}

void KernelBuilder::tmma(Tile acc, Tile lhs, Tile rhs, uint8_t flags) {
  emit(make_insn(Opcode::kTmma, acc.index, lhs.index, rhs.index, 0, 0, flags));
}

void KernelBuilder::tget(Reg dst, Tile src, Reg flat_index) {
  emit(make_insn(Opcode::kTget, dst.index, src.index, flat_index.index));
}

void KernelBuilder::tmv(Tile acc, uint8_t arg, Reg offset, Reg row_stride_bytes, Tile x, DType gm_dtype,
                        bool accumulate) {
  Insn insn = make_insn(Opcode::kTmv, acc.index, arg, offset.index, row_stride_bytes.index, u8(gm_dtype));
  insn.e = x.index;
  insn.flags = accumulate ? kAccumulate : 0;
  emit(insn);
}

// ---- output ----

// The largest end of any tile whose placement is fully static, plus reserve_local().
uint32_t KernelBuilder::static_local_bytes() const {
  uint64_t extent = reserved_local_;
  for (const Insn& insn : code_) {
    if (insn.op != u8(Opcode::kTdef) || insn.b != kNoReg || insn.c != kNoReg || insn.d != kNoReg) continue;
    const uint64_t size =
        uint64_t{tdef_rows(insn.imm)} * tdef_cols(insn.imm) * dtype_size(static_cast<DType>(insn.sub));
    extent = std::max(extent, uint64_t{tdef_offset(insn.imm)} + size);
  }
  // Saturate: an extent this large fails verification against any device anyway.
  return static_cast<uint32_t>(std::min<uint64_t>(extent, std::numeric_limits<uint32_t>::max()));
}

std::vector<uint8_t> KernelBuilder::build_unverified() const {
  const Placement p = place(name_, args_, code_.size(), constants_.size());
  std::vector<uint8_t> out(static_cast<size_t>(p.total_bytes), 0);
  const auto u32 = [](uint64_t v) { return static_cast<uint32_t>(v); };

  bool barrier = false;
  for (const Insn& insn : code_) barrier = barrier || insn.op == u8(Opcode::kBarrier);

  ImageHeader h{};
  h.magic = kImageMagic;
  h.version = kImageVersion;
  h.flags = barrier ? kImageUsesBarrier : 0;
  h.total_bytes = u32(p.total_bytes);
  h.name_offset = 0;
  h.name_bytes = u32(name_.size());
  h.args_offset = u32(p.args_offset);
  h.num_args = u32(args_.size());
  h.strings_offset = u32(p.strings_offset);
  h.strings_bytes = u32(p.strings_bytes);
  h.code_offset = u32(p.code_offset);
  h.code_bytes = u32(p.code_bytes);
  h.const_offset = u32(p.const_offset);
  h.const_bytes = u32(p.const_bytes);
  h.local_bytes = static_local_bytes();
  put(out, 0, h);

  // Strings: the kernel name, then each argument's name, unterminated.
  uint64_t str = name_.size();
  std::memcpy(out.data() + p.strings_offset, name_.data(), name_.size());
  for (size_t i = 0; i < args_.size(); ++i) {
    const ArgSpec& a = args_[i];
    ArgRecord rec{};
    rec.kind = u8(a.kind);
    rec.access = u8(a.access);
    rec.dtype = u8(a.dtype);
    rec.name_offset = u32(str);
    rec.name_bytes = u32(a.name.size());
    put(out, p.args_offset + i * sizeof(ArgRecord), rec);
    std::memcpy(out.data() + p.strings_offset + str, a.name.data(), a.name.size());
    str += a.name.size();
  }
  if (!code_.empty()) std::memcpy(out.data() + p.code_offset, code_.data(), p.code_bytes);
  if (!constants_.empty()) std::memcpy(out.data() + p.const_offset, constants_.data(), p.const_bytes);
  return out;
}

StatusOr<Image> KernelBuilder::build(uint32_t max_local_bytes) const {
  NPURT_RETURN_IF_ERROR(first_error_);
  if (!open_loops_.empty()) {
    return invalid_argument("kernel \"" + name_ + "\": loop_begin() at insn " +
                            std::to_string(open_loops_.back()) + " has no loop_end()");
  }
  const Placement p = place(name_, args_, code_.size(), constants_.size());
  if (p.total_bytes > kMaxImageBytes) {
    return invalid_argument("kernel \"" + name_ + "\": image would be " + std::to_string(p.total_bytes) +
                            " bytes, more than the " + std::to_string(kMaxImageBytes) + "-byte limit");
  }
  StatusOr<Image> image = Image::from_bytes(build_unverified(), max_local_bytes);
  if (!image.ok()) return image.status().with_context("kernel \"" + name_ + "\"");
  return image;
}

}  // namespace npurt::isa
