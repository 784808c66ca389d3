// TfembApplyRows: the update (update_rules.h) on the touched rows of a
// table and its slots, in place, all or nothing: each update is computed
// once, the old rows and slots kept beside it (`undo`), and put back at
// once if any new value is not finite. TfembRestoreRows puts them back
// later, when another table of the step turned out not finite. Several
// tables stacked in one variable (disjoint rows, one optimizer) are one op:
// a part per table. With `interleaved`, the slots sit beside the parameters
// in one variable of [rows, (1 + slots) x dim]. Every table of a step in
// one op: TfembApplyTables (apply_tables.cc).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "tf_kernel.h"

#include "update_kernel.h"
#include "update_rules.h"

namespace tfemb {
namespace {

class ApplyRowsOp : public UpdateKernel {
 public:
  explicit ApplyRowsOp(OpKernelConstruction* ctx)
      : UpdateKernel(ctx, "num_parts", 2, false) {}

  void Compute(OpKernelContext* ctx) override {
    // parameters, slots, then ids and gradients per part, learning rate
    const int num_vars = ctx->num_inputs() - 1 - 2 * num_parts_;
    const std::string names = absl::StrJoin(table_names_, "`, `");
    Update p;
    OP_REQUIRES_OK(ctx, rule_.At(ctx->input(ctx->num_inputs() - 1), names,
                                 &p));
    std::vector<Part> parts(num_parts_);
    std::vector<int64_t> dims;
    OP_REQUIRES_OK(ctx, ReadParts(ctx, num_vars, table_names_, &parts, &dims));
    const int64_t dim = dims[0];
    const int slots = rule_.slots;
    const int64_t stride = rule_.interleaved ? (1 + slots) * dim : dim;
    const std::vector<int64_t> first = FirstRows(parts);
    std::vector<bool*> ok;
    OP_REQUIRES_OK(ctx, FiniteOutputs(ctx, num_parts_, &ok));
    Tensor* undo;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            "undo",
                            TensorShape({first.back(), (1 + slots) * dim}),
                            &undo));

    LockedTables locked;
    OP_REQUIRES_OK(ctx, locked.Open(ctx, 0, num_vars, {stride}, slots,
                                    rule_.interleaved, {names}));
    OP_REQUIRES_OK(ctx, CheckIdRange(parts, locked.table(0).rows,
                                     table_names_));
    const int64_t width = (1 + slots) * dim;
    std::vector<Target> targets;
    for (int k = 0; k < num_parts_; ++k) {
      targets.push_back(Target{p, dim, stride, width, locked.table(0),
                               undo->flat<float>().data() + first[k] * width});
    }
    ApplyAllOrNothing(ctx, rule_, parts, targets, ok);
  }
};

// TfembRestoreRows: unless `keep`, the rows and slots TfembApplyRows
// updated put back from its `undo` (where it already put them back itself,
// the same values again). With `keep`, nothing is read or locked.
class RestoreRowsOp : public OpKernel {
 public:
  explicit RestoreRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_parts", &num_parts_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("interleaved", &interleaved_));
    OP_REQUIRES(ctx, static_cast<int>(table_names_.size()) == num_parts_,
                absl::InvalidArgumentError(
                    "table_names: one name per part (ids)"));
  }

  // Nothing to do in a step that keeps its update: run in the executor's
  // thread, not scheduled.
  bool IsExpensive() override { return false; }

  void Compute(OpKernelContext* ctx) override {
    // parameters, slots, ids per part, undo, keep
    const std::string names = absl::StrJoin(table_names_, "`, `");
    const Tensor& keep = ctx->input(ctx->num_inputs() - 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(keep.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", names, "`: keep must be a scalar; got shape ",
                    keep.shape().DebugString())));
    if (keep.scalar<bool>()()) return;
    const int num_vars = ctx->num_inputs() - 2 - num_parts_;
    std::vector<Part> parts(num_parts_);
    OP_REQUIRES_OK(ctx, ReadParts(ctx, num_vars, table_names_, &parts));
    const std::vector<int64_t> first = FirstRows(parts);
    const Tensor& undo = ctx->input(ctx->num_inputs() - 2);
    // A row of undo: the whole interleaved row, or a row of each variable.
    const int64_t width = undo.dims() == 2 ? undo.dim_size(1) : 0;
    const int64_t dim = interleaved_ ? width : width / num_vars;
    OP_REQUIRES(ctx,
                undo.dims() == 2 && undo.dim_size(0) == first.back() &&
                    width % num_vars == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", names, "`: ", first.back(), " ids but undo ",
                    "rows ", undo.shape().DebugString(), " for ", num_vars,
                    " variables")));
    LockedTables locked;
    OP_REQUIRES_OK(ctx, locked.Open(ctx, 0, num_vars, {dim}, 0, false,
                                    {names}));
    const LockedTables::Table& table = locked.table(0);
    OP_REQUIRES_OK(ctx, CheckIdRange(parts, table.rows, table_names_));
    const float* saved = undo.flat<float>().data();
    for (int k = 0; k < num_parts_; ++k) {
      RestoreAll(parts[k].id, parts[k].u, dim, dim, width,
                 saved + first[k] * width, table.w, table.s0, table.s1);
    }
  }

 private:
  std::vector<std::string> table_names_;
  int num_parts_;
  bool interleaved_;
};

// TfembApplyRows' shapes: per part, vector ids and matrix gradients of as
// many rows; a scalar learning rate. Out: a scalar per part, and the undo
// rows.
absl::Status UpdateShape(InferenceContext* c) {
  int parts;
  TF_RETURN_IF_ERROR(c->GetAttr("num_parts", &parts));
  const int n = c->num_inputs();  // ..., ids, gradients, learning rate
  for (int k = 0; k < parts; ++k) {
    ShapeHandle ids, grads;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n - 1 - 2 * parts + k), 1, &ids));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n - 1 - parts + k), 2, &grads));
    DimensionHandle rows;
    TF_RETURN_IF_ERROR(c->Merge(c->Dim(ids, 0), c->Dim(grads, 0), &rows));
  }
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(n - 1), 0, &unused));
  for (int k = 0; k < parts; ++k) c->set_output(k, c->Scalar());
  c->set_output(parts, c->Matrix(InferenceContext::kUnknownDim,
                                 InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("TfembApplyRows")
    .Input("parameters: resource")
    .Input("slots: num_slots * resource")
    .Input("ids: num_parts * int64")
    .Input("gradients: num_parts * float")
    .Input("learning_rate: float")
    .Output("finite: num_parts * bool")  // each part's new values
    .Output("undo: float")  // the rows and slots as they were
    .Attr("num_slots: int >= 0")
    .Attr("num_parts: int >= 1")
    .Attr("table_names: list(string)")  // one per part
    .Attr("rule: string")
    .Attr("hyperparameters: list(float)")
    .Attr("clip_gradient: list(float)")
    .Attr("clip_weight: list(float)")
    .Attr("weight_decay_factor: float")
    .Attr("multiply_weight_decay_by_lr: bool")
    .Attr("interleaved: bool = false")  // slots beside the parameters
    .SetIsStateful()
    .SetShapeFn(UpdateShape);

REGISTER_OP("TfembRestoreRows")
    .Input("parameters: resource")
    .Input("slots: num_slots * resource")
    .Input("ids: num_parts * int64")
    .Input("undo: float")
    .Input("keep: bool")
    .Attr("num_slots: int >= 0")
    .Attr("num_parts: int >= 1")
    .Attr("table_names: list(string)")
    .Attr("interleaved: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int parts;
      TF_RETURN_IF_ERROR(c->GetAttr("num_parts", &parts));
      const int n = c->num_inputs();  // ..., ids, undo, keep
      ShapeHandle unused;
      for (int k = 0; k < parts; ++k) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n - 2 - parts + k), 1,
                                       &unused));
      }
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n - 2), 2, &unused));
      return c->WithRank(c->input(n - 1), 0, &unused);
    });

REGISTER_KERNEL_BUILDER(Name("TfembApplyRows").Device(DEVICE_CPU),
                        ApplyRowsOp);
REGISTER_KERNEL_BUILDER(Name("TfembRestoreRows").Device(DEVICE_CPU),
                        RestoreRowsOp);

}  // namespace tfemb
