#include "npurt/isa/names.h"

#include <span>
#include <string>

#include "isa/mnemonics.h"

namespace npurt::isa {
namespace {

std::span<const std::string_view> names_of(SubOpFamily family) {
  switch (family) {
    case SubOpFamily::kSpecial: return mnemonics::kSpecial;
    case SubOpFamily::kAlu: return mnemonics::kAlu;
    case SubOpFamily::kFalu: return mnemonics::kFalu;
    case SubOpFamily::kBin: return mnemonics::kBin;
    case SubOpFamily::kUn: return mnemonics::kUn;
    case SubOpFamily::kRed: return mnemonics::kRed;
  }
  return {};
}

std::string_view family_name(SubOpFamily family) {
  switch (family) {
    case SubOpFamily::kSpecial: return "special";
    case SubOpFamily::kAlu: return "alu";
    case SubOpFamily::kFalu: return "falu";
    case SubOpFamily::kBin: return "tile binary";
    case SubOpFamily::kUn: return "tile unary";
    case SubOpFamily::kRed: return "reduction";
  }
  return "?";
}

}  // namespace

StatusOr<uint8_t> parse_sub_op(SubOpFamily family, std::string_view name) {
  const std::span<const std::string_view> names = names_of(family);
  if (const std::optional<uint8_t> code = mnemonics::find(names, name)) return *code;
  return invalid_argument("unknown " + std::string(family_name(family)) + " op '" + std::string(name) +
                          "' (one of: " + mnemonics::listed(names) + ")");
}

}  // namespace npurt::isa
