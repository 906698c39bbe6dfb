// Tests of the layers below the Runtime make registries, pools and workers themselves.
#pragma once

#include "npurt/exec/factory_key.h"

namespace npurt::testing {

struct ExecFactory {
  static exec::FactoryKey key() { return {}; }
};

}  // namespace npurt::testing
