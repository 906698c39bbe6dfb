#include "npurt/comm/communicator.h"

namespace npurt::comm {

uint64_t reduce_element_bytes(isa::DType dtype) {
  switch (dtype) {
    case isa::DType::kF32: return 4;
    case isa::DType::kBF16: return 2;
    default: return 0;
  }
}

}  // namespace npurt::comm
