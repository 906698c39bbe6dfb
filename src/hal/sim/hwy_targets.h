// The Highway targets the simulator's vector kernels are compiled for: AVX-512
// (AVX3), AVX2 and the portable fallback. SSSE3/SSE4 would only serve pre-AVX2 CPUs
// and AVX3_DL adds nothing these kernels use, so dropping them keeps the build fast.
// The fallback is compiled even when the baseline already has AVX (e.g.
// -march=native) so that it stays testable. Include before any Highway header.
#pragma once

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
