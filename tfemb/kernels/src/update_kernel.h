// What the update kernels share (TfembApplyRows and TfembRestoreRows in
// apply_rows.cc, TfembApplyTables in apply_tables.cc): a step's tables'
// variables looked up, checked and locked; their ids and gradients read;
// the rule's attributes; and every part's update side by side, all or
// nothing.

#ifndef TFEMB_KERNELS_UPDATE_KERNEL_H_
#define TFEMB_KERNELS_UPDATE_KERNEL_H_

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

#include "tf_kernel.h"

#include "column_split.h"
#include "huge_pages.h"
#include "input_checks.h"
#include "update_rules.h"

namespace tfemb {

// One table's rows of the variable: its ids, and the rows beside them (its
// gradients, or its undo rows).
struct Part {
  const int64_t* id;
  const float* rows;
  int64_t u;
};

// The variables of one or more tables (each its parameters, then its
// slots), looked up, checked as float matrices of one shape per table, and
// locked for writing in address order across all of them (as TF's
// MaybeLockVariableInputMutexesInOrder) until destroyed. Tables stacked in
// one variable name it more than once: it is locked once.
class LockedTables {
 public:
  // Table t's variables are inputs [first + t * per_table, ...) and its
  // rows `strides[t]` floats wide; `names[t]` names it in errors.
  absl::Status Open(OpKernelContext* ctx, int first, int per_table,
                    const std::vector<int64_t>& strides, int slots,
                    bool interleaved, const std::vector<std::string>& names) {
    const int tables = static_cast<int>(strides.size());
    vars_.resize(tables * per_table);
    for (int i = 0; i < tables * per_table; ++i) {
      TF_RETURN_IF_ERROR(
          LookupResource(ctx, HandleFromInput(ctx, first + i), &vars_[i]));
      TF_RETURN_IF_ERROR(CheckFloatMatrix(
          vars_[i].get(), absl::StrCat("Table `", names[i / per_table],
                                       "`: variable ", i % per_table)));
      TF_RETURN_IF_ERROR(::tensorflow::EnsureSparseVariableAccess<
                         CPUDevice, float>(ctx, vars_[i].get()));
    }
    for (auto& v : vars_) order_.push_back(v.get());
    std::sort(order_.begin(), order_.end());
    order_.erase(std::unique(order_.begin(), order_.end()), order_.end());
    for (Var* v : order_) v->mu()->lock();
    locked_ = true;
    tables_.resize(tables);
    for (int t = 0; t < tables; ++t) {
      TF_RETURN_IF_ERROR(OpenTable(t, per_table, strides[t], slots,
                                   interleaved, names[t]));
    }
    return absl::OkStatus();
  }

  ~LockedTables() {
    if (!locked_) return;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      (*it)->mu()->unlock();
    }
  }

  struct Table {
    int64_t rows = 0;
    float *w = nullptr, *s0 = nullptr, *s1 = nullptr;
  };
  const Table& table(int t) const { return tables_[t]; }

 private:
  absl::Status OpenTable(int t, int per_table, int64_t stride, int slots,
                         bool interleaved, const std::string& name) {
    Table& table = tables_[t];
    std::vector<float*> data(3, nullptr);
    for (int i = 0; i < per_table; ++i) {
      Var* var = vars_[t * per_table + i].get();
      RejoinColumns(var);
      Tensor* x = var->tensor();
      if (x->dtype() != ::tensorflow::DT_FLOAT || x->dims() != 2 ||
          x->dim_size(1) != stride || (i > 0 && x->dim_size(0) != table.rows)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Table `", name, "`: variable ", i, " has shape ",
            x->shape().DebugString(), ", expected [rows, ", stride,
            "] float32"));
      }
      if (i == 0) table.rows = x->dim_size(0);
      data[i] = x->flat<float>().data();
      BackWithHugePages(var, *x);
    }
    if (interleaved) {  // the slots' columns follow the parameters'
      const int64_t dim = stride / (1 + slots);
      for (int i = 1; i <= slots; ++i) data[i] = data[0] + i * dim;
    }
    table.w = data[0];
    table.s0 = data[1];
    table.s1 = data[2];
    return absl::OkStatus();
  }

  std::vector<RefCountPtr<Var>> vars_;
  std::vector<Var*> order_;
  std::vector<Table> tables_;
  bool locked_ = false;
};

// OK if every id of every part is a row of the table.
inline absl::Status CheckIdRange(const std::vector<Part>& parts, int64_t rows,
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

// fn(k) for k in [0, n), shared out as they are taken: this thread takes
// them one after another, and so does each of the CPU's worker threads
// that starts before they are all taken (one op covers several tables, or
// tables stacked in one variable, which separate ops would have updated
// side by side). A worker that starts late finds none left: nothing waits
// for it.
template <typename F>
inline void ForEach(OpKernelContext* ctx, int n, F&& fn) {
  if (n == 1) {
    fn(0);
    return;
  }
  struct Shared {
    std::atomic<int> next{0};  // the next k to take
    std::atomic<int> done{0};  // ks finished
    std::function<void(int)> run;
  };
  auto shared = std::make_shared<Shared>();
  shared->run = [&](int k) { fn(k); };
  auto take = [](Shared* s, int n) {
    for (int k; (k = s->next.fetch_add(1)) < n;) {
      s->run(k);
      s->done.fetch_add(1, std::memory_order_release);
    }
  };
  // The helpers run on the executor's own threads (its runner), which are
  // awake between ops: a worker of the intra-op pool, asleep, would start
  // tens of microseconds late (benchmarks/profile.py shows it).
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int helpers = std::min(n, workers->num_threads) - 1;
  for (int i = 0; i < helpers; ++i) {
    auto help = [shared, n, take] { take(shared.get(), n); };
    if (ctx->runner() != nullptr) {
      (*ctx->runner())(help);
    } else {
      workers->workers->Schedule(help);
    }
  }
  take(shared.get(), n);
  while (shared->done.load(std::memory_order_acquire) < n) {
    std::this_thread::yield();  // a k a worker has taken, finishing
  }
}

// fn(part, index) for every part, as ForEach shares them out.
template <typename F>
inline void ForParts(OpKernelContext* ctx, const std::vector<Part>& parts,
                     F&& fn) {
  ForEach(ctx, static_cast<int>(parts.size()),
          [&](int k) { fn(parts[k], k); });
}

// Each part's first row in the undo rows: the parts' rows one after the
// other, in part order.
inline std::vector<int64_t> FirstRows(const std::vector<Part>& parts) {
  std::vector<int64_t> first(parts.size() + 1, 0);
  for (size_t k = 0; k < parts.size(); ++k) {
    first[k + 1] = first[k] + parts[k].u;
  }
  return first;
}

// Per part: `ids` vector and, with `dims`, `rows` [ids, dim] and its dim
// (the same for every part if `one_dim`); the error names the part's table.
// With `per_id`, the gradients are the ids looked up, one row each, at the
// positions (vectors) that follow them: [positions, dim], left to sum.
inline absl::Status ReadParts(OpKernelContext* ctx, int first_ids,
                              const std::vector<std::string>& names,
                              std::vector<Part>* parts,
                              std::vector<int64_t>* dims = nullptr,
                              bool one_dim = true, bool per_id = false) {
  const int n = static_cast<int>(parts->size());
  for (int k = 0; k < n; ++k) {
    const Tensor& ids = ctx->input(first_ids + k);
    if (ids.dims() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Table `", names[k], "`: ids must be a vector; got ",
          ids.shape().DebugString()));
    }
    (*parts)[k] = Part{ids.flat<int64_t>().data(), nullptr, ids.dim_size(0)};
    if (dims == nullptr) continue;
    const Tensor& grads = ctx->input(first_ids + n + k);
    int64_t rows = ids.dim_size(0);
    std::string what = absl::StrCat(rows, " ids");
    if (per_id) {
      const Tensor& positions = ctx->input(first_ids + 2 * n + k);
      if (positions.dims() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Table `", names[k], "`: positions must be a vector; got ",
            positions.shape().DebugString()));
      }
      rows = positions.dim_size(0);
      what = absl::StrCat(rows, " ids looked up");
    }
    if (grads.dims() != 2 || grads.dim_size(0) != rows ||
        (one_dim && k > 0 && grads.dim_size(1) != (*dims)[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat("Table `", names[k], "`: ", what, " but gradients ",
                       grads.shape().DebugString()));
    }
    dims->push_back(grads.dim_size(1));
    (*parts)[k].rows = grads.flat<float>().data();
  }
  return absl::OkStatus();
}

// The update's rule and constants, from an op's attributes (TfembApplyRows'
// and TfembApplyTables').
class RuleAttrs {
 public:
  absl::Status Read(OpKernelConstruction* ctx) {
    std::string rule;
    std::vector<float> h, clip_g, clip_w;
    TF_RETURN_IF_ERROR(ctx->GetAttr("rule", &rule));
    TF_RETURN_IF_ERROR(ctx->GetAttr("hyperparameters", &h));
    TF_RETURN_IF_ERROR(ctx->GetAttr("clip_gradient", &clip_g));
    TF_RETURN_IF_ERROR(ctx->GetAttr("clip_weight", &clip_w));
    TF_RETURN_IF_ERROR(ctx->GetAttr("weight_decay_factor", &p_.decay));
    TF_RETURN_IF_ERROR(
        ctx->GetAttr("multiply_weight_decay_by_lr", &decay_by_lr_));
    TF_RETURN_IF_ERROR(ctx->GetAttr("interleaved", &interleaved));
    if (clip_g.size() != 2 || clip_w.size() != 2) {
      return absl::InvalidArgumentError("clip bounds: [min, max]");
    }
    p_.clip_g_min = clip_g[0];
    p_.clip_g_max = clip_g[1];
    p_.clip_w_min = clip_w[0];
    p_.clip_w_max = clip_w[1];
    p_.clip_g = !std::isinf(clip_g[0]) || !std::isinf(clip_g[1]);
    p_.clip_w = !std::isinf(clip_w[0]) || !std::isinf(clip_w[1]);
    Rule found;
    if (!FindRule(rule, static_cast<rules::All*>(nullptr), &found)) {
      return absl::InvalidArgumentError("unknown rule " + rule);
    }
    apply = found.apply;
    slots = found.slots;
    if (static_cast<int>(h.size()) != found.constants) {
      return absl::InvalidArgumentError("wrong number of constants for " +
                                        rule);
    }
    std::fill(p_.h, p_.h + rules::kMaxConstants, 0.0f);
    std::copy(h.begin(), h.end(), p_.h);
    name = rule;
    return absl::OkStatus();
  }

  // The variables per table: the parameters, and each slot unless they sit
  // beside the parameters.
  int VariablesPerTable() const { return interleaved ? 1 : 1 + slots; }

  // The update's constants at learning rate `lr` (a scalar tensor); the
  // error names `names`.
  absl::Status At(const Tensor& lr, const std::string& names,
                  Update* p) const {
    if (!TensorShapeUtils::IsScalar(lr.shape())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Table `", names, "`: the learning rate must be a scalar; got "
          "shape ", lr.shape().DebugString()));
    }
    *p = p_;
    p->lr = lr.scalar<float>()();
    if (decay_by_lr_) p->decay = p->decay * p->lr;
    return absl::OkStatus();
  }

  ApplyFn apply = nullptr;
  int slots = 0;
  bool interleaved = false;  // slots beside the parameters, in one variable
  std::string name;

 private:
  Update p_;
  bool decay_by_lr_ = false;
};

// What one part's update writes: its constants, its row's width in the
// gradients, in the variable (stride) and in the undo rows, its table, and
// its undo rows.
struct Target {
  Update p;
  int64_t dim, stride, width;
  LockedTables::Table table;
  float* undo;
};

// The `finite` output list's n scalars.
inline absl::Status FiniteOutputs(OpKernelContext* ctx, int n,
                                  std::vector<bool*>* ok) {
  ::tensorflow::OpOutputList finite;
  TF_RETURN_IF_ERROR(ctx->output_list("finite", &finite));
  ok->resize(n);
  for (int k = 0; k < n; ++k) {
    Tensor* t;
    TF_RETURN_IF_ERROR(finite.allocate(k, TensorShape({}), &t));
    (*ok)[k] = t->scalar<bool>().data();
    *(*ok)[k] = true;
  }
  return absl::OkStatus();
}

// Every part's update, side by side (`ok[k]`: part k's new values are
// finite); where any part's are not, every part updated is put back.
// `ready(k)`, where given, runs first in part k's turn: false leaves part k
// as it is (and `ok[k]` false), so every part is put back too.
inline void ApplyAllOrNothing(OpKernelContext* ctx, const RuleAttrs& rule,
                              const std::vector<Part>& parts,
                              const std::vector<Target>& targets,
                              const std::vector<bool*>& ok,
                              const std::function<bool(int)>& ready = nullptr) {
  std::vector<char> applied(parts.size(), 0);
  ForParts(ctx, parts, [&](const Part& part, int k) {
    if (ready && !ready(k)) {
      *ok[k] = false;
      return;
    }
    const Target& t = targets[k];
    *ok[k] = rule.apply(t.p, part.id, part.rows, part.u, t.dim, t.stride,
                        t.table.w, t.table.s0, t.table.s1, t.undo);
    applied[k] = 1;
  });
  if (std::all_of(ok.begin(), ok.end(), [](bool* b) { return *b; })) {
    return;
  }
  // A part's new values are not all finite: no part is written.
  ForParts(ctx, parts, [&](const Part& part, int k) {
    if (!applied[k]) return;
    const Target& t = targets[k];
    RestoreAll(part.id, part.u, t.dim, t.stride, t.width, t.undo, t.table.w,
               t.table.s0, t.table.s1);
  });
}

// What TfembApplyRows and TfembApplyTables read from their attributes: a
// table name per part, the number of parts (attribute `count`), and the
// rule; each part has `inputs_per_part` inputs besides the variables, and
// with `variables_per_part` variables of its own (else all share one
// table's).
class UpdateKernel : public OpKernel {
 protected:
  // `extra_inputs`: inputs beyond the variables, `inputs_per_part` per
  // part and the last one (TfembApplyTables' gradients in pieces).
  UpdateKernel(OpKernelConstruction* ctx, const char* count,
               int inputs_per_part, bool variables_per_part,
               int extra_inputs = 0)
      : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(count, &num_parts_));
    OP_REQUIRES(ctx, static_cast<int>(table_names_.size()) == num_parts_,
                absl::InvalidArgumentError("table_names: one name per part"));
    OP_REQUIRES_OK(ctx, rule_.Read(ctx));
    const int sets = variables_per_part ? num_parts_ : 1;
    OP_REQUIRES(ctx, ctx->num_inputs() - 1 - extra_inputs -
                             inputs_per_part * num_parts_ ==
                         sets * rule_.VariablesPerTable(),
                absl::InvalidArgumentError(
                    "wrong number of variables for " + rule_.name));
  }

  std::vector<std::string> table_names_;
  int num_parts_;
  RuleAttrs rule_;
};


}  // namespace tfemb

#endif  // TFEMB_KERNELS_UPDATE_KERNEL_H_
