// TfembReadColumns and TfembWriteColumns: some columns of a [rows, n]
// variable (one view of an interleaved table, tfemb.interleaved_tables)
// read or written in place, without the copy of the whole variable that
// TensorFlow's own read or strided-slice assign makes once the variable has
// been accessed sparsely.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>

#include "tf_kernel.h"

#include "column_split.h"
#include "input_checks.h"

namespace tfemb {
namespace {

// Columns [begin, begin + width) of a [rows, n] variable, copied straight
// from its buffer: one slot (or the parameters) of an interleaved table,
// without the copy of the whole variable a dense read makes once the
// variable has been accessed sparsely.
class ReadColumnsOp : public OpKernel {
 public:
  explicit ReadColumnsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("begin", &begin_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width", &width_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    ::tensorflow::tf_shared_lock lock(*var->mu());
    RejoinColumns(var.get());
    const Tensor& table = *var->tensor();
    OP_REQUIRES(ctx,
                table.dtype() == ::tensorflow::DT_FLOAT && table.dims() == 2 &&
                    begin_ >= 0 && width_ >= 0 &&
                    begin_ + width_ <= table.dim_size(1),
                absl::InvalidArgumentError(absl::StrCat(
                    "columns [", begin_, ", ", begin_ + width_,
                    ") of a float32 matrix; got ",
                    table.shape().DebugString())));
    const int64_t rows = table.dim_size(0), n = table.dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, width_}),
                                             &out));
    const float* src = table.flat<float>().data() + begin_;
    float* to = out->flat<float>().data();
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(src + r * n, src + r * n + width_, to + r * width_);
    }
  }

 private:
  int64_t begin_;
  int64_t width_;
};

// `value` into rows [row, row + value rows) of columns [begin, begin +
// value width) of a [rows, n] variable, in place: an assign (or restore, or
// block of initial rows) of one view of an interleaved table, without the
// copy of the whole variable TensorFlow's strided-slice assign makes once
// the variable has been accessed sparsely.
class WriteColumnsOp : public OpKernel {
 public:
  explicit WriteColumnsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("begin", &begin_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& value = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(2).shape()) &&
                         value.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfembWriteColumns: a scalar row and a matrix value; got ",
                    ctx->input(2).shape().DebugString(), " and ",
                    value.shape().DebugString())));
    const int64_t row = ctx->input(2).scalar<int64_t>()();
    RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    OP_REQUIRES_OK(ctx, CheckFloatMatrix(
                            var.get(), "TfembWriteColumns: the variable"));
    // As TensorFlow's sparse updates: readers copy from now on, and a
    // buffer someone still reads is copied before it is written.
    OP_REQUIRES_OK(ctx, ::tensorflow::EnsureSparseVariableAccess<
                            CPUDevice, float>(ctx, var.get()));
    ::tensorflow::mutex_lock lock(*var->mu());
    RejoinColumns(var.get());
    Tensor* table = var->tensor();
    OP_REQUIRES(ctx,
                table->dtype() == ::tensorflow::DT_FLOAT &&
                    table->dims() == 2 && value.dims() == 2 && begin_ >= 0 &&
                    begin_ + value.dim_size(1) <= table->dim_size(1) &&
                    row >= 0 && row + value.dim_size(0) <= table->dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(
                    "rows [", row, ", ", row + value.dim_size(0),
                    ") x columns [", begin_, ", ", begin_ + value.dim_size(1),
                    ") of a float32 matrix of ",
                    table->shape().DebugString(), "; got a value of ",
                    value.shape().DebugString())));
    const int64_t n = table->dim_size(1), width = value.dim_size(1);
    const float* from = value.flat<float>().data();
    float* to = table->flat<float>().data() + row * n + begin_;
    for (int64_t r = 0; r < value.dim_size(0); ++r) {
      std::copy_n(from + r * width, width, to + r * n);
    }
  }

 private:
  int64_t begin_;
};

}  // namespace

REGISTER_OP("TfembReadColumns")
    .Input("table: resource")
    .Output("columns: float")
    .Attr("begin: int")
    .Attr("width: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      if (width < 0) return absl::InvalidArgumentError("width below 0");
      c->set_output(0, c->Matrix(c->UnknownDim(), width));
      return absl::OkStatus();
    });

REGISTER_OP("TfembWriteColumns")
    .Input("table: resource")
    .Input("value: float")
    .Input("row: int64")
    .Attr("begin: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &unused));
      return c->WithRank(c->input(2), 0, &unused);
    });

REGISTER_KERNEL_BUILDER(Name("TfembReadColumns").Device(DEVICE_CPU),
                        ReadColumnsOp);
REGISTER_KERNEL_BUILDER(Name("TfembWriteColumns").Device(DEVICE_CPU),
                        WriteColumnsOp);

}  // namespace tfemb
