#include "npurt/hal/device.h"

#include <cstring>

namespace npurt::hal {

KernelArg KernelArg::scalar_f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return {true, 0, 0, bits};
}

}  // namespace npurt::hal
