// TfembApplyRows: the update (update_rules.h) on the touched rows of a
// table and its slots, in place, all or nothing: each update is computed
// once, the old rows and slots kept beside it (`undo`), and put back at
// once if any new value is not finite. TfembRestoreRows puts them back
// later, when another table of the step turned out not finite. Several
// tables stacked in one variable (disjoint rows, one optimizer) are one op:
// a part per table. With `interleaved`, the slots sit beside the parameters
// in one variable of [rows, (1 + slots) x dim].

#define EIGEN_USE_THREADS

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "tf_kernel.h"

#include "column_split.h"
#include "huge_pages.h"
#include "input_checks.h"
#include "update_rules.h"

namespace tfemb {
namespace {

// One table's rows of the variable: its ids, and the rows beside them (its
// gradients, or its undo rows).
struct Part {
  const int64_t* id;
  const float* rows;
  int64_t u;
};

// The variables of one table or stack (parameters, then slots), looked up,
// checked as float matrices of one shape, and locked for writing in address
// order (as TF's MaybeLockVariableInputMutexesInOrder) until destroyed.
class LockedTable {
 public:
  // Variables are inputs [0, num_vars); rows are `stride` floats wide.
  absl::Status Open(OpKernelContext* ctx, int num_vars, int64_t stride,
                    int slots, bool interleaved, const std::string& names) {
    vars_.resize(num_vars);
    for (int i = 0; i < num_vars; ++i) {
      TF_RETURN_IF_ERROR(
          LookupResource(ctx, HandleFromInput(ctx, i), &vars_[i]));
      TF_RETURN_IF_ERROR(CheckFloatMatrix(
          vars_[i].get(), absl::StrCat("Table `", names, "`: variable ", i)));
      TF_RETURN_IF_ERROR(::tensorflow::EnsureSparseVariableAccess<
                         CPUDevice, float>(ctx, vars_[i].get()));
    }
    for (auto& v : vars_) order_.push_back(v.get());
    std::sort(order_.begin(), order_.end());
    order_.erase(std::unique(order_.begin(), order_.end()), order_.end());
    for (Var* v : order_) v->mu()->lock();
    locked_ = true;
    std::vector<float*> data(3, nullptr);
    for (int i = 0; i < num_vars; ++i) {
      RejoinColumns(vars_[i].get());
      Tensor* t = vars_[i]->tensor();
      if (t->dtype() != ::tensorflow::DT_FLOAT || t->dims() != 2 ||
          t->dim_size(1) != stride || (i > 0 && t->dim_size(0) != rows)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Table `", names, "`: variable ", i, " has shape ",
            t->shape().DebugString(), ", expected [rows, ", stride,
            "] float32"));
      }
      if (i == 0) rows = t->dim_size(0);
      data[i] = t->flat<float>().data();
      BackWithHugePages(vars_[i].get(), *t);
    }
    if (interleaved) {  // the slots' columns follow the parameters'
      const int64_t dim = stride / (1 + slots);
      for (int i = 1; i <= slots; ++i) data[i] = data[0] + i * dim;
    }
    w = data[0];
    s0 = data[1];
    s1 = data[2];
    return absl::OkStatus();
  }

  ~LockedTable() {
    if (!locked_) return;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      (*it)->mu()->unlock();
    }
  }

  int64_t rows = 0;
  float *w = nullptr, *s0 = nullptr, *s1 = nullptr;

 private:
  std::vector<RefCountPtr<Var>> vars_;
  std::vector<Var*> order_;
  bool locked_ = false;
};

// OK if every id of every part is a row of the table.
absl::Status CheckIdRange(const std::vector<Part>& parts, int64_t rows,
                          const std::vector<std::string>& names) {
  for (size_t k = 0; k < parts.size(); ++k) {
    const int64_t* id = parts[k].id;
    for (int64_t r = 0; r < parts[k].u; ++r) {
      if (id[r] < 0 || id[r] >= rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("Table `", names[k], "`: id ", id[r],
                         " outside [0, ", rows, ")"));
      }
    }
  }
  return absl::OkStatus();
}

// fn(part, index) for every part, the parts shared out as they are taken:
// this thread takes them one after another, and so does each of the CPU's
// worker threads that starts before they are all taken (one op covers
// tables stacked in one variable, which separate ops would have updated
// side by side). A worker that starts late finds none left: nothing waits
// for it.
template <typename F>
void ForParts(OpKernelContext* ctx, const std::vector<Part>& parts, F&& fn) {
  const int n = static_cast<int>(parts.size());
  if (n == 1) {
    fn(parts[0], 0);
    return;
  }
  struct Shared {
    std::atomic<int> next{0};  // the next part to take
    std::atomic<int> done{0};  // parts finished
    std::function<void(int)> run;
  };
  auto shared = std::make_shared<Shared>();
  shared->run = [&](int k) { fn(parts[k], k); };
  auto take = [](Shared* s, int n) {
    for (int k; (k = s->next.fetch_add(1)) < n;) {
      s->run(k);
      s->done.fetch_add(1, std::memory_order_release);
    }
  };
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int helpers = std::min(n, workers->num_threads) - 1;
  for (int i = 0; i < helpers; ++i) {
    workers->workers->Schedule([shared, n, take] { take(shared.get(), n); });
  }
  take(shared.get(), n);
  while (shared->done.load(std::memory_order_acquire) < n) {
    std::this_thread::yield();  // a part a worker has taken, finishing
  }
}

// Each part's first row in the undo rows: the parts' rows one after the
// other, in part order.
std::vector<int64_t> FirstRows(const std::vector<Part>& parts) {
  std::vector<int64_t> first(parts.size() + 1, 0);
  for (size_t k = 0; k < parts.size(); ++k) {
    first[k + 1] = first[k] + parts[k].u;
  }
  return first;
}

// Per part: `ids` vector and `rows` [ids, dim] (dim the same for every
// part, -1 until the first); the error names the part's table.
absl::Status ReadParts(OpKernelContext* ctx, int first_ids,
                       const std::vector<std::string>& names, bool per_part,
                       std::vector<Part>* parts, int64_t* dim) {
  const int n = static_cast<int>(parts->size());
  for (int k = 0; k < n; ++k) {
    const Tensor& ids = ctx->input(first_ids + k);
    if (ids.dims() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Table `", names[k], "`: ids must be a vector; got ",
          ids.shape().DebugString()));
    }
    (*parts)[k] = Part{ids.flat<int64_t>().data(), nullptr, ids.dim_size(0)};
    if (!per_part) continue;
    const Tensor& grads = ctx->input(first_ids + n + k);
    const int64_t u = ids.dim_size(0);
    if (grads.dims() != 2 || grads.dim_size(0) != u ||
        (*dim >= 0 && grads.dim_size(1) != *dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Table `", names[k], "`: ", u, " ids but gradients ",
                       grads.shape().DebugString()));
    }
    *dim = grads.dim_size(1);
    (*parts)[k].rows = grads.flat<float>().data();
  }
  return absl::OkStatus();
}

class ApplyRowsOp : public OpKernel {
 public:
  explicit ApplyRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
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
    OP_REQUIRES(ctx,
                FindRule(rule, static_cast<rules::All*>(nullptr), &found),
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

  void Compute(OpKernelContext* ctx) override {
    // parameters, slots, then ids and gradients per part, learning rate
    const int num_vars = ctx->num_inputs() - 1 - 2 * num_parts_;
    const std::string names = absl::StrJoin(table_names_, "`, `");
    const Tensor& lr = ctx->input(ctx->num_inputs() - 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(lr.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", names, "`: the learning rate must be a "
                    "scalar; got shape ", lr.shape().DebugString())));
    Update p = p_;
    p.lr = lr.scalar<float>()();
    if (decay_by_lr_) p.decay = p.decay * p.lr;
    std::vector<Part> parts(num_parts_);
    int64_t dim = -1;
    OP_REQUIRES_OK(ctx,
                   ReadParts(ctx, num_vars, table_names_, true, &parts, &dim));
    const int64_t stride = interleaved_ ? (1 + slots_) * dim : dim;
    const std::vector<int64_t> first = FirstRows(parts);
    ::tensorflow::OpOutputList finite;
    OP_REQUIRES_OK(ctx, ctx->output_list("finite", &finite));
    std::vector<bool*> ok(num_parts_);
    for (int k = 0; k < num_parts_; ++k) {
      Tensor* t;
      OP_REQUIRES_OK(ctx, finite.allocate(k, TensorShape({}), &t));
      ok[k] = t->scalar<bool>().data();
    }
    Tensor* undo;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            "undo",
                            TensorShape({first.back(), (1 + slots_) * dim}),
                            &undo));

    LockedTable table;
    OP_REQUIRES_OK(ctx, table.Open(ctx, num_vars, stride, slots_,
                                   interleaved_, names));
    OP_REQUIRES_OK(ctx, CheckIdRange(parts, table.rows, table_names_));
    float* saved = undo->flat<float>().data();
    const int64_t width = (1 + slots_) * dim;
    ForParts(ctx, parts, [&](const Part& part, int k) {
      *ok[k] = apply_(p, part.id, part.rows, part.u, dim, stride, table.w,
                      table.s0, table.s1, saved + first[k] * width);
    });
    if (std::all_of(ok.begin(), ok.end(), [](bool* b) { return *b; })) {
      return;
    }
    // A part's new values are not all finite: no part is written.
    ForParts(ctx, parts, [&](const Part& part, int k) {
      RestoreAll(part.id, part.u, dim, stride, width,
                 saved + first[k] * width, table.w, table.s0, table.s1);
    });
  }

 private:
  std::vector<std::string> table_names_;
  int num_parts_;
  ApplyFn apply_;
  Update p_;
  bool decay_by_lr_;
  bool interleaved_;  // slots beside the parameters, in one variable
  int slots_;
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
    int64_t unused = -1;
    OP_REQUIRES_OK(ctx, ReadParts(ctx, num_vars, table_names_, false, &parts,
                                  &unused));
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
    LockedTable table;
    OP_REQUIRES_OK(ctx, table.Open(ctx, num_vars, dim, 0, false, names));
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
