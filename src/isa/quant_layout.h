// Bit layouts of the K-quant blocks, shared by the reference decoder (quant.cc) and
// the simulator's vector kernels so that both read the same bits the same way.
#pragma once

#include <cstdint>

namespace npurt::isa {

// The 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes of a Q4_K /
// Q5_K block.
inline void scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The 128 signed values of one half of a Q6_K block, from that half's 64 ql and 32 qh
// bytes: q[32k + l] is the spec's q(k+1) for position l.
inline void unpack_q6_k_half(const uint8_t* ql, const uint8_t* qh, int8_t* q) {
  for (int l = 0; l < 32; ++l) {
    q[l] = static_cast<int8_t>(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
    q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
    q[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
    q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
  }
}

}  // namespace npurt::isa
