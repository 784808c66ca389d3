// The loops over one row's floats that several kernels share: a row
// prefetched, a row copied, and the loops compiled for the common widths.
// Inline, in a header, so that each kernel's loops are compiled and
// inlined where they run.

#ifndef TFEMB_KERNELS_ROW_LOOPS_H_
#define TFEMB_KERNELS_ROW_LOOPS_H_

#include <cstdint>
#include <type_traits>

namespace tfemb {

// Rows are read at random from tables far larger than the caches: asking for
// a row this many rows ahead keeps several memory reads in flight.
constexpr int64_t kPrefetchRows = 12;

inline void PrefetchRow(const float* row, int64_t dim) {
  for (int64_t d = 0; d < dim; d += 16) __builtin_prefetch(row + d);
}

inline void CopyRow(float* __restrict to, const float* __restrict from,
                    int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) to[d] = from[d];
}

// Calls f(std::integral_constant<int64_t, W>()) with W = `dim` for the
// common embedding widths, so that the loops over a row's floats are
// compiled for a width known in advance: unrolled, no remainder, no trip
// count to test. Any other width gets W = 0: the loops take `dim` at run
// time. The floats are the same either way (every loop is element by
// element); the compiled widths are faster (experiments/kernel_ab.py
// compares builds).
template <typename F>
inline void WithWidth(int64_t dim, F&& f) {
  switch (dim) {
    case 8: f(std::integral_constant<int64_t, 8>()); break;
    case 16: f(std::integral_constant<int64_t, 16>()); break;
    case 32: f(std::integral_constant<int64_t, 32>()); break;
    case 64: f(std::integral_constant<int64_t, 64>()); break;
    case 128: f(std::integral_constant<int64_t, 128>()); break;
    default: f(std::integral_constant<int64_t, 0>());
  }
}

// The width a loop runs over: kDim where it is compiled in, else `dim`.
template <int64_t kDim>
constexpr int64_t Width(int64_t dim) {
  return kDim > 0 ? kDim : dim;
}

}  // namespace tfemb

#endif  // TFEMB_KERNELS_ROW_LOOPS_H_
