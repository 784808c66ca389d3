// TfembCheckRows: whether TfembApplyRows would leave the rows finite
// (CheckRowsOp).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tf_kernel.h"

#include "apply_rows.h"
#include "row_loops.h"
#include "update_rules.h"

namespace tfemb {
namespace {

// Whether TfembApplyRows with the same inputs would leave every touched row
// of the table and of its slots finite, one bool per part (table); writes
// nothing. The rows are updated by the same rule (update_rules.h) in a
// scratch copy, kChunk rows at a time ([kChunk, 3 x dim]: parameters, slot
// 0, slot 1; small enough to stay in cache).
class CheckRowsOp : public ApplyRowsOp {
 public:
  using ApplyRowsOp::ApplyRowsOp;

 protected:
  bool Writes() const override { return false; }

  static constexpr int64_t kChunk = 64;

  void Finish(OpKernelContext* ctx, const Update& p,
              const std::vector<Part>& parts, int64_t dim, int64_t stride,
              float* w, float* s0, float* s1) override {
    ::tensorflow::OpOutputList finite;
    OP_REQUIRES_OK(ctx, ctx->output_list("finite", &finite));
    std::vector<bool*> out(num_parts_);
    for (int k = 0; k < num_parts_; ++k) {
      Tensor* t;
      OP_REQUIRES_OK(ctx, finite.allocate(k, TensorShape({}), &t));
      out[k] = t->scalar<bool>().data();
    }
    ForParts(ctx, parts, [&](const Part& part, int k) {
      *out[k] = Finite(p, part, dim, stride, w, s0, s1);
    });
  }

 private:
  bool Finite(const Update& p, const Part& part, int64_t dim, int64_t stride,
              const float* w, const float* s0, const float* s1) const {
    const int64_t* id = part.id;
    const float* g = part.g;
    const int64_t u = part.u;
    const int64_t width = 3 * dim;
    std::vector<float> rows(kChunk * width, 0.0f);
    std::vector<int64_t> at(kChunk);
    for (int64_t r = 0; r < kChunk; ++r) at[r] = r;
    const float* from[3] = {w, s0, s1};
    float* copy = rows.data();
    uint32_t non_finite = 0;
    for (int64_t first = 0; first < u && !non_finite; first += kChunk) {
      const int64_t n = std::min(kChunk, u - first);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = first + r;
        for (int k = 0; k < 3; ++k) {
          if (!from[k]) continue;
          if (i + kPrefetchRows < u) {
            PrefetchRow(from[k] + id[i + kPrefetchRows] * stride, dim);
          }
          std::copy_n(from[k] + id[i] * stride, dim,
                      copy + r * width + k * dim);
        }
      }
      apply_(p, at.data(), g + first * dim, n, dim, width, copy,
             s0 ? copy + dim : nullptr, s1 ? copy + 2 * dim : nullptr);
      // NaN and +-Inf have every exponent bit set; integer ops, so that
      // the loop vectorizes (a float sum could not be reordered).
      for (int64_t i = 0; i < n * width; ++i) {
        uint32_t bits;
        std::memcpy(&bits, copy + i, sizeof(bits));
        non_finite |= (bits & 0x7f800000u) == 0x7f800000u;
      }
    }
    return !non_finite;
  }
};

}  // namespace

REGISTER_OP("TfembCheckRows")
    .Input("parameters: resource")
    .Input("slots: num_slots * resource")
    .Input("ids: num_parts * int64")
    .Input("gradients: num_parts * float")
    .Input("learning_rate: float")
    .Output("finite: num_parts * bool")
    .Attr("num_slots: int >= 0")
    .Attr("num_parts: int >= 1")
    .Attr("table_names: list(string)")
    .Attr("rule: string")
    .Attr("hyperparameters: list(float)")
    .Attr("clip_gradient: list(float)")
    .Attr("clip_weight: list(float)")
    .Attr("weight_decay_factor: float")
    .Attr("multiply_weight_decay_by_lr: bool")
    .Attr("interleaved: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(UpdateShape(c));
      for (int k = 0; k < c->num_outputs(); ++k) c->set_output(k, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TfembCheckRows").Device(DEVICE_CPU),
                        CheckRowsOp);

}  // namespace tfemb
