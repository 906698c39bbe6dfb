// The quantized row kernels of sim::matvec, on the lanes of matvec_kernels.cc.
// Included only by matvec_kernels.cc, inside a namespace per form (no include guard):
// NPURT_MV_DOT names the digit product (DotDigitsMadd or DotDigitsVnni) and
// NPURT_MV_ATTR the function attribute that product needs.
//
// Each type cuts a row into units (a K block, or two Q*_0 blocks) of pieces of 64
// values; Piece gives the piece's unsigned weight bytes in the order the prepared x's
// digits follow, Scale the per-lane d (or d * sc) of those bytes.

// Q8_0 (kBits 8), Q4_0 (4), Q5_0 (5): a unit is two blocks, a and b (b == a for the
// odd last block of a row, whose second half then adds nothing); its one piece holds
// block a's 32 values in bytes 0..31 and b's in 32..63. w: [d_a x 8, d_b x 8].
template <int kBits>
struct Q0 {
  static constexpr size_t kBlockBytes = kBits == 8 ? sizeof(isa::BlockQ8_0)
                                        : kBits == 4 ? sizeof(isa::BlockQ4_0)
                                                     : sizeof(isa::BlockQ5_0);
  static constexpr size_t kUnitBytes = 2 * kBlockBytes, kPieces = 1;
  static constexpr Layout kLayout{64, 32, kBits == 8 ? 128 : kBits == 4 ? 8 : 16, false, false};
  static constexpr const int32_t* kIndex = nullptr;  // w is per lane already
  static HWY_INLINE FV Load(const uint8_t* a, const uint8_t* b) { return HalvesAt(a, b); }
  static HWY_INLINE BV Piece(const uint8_t* a, const uint8_t* b, size_t) {
    if constexpr (kBits == 8) {
      return XorB(LoadB2(a + offsetof(isa::BlockQ8_0, qs), b + offsetof(isa::BlockQ8_0, qs)), 0x80);
    } else if constexpr (kBits == 4) {
      return NibblePairs(a + offsetof(isa::BlockQ4_0, qs), b + offsetof(isa::BlockQ4_0, qs));
    } else {
      const BV v = NibblePairs(a + offsetof(isa::BlockQ5_0, qs), b + offsetof(isa::BlockQ5_0, qs));
      return AddSixteenWhere(v, a + offsetof(isa::BlockQ5_0, qh), b + offsetof(isa::BlockQ5_0, qh));
    }
  }
};

// Lane permutations from a unit's per-group scales to a piece's lanes.
// Q4_K / Q5_K piece p: sub-block j = 4 (p / 2) + p % 2 in lanes 0..7, j + 2 in 8..15.
alignas(64) constexpr int32_t kIndexK[4][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2},
                                                {1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3},
                                                {4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6},
                                                {5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7}};
// Q6_K piece p: lane l is group 4 p + l / 4.
alignas(64) constexpr int32_t kIndexQ6[4][16] = {{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                                 {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
                                                 {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
                                                 {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};

// Q4_K (kFifthBit false) and Q5_K: pieces 0..3 are the low, high, low, high nibbles of
// qs bytes 0..63, 0..63, 64..127, 64..127 (kIndexK). w: [d * sc_0..7, dmin * m_0..7].
template <bool kFifthBit>
struct QK {
  using Block = std::conditional_t<kFifthBit, isa::BlockQ5_K, isa::BlockQ4_K>;
  static constexpr size_t kUnitBytes = sizeof(Block), kPieces = 4;
  static constexpr Layout kLayout{256, 32, 0, true, true};
  static constexpr const int32_t (*kIndex)[16] = kIndexK;
  static HWY_INLINE FV Load(const uint8_t* a, const uint8_t*) {
    // The 6-bit scales and mins by 32-bit word operations: bytes sc_0..7, m_0..7.
    uint32_t u[4];
    std::memcpy(u, a + offsetof(Block, scales), 12);
    constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
    const uint32_t mins_lo = u[1] & kLow6;
    u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
    u[2] = mins_lo;
    u[0] &= kLow6;
    return ScaleBytes<false>(u, HalvesAt(a + offsetof(Block, d), a + offsetof(Block, dmin)));
  }
  static HWY_INLINE BV Piece(const uint8_t* a, const uint8_t*, size_t p) {
    const BV w = LoadB(a + offsetof(Block, qs) + 64 * (p / 2));
    BV q = p % 2 == 0 ? AndB(w, 15) : HighNibbles(w);
    if constexpr (kFifthBit) {
      // Bit j of qh[l] is the fifth bit of value l of sub-block j.
      const int j = static_cast<int>(4 * (p / 2) + p % 2);
      const BV h = AndB(ShiftRightHalves(BroadcastB(a + offsetof(isa::BlockQ5_K, qh)), j, j + 2), 1);
      q = OrB(q, ShiftLeftHalves(h, 4, 4));
    }
    return q;
  }
};

// Q6_K: pieces 0..3 are values 0..63, 64..127, 128..191, 192..255 (half p / 2), lanes
// by kIndexQ6. w: [d * sc_0..15].
struct Q6 {
  static constexpr size_t kUnitBytes = sizeof(isa::BlockQ6_K), kPieces = 4;
  static constexpr Layout kLayout{256, 16, 32, false, false};
  static constexpr const int32_t (*kIndex)[16] = kIndexQ6;
  static HWY_INLINE FV Load(const uint8_t* a, const uint8_t*) {
    const uint8_t* d = a + offsetof(isa::BlockQ6_K, d);
    return ScaleBytes<true>(a + offsetof(isa::BlockQ6_K, scales), HalvesAt(d, d));
  }
  static HWY_INLINE BV Piece(const uint8_t* a, const uint8_t*, size_t p) {
    const size_t half = p / 2;
    const BV l = LoadB(a + offsetof(isa::BlockQ6_K, ql) + 64 * half);
    const BV h = BroadcastB(a + offsetof(isa::BlockQ6_K, qh) + 32 * half);
    // Values l and l + 32 take qh bits 0..1 and 2..3 (shifted to bits 4..5); values
    // l + 64 and l + 96 bits 4..5 and 6..7.
    const BV lo = p % 2 == 0 ? AndB(l, 15) : HighNibbles(l);
    const BV hi = p % 2 == 0 ? ShiftLeftHalves(h, 4, 2) : ShiftRightHalves(h, 0, 2);
    return OrB(lo, AndB(hi, 0x30));
  }
};

template <class Q>
constexpr bool kHasMins = Q::kLayout.mins;
template <class Q>
constexpr bool kBiased = Q::kLayout.bias != 0;

// Adds piece p of the unit at src (second block, for Q*_0, at src + second) with
// scales g[t] to acc[t], the vectors' digits at prepared piece `piece`; kLow: the odd
// last Q*_0 block, lanes 0..7 only. The piece is decoded once for the N vectors.
template <class Q, size_t N, bool kLow>
HWY_INLINE NPURT_MV_ATTR void AddPiece(const uint8_t* src, size_t second, const FV (&g)[N], size_t p,
                                       const PreparedX* const* px, size_t piece, FV (&acc)[N]) {
  constexpr size_t pb = PieceBytes(Q::kLayout);
  const BV w = Q::Piece(src, src + second, p);
  for (size_t t = 0; t < N; ++t) {
    const int8_t* dig = px[t]->digits.data() + piece * pb;
    IV d = NPURT_MV_DOT(w, dig);
    if constexpr (Q::kLayout.bias != 0) d = SubI(d, LoadI(reinterpret_cast<const int32_t*>(dig + 192)));
    FV scale = g[t];
    if constexpr (Q::kIndex != nullptr) scale = PermuteF(scale, Q::kIndex[p]);
    acc[t] = kLow ? FmaLowF(ToF(d), scale, acc[t]) : FmaF(ToF(d), scale, acc[t]);
  }
}

// R rows (row[r]) against N prepared vectors (px[t]) of k values: out[r * N + t].
// Per unit, each (row, vector) pair's scales are w * s (one f32 product per group);
// per piece, lane l adds f32(sum of q * X - bias * sum X) times its group's scale.
template <class Q, size_t R, size_t N>
HWY_INLINE NPURT_MV_ATTR void DotRows(const uint8_t* const* row, const PreparedX* const* px, size_t k, float* out) {
  constexpr size_t unit_elems = Q::kLayout.unit;
  FV acc[R][N];
  F8 macc[R][N];
  for (size_t r = 0; r < R; ++r) {
    for (size_t t = 0; t < N; ++t) {
      acc[r][t] = ZeroF();
      macc[r][t] = ZeroF8();
    }
  }
  const size_t units = k / unit_elems;
  size_t pf = 0;  // next byte offset (within each row) to prefetch
  for (size_t u = 0; u < units; ++u) {
    for (; pf < (u + 1) * Q::kUnitBytes; pf += 64) {
      for (size_t r = 0; r < R; ++r) hwy::Prefetch(row[r] + pf + kPrefetchBytes);
    }
    // Row by row, each row's scales and pieces decoded right before their products:
    // what one row needs at a time stays in registers (every accumulator sees the
    // same operations in the same order as any other loop order would give it).
    for (size_t r = 0; r < R; ++r) {
      const uint8_t* src = row[r] + u * Q::kUnitBytes;
      const FV w = Q::Load(src, src + Q::kUnitBytes / 2);
      FV g[N];
      for (size_t t = 0; t < N; ++t) g[t] = MulF(w, LoadF(px[t]->unit_s.data() + 16 * u));
#pragma GCC unroll 4
      for (size_t p = 0; p < Q::kPieces; ++p) {
        AddPiece<Q, N, false>(src, Q::kUnitBytes / 2, g, p, px, u * Q::kPieces + p, acc[r]);
      }
      if constexpr (Q::kLayout.mins) {
        const F8 m = UpperF8(w);
        for (size_t t = 0; t < N; ++t) macc[r][t] = FmaF8(m, LoadF8(px[t]->min_sums.data() + 8 * u), macc[r][t]);
      }
    }
  }
  if (units * unit_elems < k) {  // Q*_0: one block left, as a unit of it twice
    for (size_t r = 0; r < R; ++r) {
      const uint8_t* src = row[r] + units * Q::kUnitBytes;
      const FV w = Q::Load(src, src);
      FV g[N];
      for (size_t t = 0; t < N; ++t) g[t] = MulF(w, LoadF(px[t]->unit_s.data() + 16 * units));
      AddPiece<Q, N, true>(src, 0, g, 0, px, units, acc[r]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t t = 0; t < N; ++t) {
      float v = Tree16(acc[r][t]);
      if constexpr (Q::kLayout.mins) v -= Tree8(macc[r][t]);
      out[r * N + t] = v;
    }
  }
}

// StreamRows' and BatchRows' row functions for Q: functors, so that their call
// operators carry NPURT_MV_ATTR too.
template <class Q>
struct OneVector {
  const PreparedX* px;
  size_t k;
  template <size_t R>
  NPURT_MV_ATTR void operator()(const uint8_t* const* rows, float* out, Count<R>) const {
    DotRows<Q, R, 1>(rows, &px, k, out);
  }
};
template <class Q>
struct ManyVectors {
  const PreparedX* const* px;
  size_t k;
  template <size_t N>
  NPURT_MV_ATTR void operator()(const uint8_t* row, size_t t0, float* out, Count<N>) const {
    DotRows<Q, 1, N>(&row, px + t0, k, out);
  }
};

template <class Q>
NPURT_MV_ATTR void MatVecQ(const uint8_t* base, isa::DType type, size_t stride, size_t rows, const float* x, size_t k,
                           size_t batch, size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
  // Per thread and type, so that steady-state calls reuse the buffers (and, through
  // PrepareOnce, the prepared x of the previous block of the same GEMV).
  thread_local PreparedX prepared[isa::kMaxTmvBatch];
  const PreparedX* kept[isa::kMaxTmvBatch];
  float* ys[isa::kMaxTmvBatch];
  size_t n = 0;
  for (size_t t = 0; t < batch; ++t) {
    if (!PrepareOnce(Q::kLayout, x + t * x_pitch, k, prepared[t])) {
      MatVecReference(base, type, stride, rows, x + t * x_pitch, k, y + t * y_pitch, accumulate, false);
      continue;
    }
    kept[n] = &prepared[t];
    ys[n++] = y + t * y_pitch;
  }
  if (n == 0) return;
  if (batch == 1) {
    StreamRows(base, stride, rows, ys[0], accumulate, OneVector<Q>{kept[0], k});
    return;
  }
  BatchRows(base, stride, rows, n, ys, accumulate, ManyVectors<Q>{kept, k});
}

NPURT_MV_ATTR void MatVecQuantized(const uint8_t* base, isa::DType type, size_t stride, size_t rows, const float* x,
                                   size_t k, size_t batch, size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
  switch (type) {
    case isa::DType::kQ8_0: return MatVecQ<Q0<8>>(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
    case isa::DType::kQ4_0: return MatVecQ<Q0<4>>(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
    case isa::DType::kQ5_0: return MatVecQ<Q0<5>>(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
    case isa::DType::kQ4_K: return MatVecQ<QK<false>>(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
    case isa::DType::kQ5_K: return MatVecQ<QK<true>>(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
    case isa::DType::kQ6_K: return MatVecQ<Q6>(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
    default: return;  // not quantized: MatVecPlain's
  }
}
