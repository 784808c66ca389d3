// The update TfembApplyRows makes on a table's touched rows: clip g, the optimizer's rule (one
// RuleRow specialization per declared optimizer), decoupled weight decay,
// clip w (the TPU's update, docs/numerics.md). Templates, in a header, so
// that each rule's loops are compiled for the row widths of WithWidth
// (row_loops.h) where the kernels instantiate them.
//
// The arithmetic follows tfemb/update_rules.py operation by operation (the
// same float32 constants, the same order), so both paths give the same
// bits, up to the rounding of pow (docs/numerics.md, 'Precision').

#ifndef TFEMB_KERNELS_UPDATE_RULES_H_
#define TFEMB_KERNELS_UPDATE_RULES_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "row_loops.h"
#include "tfemb_rules.h"  // generated: tfemb/kernels/rule_table.py

namespace tfemb {

// The float32 constants of one update, as update_rules.py makes them from
// the optimizer (computed in Python, in double, then rounded once), and the
// step's learning rate. An open clip side is +-inf, which clips nothing.
struct Update {
  float lr;
  float h[rules::kMaxConstants];  // the rule's, indexed by Rule::k...
  float clip_g_min, clip_g_max, clip_w_min, clip_w_max;
  bool clip_g, clip_w;
  float decay;  // 0: no weight decay; already multiplied by lr if asked
};

// One touched row: the rule updates w and the slots s0, s1 in place from the
// (clipped) gradient g. Each loop runs over `dim` floats with no aliasing,
// so the compiler vectorizes it. One specialization per optimizer's rule;
// its constants are p.h[Rule::k...] (tfemb_rules.h, generated from the
// optimizers' declarations: `kernel_constants` in tfemb/update_rules.py).
template <typename Rule>
inline void RuleRow(const Update& p, const float* __restrict g,
                    float* __restrict w, float* __restrict s0,
                    float* __restrict s1, int64_t dim) {
  static_assert(sizeof(Rule) == 0,
                "a declared optimizer has no RuleRow<Rule> specialization");
}

template <>
inline void RuleRow<rules::SGD>(const Update& p, const float* __restrict g,
                                float* __restrict w, float* __restrict s0,
                                float* __restrict s1, int64_t dim) {
  const float lr = p.lr;
  for (int64_t d = 0; d < dim; ++d) w[d] = w[d] - lr * g[d];
}

template <>
inline void RuleRow<rules::Adagrad>(const Update& p,
                                    const float* __restrict g,
                                    float* __restrict w, float* __restrict s0,
                                    float* __restrict s1, int64_t dim) {
  const float lr = p.lr;
  for (int64_t d = 0; d < dim; ++d) {
    const float a = s0[d] + g[d] * g[d];
    s0[d] = a;
    w[d] = w[d] - lr * g[d] * (1.0f / std::sqrt(a));
  }
}

template <>
inline void RuleRow<rules::AdagradMomentum>(
    const Update& p, const float* __restrict g, float* __restrict w,
    float* __restrict s0, float* __restrict s1, int64_t dim) {
  using R = rules::AdagradMomentum;
  const float lr = p.lr;
  const float momentum = p.h[R::kMomentum], beta2 = p.h[R::kBeta2];
  const float one_minus_beta2 = p.h[R::kOneMinusBeta2];
  const float epsilon = p.h[R::kEpsilon], power = p.h[R::kPower];
  const bool nesterov = p.h[R::kUseNesterov] != 0.0f, plain = beta2 == 1.0f;
  for (int64_t d = 0; d < dim; ++d) {
    const float a = plain ? s0[d] + g[d] * g[d]
                          : beta2 * s0[d] + one_minus_beta2 * g[d] * g[d];
    const float scaled = g[d] * std::pow(a + epsilon, power);
    const float m = momentum * s1[d] + scaled;
    const float step = nesterov ? momentum * m + scaled : m;
    s0[d] = a;
    s1[d] = m;
    w[d] = w[d] - lr * step;
  }
}

template <>
inline void RuleRow<rules::Adam>(const Update& p, const float* __restrict g,
                                 float* __restrict w, float* __restrict s0,
                                 float* __restrict s1, int64_t dim) {
  using R = rules::Adam;
  const float lr = p.lr;
  const float b1 = p.h[R::kBeta1], c1 = p.h[R::kOneMinusBeta1];
  const float b2 = p.h[R::kBeta2], c2 = p.h[R::kOneMinusBeta2];
  const float eps = p.h[R::kEpsilon], eps2 = p.h[R::kEpsilonSquared];
  if (p.h[R::kSumInsideSqrt] != 0.0f) {
    for (int64_t d = 0; d < dim; ++d) {
      const float m = b1 * s0[d] + c1 * g[d];
      const float v = b2 * s1[d] + c2 * g[d] * g[d];
      s0[d] = m;
      s1[d] = v;
      w[d] = w[d] - lr * (m * (1.0f / std::sqrt(v + eps2)));
    }
  } else {
    for (int64_t d = 0; d < dim; ++d) {
      const float m = b1 * s0[d] + c1 * g[d];
      const float v = b2 * s1[d] + c2 * g[d] * g[d];
      s0[d] = m;
      s1[d] = v;
      w[d] = w[d] - lr * (m / (std::sqrt(v) + eps));
    }
  }
}

// TF's ApplyFtrlV2, with beta in the quadratic term (the proto's).
template <>
inline void RuleRow<rules::FTRL>(const Update& p, const float* __restrict g,
                                 float* __restrict w, float* __restrict s0,
                                 float* __restrict s1, int64_t dim) {
  using R = rules::FTRL;
  const float lr = p.lr;
  const float power = p.h[R::kPower], l1 = p.h[R::kL1];
  const float l2x2 = p.h[R::kTwoL2], beta = p.h[R::kBeta];
  const bool by_lr = p.h[R::kMultiplyLinearByLearningRate] != 0.0f;
  for (int64_t d = 0; d < dim; ++d) {
    const float accum = s0[d], old_w = w[d];
    const float new_accum = accum + g[d] * g[d];
    float sigma, new_accum_pow;
    if (power == 0.5f) {
      sigma = std::sqrt(new_accum) - std::sqrt(accum);
      new_accum_pow = std::sqrt(new_accum);
    } else {
      new_accum_pow = std::pow(new_accum, power);
      sigma = new_accum_pow - std::pow(accum, power);
    }
    float linear, l1_limit, quadratic;
    if (by_lr) {
      linear = s1[d] + g[d] * lr - sigma * old_w;
      l1_limit = l1 * lr;
      quadratic = new_accum_pow + l2x2 * lr + beta;
    } else {
      linear = s1[d] + g[d] - sigma / lr * old_w;
      l1_limit = l1;
      quadratic = new_accum_pow / lr + l2x2 + beta / lr;
    }
    const float shrunk =
        std::min(std::max(linear, -l1_limit), l1_limit) - linear;
    s0[d] = new_accum;
    s1[d] = linear;
    w[d] = std::fabs(linear) > l1_limit
               ? shrunk / (quadratic == 0.0f ? 1.0f : quadratic)
               : 0.0f;
  }
}

// `from` clipped into `to`, which may be `from` itself (so no __restrict).
inline void ClipRow(float* to, const float* from, float lo, float hi,
                    int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) to[d] = std::min(std::max(from[d], lo), hi);
}

// Whether any of `n` floats is NaN or +-Inf, as a bit: both have every
// exponent bit set. Integer ops, so that the loop vectorizes (a float sum
// could not be reordered).
inline uint32_t NonFinite(const float* x, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    any |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return any;
}

// The whole pipeline on every touched row: clip g, rule, decay, clip w, in
// place. Row i of the parameters is at w + i * stride, of the slots at s0
// and s1 + i * stride: stride is dim for separate variables, or (1 + slots)
// x dim with the slots beside the parameters in one variable (s0 = w + dim,
// ...). Before a row is written, its parameters and slots as they were go
// to row r of `undo` ([u, (1 + slots) x dim]: parameters, slot 0, slot 1),
// in the same pass, so that RestoreAll can put them back: each update is
// computed once. Returns whether every new value is finite.
// kDim: the row width compiled in (WithWidth), or 0 for `width` at run time.
// ApplyAll, ApplyRule and FindRule are static: the update kernels alone
// instantiate them (update_kernel.h's RuleAttrs), and with internal linkage
// the compiler inlines each ApplyAll into its ApplyRule (a function called
// once), as in one file.
template <typename Rule, int64_t kDim>
static bool ApplyAll(const Update& p, const int64_t* ids, const float* grads,
                     int64_t u, int64_t width, int64_t stride, float* w,
                     float* s0, float* s1, float* undo) {
  const int64_t dim = Width<kDim>(width);
  const int64_t saved = (1 + (s0 != nullptr) + (s1 != nullptr)) * dim;
  std::vector<float> clipped(dim);
  uint32_t non_finite = 0;
  for (int64_t r = 0; r < u; ++r) {
    if (r + kPrefetchRows < u) {
      const int64_t ahead = ids[r + kPrefetchRows] * stride;
      if (stride != dim) {
        PrefetchRow(w + ahead, stride);  // parameters and slots, together
      } else {
        PrefetchRow(w + ahead, dim);
        if (s0) PrefetchRow(s0 + ahead, dim);
        if (s1) PrefetchRow(s1 + ahead, dim);
      }
    }
    const int64_t at = ids[r] * stride;
    const float* g = grads + r * dim;
    if (p.clip_g) {
      ClipRow(clipped.data(), g, p.clip_g_min, p.clip_g_max, dim);
      g = clipped.data();
    }
    float* wr = w + at;
    float* old = undo + r * saved;  // the old parameters first
    // One variable at a time also where the slots sit beside the
    // parameters (s0 + at = wr + dim): copies of the width compiled in.
    CopyRow(old, wr, dim);
    if (s0) CopyRow(old + dim, s0 + at, dim);
    if (s1) CopyRow(old + 2 * dim, s1 + at, dim);
    RuleRow<Rule>(p, g, wr, s0 ? s0 + at : nullptr, s1 ? s1 + at : nullptr,
                   dim);
    if (p.decay != 0.0f) {
      const float decay = p.decay;
      for (int64_t d = 0; d < dim; ++d) wr[d] = wr[d] - decay * old[d];
    }
    if (p.clip_w) ClipRow(wr, wr, p.clip_w_min, p.clip_w_max, dim);
    if (stride != dim) {
      non_finite |= NonFinite(wr, stride);
    } else {
      non_finite |= NonFinite(wr, dim);
      if (s0) non_finite |= NonFinite(s0 + at, dim);
      if (s1) non_finite |= NonFinite(s1 + at, dim);
    }
  }
  return !non_finite;
}

// The rows ApplyAll updated put back from its `undo` (rows of `saved`
// floats), last row first. With stride != dim a row of undo is the whole
// row of one variable (the slots beside the parameters).
inline void RestoreAll(const int64_t* ids, int64_t u, int64_t dim,
                       int64_t stride, int64_t saved, const float* undo,
                       float* w, float* s0, float* s1) {
  for (int64_t r = u - 1; r >= 0; --r) {
    const int64_t at = ids[r] * stride;
    const float* old = undo + r * saved;
    if (stride != dim) {
      CopyRow(w + at, old, stride);
    } else {
      CopyRow(w + at, old, dim);
      if (s0) CopyRow(s0 + at, old + dim, dim);
      if (s1) CopyRow(s1 + at, old + 2 * dim, dim);
    }
  }
}

// ApplyAll for `Rule`, its loops compiled for the row's width where
// WithWidth has it.
template <typename Rule>
static bool ApplyRule(const Update& p, const int64_t* ids, const float* grads,
                      int64_t u, int64_t width, int64_t stride, float* w,
                      float* s0, float* s1, float* undo) {
  bool finite = true;
  WithWidth(width, [&](auto k) {
    finite = ApplyAll<Rule, decltype(k)::value>(p, ids, grads, u, width,
                                                stride, w, s0, s1, undo);
  });
  return finite;
}

using ApplyFn = bool (*)(const Update&, const int64_t*, const float*,
                         int64_t, int64_t, int64_t, float*, float*, float*,
                         float*);

// A rule as TfembApplyRows finds it by name among the declared ones.
struct Rule {
  ApplyFn apply = nullptr;
  int slots = 0;
  int constants = 0;
};

// RuleRow takes at most two slots (s0, s1); ApplyAll and ApplyRowsOp
// would need a third pointer for an optimizer with more.
static_assert(rules::kMaxSlots <= 2, "an optimizer has more than two slots");

template <typename... Rules>
static bool FindRule(const std::string& name, std::tuple<Rules...>*,
                     Rule* found) {
  return ((name == Rules::kName
               ? (*found = Rule{&ApplyRule<Rules>, Rules::kSlots,
                                Rules::kConstants},
                  true)
               : false) ||
          ...);
}

}  // namespace tfemb

#endif  // TFEMB_KERNELS_UPDATE_RULES_H_
