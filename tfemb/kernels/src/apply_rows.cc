// TfembApplyRows: the update (update_rules.h) on the touched rows of a
// table and its slots, in place. Several tables stacked in one variable
// (disjoint rows, one optimizer) are one op: a part per table. With
// `interleaved`, the slots sit beside the parameters in one variable of
// [rows, (1 + slots) x dim].

#define EIGEN_USE_THREADS

#include "apply_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tf_kernel.h"

#include "column_split.h"
#include "huge_pages.h"
#include "input_checks.h"
#include "update_rules.h"

namespace tfemb {
namespace {

// Locks on variables, exclusive (a writer) or shared (a reader), taken in
// the given order, released at the end of the scope.
class VariableLocks {
 public:
  VariableLocks(const std::vector<Var*>& vars, bool exclusive)
      : vars_(vars), exclusive_(exclusive) {
    for (Var* v : vars_) {
      if (exclusive_) {
        v->mu()->lock();
      } else {
        v->mu()->lock_shared();
      }
    }
  }
  ~VariableLocks() {
    for (auto it = vars_.rbegin(); it != vars_.rend(); ++it) {
      if (exclusive_) {
        (*it)->mu()->unlock();
      } else {
        (*it)->mu()->unlock_shared();
      }
    }
  }

 private:
  std::vector<Var*> vars_;
  bool exclusive_;
};

}  // namespace

ApplyRowsOp::ApplyRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
  std::string rule;
  std::vector<float> h, clip_g, clip_w;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("num_parts", &num_parts_));
  OP_REQUIRES(ctx, static_cast<int>(table_names_.size()) == num_parts_,
              absl::InvalidArgumentError(
                  "table_names: one name per part (ids, gradients)"));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &rule));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("hyperparameters", &h));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("clip_gradient", &clip_g));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("clip_weight", &clip_w));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("weight_decay_factor", &p_.decay));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("multiply_weight_decay_by_lr",
                                   &decay_by_lr_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("interleaved", &interleaved_));
  OP_REQUIRES(ctx, clip_g.size() == 2 && clip_w.size() == 2,
              absl::InvalidArgumentError("clip bounds: [min, max]"));
  p_.clip_g_min = clip_g[0];
  p_.clip_g_max = clip_g[1];
  p_.clip_w_min = clip_w[0];
  p_.clip_w_max = clip_w[1];
  p_.clip_g = !std::isinf(clip_g[0]) || !std::isinf(clip_g[1]);
  p_.clip_w = !std::isinf(clip_w[0]) || !std::isinf(clip_w[1]);
  Rule found;
  OP_REQUIRES(ctx, FindRule(rule, static_cast<rules::All*>(nullptr), &found),
              absl::InvalidArgumentError("unknown rule " + rule));
  apply_ = found.apply;
  slots_ = found.slots;
  OP_REQUIRES(ctx, ctx->num_inputs() - 2 - 2 * num_parts_ ==
                           (interleaved_ ? 0 : slots_) &&
                       static_cast<int>(h.size()) == found.constants,
              absl::InvalidArgumentError(
                  "wrong number of slots or constants for " + rule));
  std::fill(p_.h, p_.h + rules::kMaxConstants, 0.0f);
  std::copy(h.begin(), h.end(), p_.h);
}

void ApplyRowsOp::Compute(OpKernelContext* ctx) {
  // parameters, slots, then ids and gradients per part, learning rate
  const int num_vars = ctx->num_inputs() - 1 - 2 * num_parts_;
  const Tensor& lr = ctx->input(ctx->num_inputs() - 1);
  OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(lr.shape()),
              absl::InvalidArgumentError(absl::StrCat(
                  "Table `", Names(), "`: the learning rate must be a "
                  "scalar; got shape ", lr.shape().DebugString())));
  Update p = p_;
  p.lr = lr.scalar<float>()();
  if (decay_by_lr_) p.decay = p.decay * p.lr;
  std::vector<Part> parts(num_parts_);
  int64_t dim = -1;
  for (int k = 0; k < num_parts_; ++k) {
    const Tensor& ids = ctx->input(num_vars + k);
    const Tensor& grads = ctx->input(num_vars + num_parts_ + k);
    const std::string& name = table_names_[k];
    const int64_t u = ids.NumElements();
    OP_REQUIRES(ctx, ids.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", name, "`: ids must be a vector; got ",
                    ids.shape().DebugString())));
    OP_REQUIRES(ctx,
                grads.dims() == 2 && grads.dim_size(0) == u &&
                    (dim < 0 || grads.dim_size(1) == dim),
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", name, "`: ", u, " ids but gradients ",
                    grads.shape().DebugString())));
    dim = grads.dim_size(1);
    parts[k] = Part{ids.flat<int64_t>().data(), grads.flat<float>().data(),
                    u};
  }

  std::vector<RefCountPtr<Var>> vars(num_vars);
  for (int i = 0; i < num_vars; ++i) {
    OP_REQUIRES_OK(ctx,
                   LookupResource(ctx, HandleFromInput(ctx, i), &vars[i]));
    OP_REQUIRES_OK(ctx, CheckFloatMatrix(
                            vars[i].get(),
                            absl::StrCat("Table `", Names(),
                                         "`: variable ", i)));
    OP_REQUIRES_OK(ctx, ::tensorflow::EnsureSparseVariableAccess<
                            CPUDevice, float>(ctx, vars[i].get()));
  }
  // Every variable of the table locked, in address order (as TF's
  // MaybeLockVariableInputMutexesInOrder), for the whole update.
  std::vector<Var*> order;
  for (auto& v : vars) order.push_back(v.get());
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  VariableLocks locks(order, Writes());
  std::vector<float*> data(num_vars);
  int64_t rows = 0;
  const int64_t stride = interleaved_ ? (1 + slots_) * dim : dim;
  for (int i = 0; i < num_vars; ++i) {
    RejoinColumns(vars[i].get());
    Tensor* t = vars[i]->tensor();
    OP_REQUIRES(ctx,
                t->dtype() == ::tensorflow::DT_FLOAT && t->dims() == 2 &&
                    t->dim_size(1) == stride &&
                    (i == 0 || t->dim_size(0) == rows),
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", Names(), "`: variable ", i,
                    " has shape ", t->shape().DebugString(),
                    ", expected [rows, ", stride, "] float32")));
    if (i == 0) rows = t->dim_size(0);
    data[i] = t->flat<float>().data();
    BackWithHugePages(vars[i].get(), *t);
  }
  for (int k = 0; k < num_parts_; ++k) {
    const int64_t* id = parts[k].id;
    for (int64_t r = 0; r < parts[k].u; ++r) {
      OP_REQUIRES(ctx, id[r] >= 0 && id[r] < rows,
                  absl::InvalidArgumentError(absl::StrCat(
                      "Table `", table_names_[k], "`: id ", id[r],
                      " outside [0, ", rows, ")")));
    }
  }
  data.resize(3, nullptr);
  if (interleaved_) {  // the slots' columns follow the parameters'
    for (int i = 1; i <= slots_; ++i) data[i] = data[0] + i * dim;
  }
  float *w = data[0], *s0 = data[1], *s1 = data[2];
  Finish(ctx, p, parts, dim, stride, w, s0, s1);
}

// TfembApplyRows' and TfembCheckRows' inputs: per part, vector ids and
// matrix gradients of as many rows; a scalar learning rate.
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
  return c->WithRank(c->input(n - 1), 0, &unused);
}

REGISTER_OP("TfembApplyRows")
    .Input("parameters: resource")
    .Input("slots: num_slots * resource")
    .Input("ids: num_parts * int64")
    .Input("gradients: num_parts * float")
    .Input("learning_rate: float")
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

REGISTER_KERNEL_BUILDER(Name("TfembApplyRows").Device(DEVICE_CPU),
                        ApplyRowsOp);

}  // namespace tfemb
