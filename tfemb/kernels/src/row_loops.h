// The loops over rows' floats that several kernels share: a row
// prefetched, a row copied, per-id rows summed per distinct id, and the
// loops compiled for the common widths. Inline, in a header, so that each
// kernel's loops are compiled and inlined where they run. No TensorFlow
// header: benchmarks/floor.cc's exact step runs the same loops.

#ifndef TFEMB_KERNELS_ROW_LOOPS_H_
#define TFEMB_KERNELS_ROW_LOOPS_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace tfemb {

// Rows are read at random from tables far larger than the caches: asking for
// a row this many rows ahead keeps several memory reads in flight.
constexpr int64_t kPrefetchRows = 12;

inline void PrefetchRow(const float* row, int64_t dim) {
  for (int64_t d = 0; d < dim; d += 16) __builtin_prefetch(row + d);
}

// A memcpy of a width known in advance is compiled into a few vector moves
// in place. A loop over the floats was turned by GCC's loop distribution
// into a call of memmove per row: it could not prove the rows apart
// (docs/performance.md, 'Row copies in place').
inline void CopyRow(float* __restrict to, const float* __restrict from,
                    int64_t dim) {
  __builtin_memcpy(to, from, dim * sizeof(float));
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

// sums[pos[i]] += g[i] over the n rows of g, in the order of the ids (as
// unsorted_segment_sum), into u rows of sums that start at zero; rows `dim`
// floats wide; positions in [0, u) (row_sums.h's CheckPositions). A row is
// zeroed when the ids first reach it, not all of them beforehand: the
// lookup numbers the distinct ids in the order they first occur, so each
// row's first sum is written while the row is in the cache, with no pass
// of zeros before (any other order of positions gets the same sums).
//
// SumRowPieces: the same over g given in `pieces` parts, g's rows being
// the parts' rows one after the other (rows[p] in part p), without
// joining them first: the sums are SumRows' on their concatenation.
inline void SumRowPieces(const float* const* g, const int64_t* rows,
                         int pieces, const int64_t* pos, int64_t u,
                         int64_t dim, float* sums) {
  WithWidth(dim, [&](auto width) {
    const int64_t w = Width<decltype(width)::value>(dim);
    int64_t started = 0;  // rows [0, started) hold a sum or zeros
    for (int p = 0; p < pieces; ++p) {
      const float* piece = g[p];
      for (int64_t j = 0; j < rows[p]; ++j) {
        const int64_t at = *pos++;
        float* __restrict row = sums + at * w;
        const float* __restrict x = piece + j * w;
        if (at < started) {
          for (int64_t d = 0; d < w; ++d) row[d] += x[d];
          continue;
        }
        // Rows the ids skipped (in another order than the lookup's)
        // zeroed; the first sum is 0 + x, as after zeroing (-0 becomes +0).
        std::fill(sums + started * w, row, 0.0f);
        for (int64_t d = 0; d < w; ++d) row[d] = 0.0f + x[d];
        started = at + 1;
      }
    }
    std::fill(sums + started * w, sums + u * w, 0.0f);  // rows no id reached
  });
}

inline void SumRows(const float* g, const int64_t* pos, int64_t n, int64_t u,
                    int64_t dim, float* sums) {
  SumRowPieces(&g, &n, 1, pos, u, dim, sums);
}

}  // namespace tfemb

#endif  // TFEMB_KERNELS_ROW_LOOPS_H_
