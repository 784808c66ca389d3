// The checks around per-id gradients summed into one row per distinct id
// (SumRows, row_loops.h): TfembRowGradients sums them alone,
// TfembApplyTables right before each table's update.

#ifndef TFEMB_KERNELS_ROW_SUMS_H_
#define TFEMB_KERNELS_ROW_SUMS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "row_loops.h"

namespace tfemb {

// OK if every position is a row of the u distinct ids.
inline absl::Status CheckPositions(const int64_t* pos, int64_t n, int64_t u,
                                   const std::string& table) {
  for (int64_t i = 0; i < n; ++i) {
    if (pos[i] < 0 || pos[i] >= u) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Table `", table, "`: position ", pos[i], " outside [0, ", u,
          ") (the distinct ids)"));
    }
  }
  return absl::OkStatus();
}

// No NaN or Inf: the exponent bits of a float are all ones exactly then.
inline bool AllFinite(const float* x, int64_t n) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<uint32_t>((bits[i] & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// The error of a step whose summed gradient of `table` is not finite, under
// the policy that raises (as tfemb/validation.py's finite_gradients).
inline absl::Status NonFiniteGradient(const std::string& table) {
  return absl::InvalidArgumentError(absl::StrCat(
      "Table `", table,
      "`: non-finite (NaN or Inf) embedding gradient; no table was "
      "updated."));
}

}  // namespace tfemb

#endif  // TFEMB_KERNELS_ROW_SUMS_H_
