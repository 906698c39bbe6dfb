// ||got - want|| / ||want||, summed in double: how every numeric test compares a
// device result with its host reference.
#pragma once

#include <cmath>
#include <cstddef>

namespace npurt::testing {

template <typename Got, typename Want>
double rel_l2(const Got& got, const Want& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::size(want); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    num += d * d;
    den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(num / den);
}

}  // namespace npurt::testing
