#include "npurt/isa/isa.h"

namespace npurt::isa {
namespace {

// Geometry of one element type. Block sizes of the quantized types follow the GGML
// block layouts byte for byte, so GGUF tensors can be loaded without repacking.
struct DTypeInfo {
  std::string_view name;
  size_t elem_bytes;   // plain types; 0 for quantized
  size_t block_elems;  // 1 for plain
  size_t block_bytes;  // == elem_bytes for plain
};

// Returns nullptr for codes that are not a DType.
const DTypeInfo* dtype_info(uint8_t code) {
  static constexpr DTypeInfo kF32{"f32", 4, 1, 4};
  static constexpr DTypeInfo kBF16{"bf16", 2, 1, 2};
  static constexpr DTypeInfo kF16{"f16", 2, 1, 2};
  static constexpr DTypeInfo kI32{"i32", 4, 1, 4};
  static constexpr DTypeInfo kQ8_0{"q8_0", 0, 32, 34};    // f16 scale + 32 x i8
  static constexpr DTypeInfo kQ4_0{"q4_0", 0, 32, 18};    // f16 scale + 16 B nibbles
  static constexpr DTypeInfo kQ5_0{"q5_0", 0, 32, 22};    // f16 scale + 4 B high bits + 16 B
  static constexpr DTypeInfo kQ4_K{"q4_K", 0, 256, 144};  // 2 x f16 + 12 B scales + 128 B
  static constexpr DTypeInfo kQ5_K{"q5_K", 0, 256, 176};  // q4_K + 32 B high bits
  static constexpr DTypeInfo kQ6_K{"q6_K", 0, 256, 210};  // 128 + 64 + 16 B scales + f16
  switch (static_cast<DType>(code)) {
    case DType::kF32: return &kF32;
    case DType::kBF16: return &kBF16;
    case DType::kF16: return &kF16;
    case DType::kI32: return &kI32;
    case DType::kQ8_0: return &kQ8_0;
    case DType::kQ4_0: return &kQ4_0;
    case DType::kQ5_0: return &kQ5_0;
    case DType::kQ4_K: return &kQ4_K;
    case DType::kQ5_K: return &kQ5_K;
    case DType::kQ6_K: return &kQ6_K;
  }
  return nullptr;
}

}  // namespace

bool dtype_is_valid(uint8_t code) { return dtype_info(code) != nullptr; }

bool dtype_is_plain(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint8_t>(t));
  return info != nullptr && info->elem_bytes != 0;
}

bool dtype_is_quantized(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint8_t>(t));
  return info != nullptr && info->elem_bytes == 0;
}

size_t dtype_size(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint8_t>(t));
  return info != nullptr ? info->elem_bytes : 0;
}

size_t dtype_block_elems(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint8_t>(t));
  return info != nullptr ? info->block_elems : 0;
}

size_t dtype_block_bytes(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint8_t>(t));
  return info != nullptr ? info->block_bytes : 0;
}

std::string_view dtype_name(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint8_t>(t));
  return info != nullptr ? info->name : std::string_view("invalid");
}

std::string_view opcode_name(uint8_t op) {
  switch (static_cast<Opcode>(op)) {
    case Opcode::kNop: return "NOP";
    case Opcode::kExit: return "EXIT";
    case Opcode::kBarrier: return "BARRIER";
    case Opcode::kLoop: return "LOOP";
    case Opcode::kEndLoop: return "ENDLOOP";
    case Opcode::kLi: return "LI";
    case Opcode::kMov: return "MOV";
    case Opcode::kSpecial: return "SPECIAL";
    case Opcode::kAlu: return "ALU";
    case Opcode::kAluI: return "ALUI";
    case Opcode::kFalu: return "FALU";
    case Opcode::kI2F: return "I2F";
    case Opcode::kF2I: return "F2I";
    case Opcode::kTdef: return "TDEF";
    case Opcode::kTld: return "TLD";
    case Opcode::kTst: return "TST";
    case Opcode::kTldq: return "TLDQ";
    case Opcode::kTgather: return "TGATHER";
    case Opcode::kTmv: return "TMV";
    case Opcode::kTfill: return "TFILL";
    case Opcode::kTcvt: return "TCVT";
    case Opcode::kTbin: return "TBIN";
    case Opcode::kTun: return "TUN";
    case Opcode::kTsop: return "TSOP";
    case Opcode::kTred: return "TRED";
    case Opcode::kTbcast: return "TBCAST";
    case Opcode::kTmma: return "TMMA";
    case Opcode::kTget: return "TGET";
    case Opcode::kOpcodeEnd: break;
  }
  return "UNKNOWN";
}

}  // namespace npurt::isa
