// TfembRowGradients: per-id gradients -> one summed gradient per distinct
// row (in the order of the ids, as unsorted_segment_sum) and whether it is
// finite (or an error naming the table).

#include <cstdint>
#include <string>

#include "tf_kernel.h"

#include "row_sums.h"

namespace tfemb {
namespace {

absl::Status RowGradientsShape(InferenceContext* c) {
  ShapeHandle grads, positions, unique_ids;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grads));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &positions));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unique_ids));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(grads, 0), c->Dim(positions, 0), &n));
  c->set_output(0, c->Matrix(c->Dim(unique_ids, 0), c->Dim(grads, 1)));
  c->set_output(1, c->Scalar());
  return absl::OkStatus();
}

class RowGradientsOp : public OpKernel {
 public:
  explicit RowGradientsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("raise_non_finite", &raise_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grads = ctx->input(0);
    const Tensor& positions = ctx->input(1);
    const int64_t u = ctx->input(2).NumElements();
    OP_REQUIRES(ctx,
                grads.dims() == 2 && positions.dims() == 1 &&
                    ctx->input(2).dims() == 1 &&
                    grads.dim_size(0) == positions.dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", table_name_, "`: gradients ",
                    grads.shape().DebugString(), " do not match the ",
                    positions.NumElements(), " ids looked up.")));
    const int64_t n = grads.dim_size(0), dim = grads.dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u, dim}), &out));
    float* sums = out->flat<float>().data();
    const int64_t* pos = positions.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, CheckPositions(pos, n, u, table_name_));
    SumRows(grads.flat<float>().data(), pos, n, u, dim, sums);
    const bool finite = AllFinite(sums, u * dim);
    OP_REQUIRES(ctx, finite || !raise_, NonFiniteGradient(table_name_));
    Tensor* ok = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &ok));
    ok->scalar<bool>()() = finite;
  }

 private:
  std::string table_name_;
  bool raise_;
};

}  // namespace

REGISTER_OP("TfembRowGradients")
    .Input("gradients: float")
    .Input("positions: int64")
    .Input("unique_ids: int64")
    .Output("row_gradients: float")
    .Output("finite: bool")
    .Attr("table_name: string")
    .Attr("raise_non_finite: bool")
    .SetShapeFn(RowGradientsShape);


REGISTER_KERNEL_BUILDER(Name("TfembRowGradients").Device(DEVICE_CPU),
                        RowGradientsOp);

}  // namespace tfemb
