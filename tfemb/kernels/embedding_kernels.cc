// Fused CPU kernels for tfemb's host engine: one op per table for each part
// of a training step, instead of 17-26 small TensorFlow ops.
//
//   TfembDedupGather   the table's ids (every feature that shares it) ->
//                      distinct ids, each id's position among them, and each
//                      id's row (one hash pass, one read of each distinct
//                      row). Checks the id range first, naming the feature.
//   TfembRowGradients  per-id gradients -> one summed gradient per distinct
//                      row (in the order of the ids, as unsorted_segment_sum)
//                      and whether it is finite (or an error naming the table).
//   TfembApplyRows     the TPU's update (docs/numerics.md) on the touched rows
//                      of a table and its slots, in place: clip g, the
//                      optimizer's rule, decoupled weight decay, clip w.
//                      Several tables stacked in one variable (disjoint
//                      rows, one optimizer) are one op: a part per table.
//
// Each op checks its inputs' shapes and dtypes and its attributes before
// it reads or writes a variable, returning InvalidArgumentError: TensorFlow
// would abort the process on a tensor read as another shape or dtype.
//
// A table's slots may also sit beside its parameters in one variable of
// [rows, (1 + slots) x dim] (parameters first, then the slots in the
// optimizer's order): TfembDedupGather's `row_width` and TfembApplyRows'
// `interleaved` say so. A step's lookup then brings in the lines and the
// page its update needs (experiments/layout.py compares the two layouts).
//
// A checkpoint save of an interleaved table moves its rows out for a while
// (column_split.cc): each kernel puts them back first.
//
// The update's arithmetic follows tfemb/update_rules.py operation by
// operation (the same float32 constants, the same order), so both paths give
// the same bits, up to the rounding of pow (docs/numerics.md, 'Precision').

#define EIGEN_USE_THREADS

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

#include "column_split.h"
#include "tfemb_rules.h"  // generated: tfemb/kernels/rule_table.py

namespace tfemb {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
using ::tensorflow::core::RefCountPtr;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
using CPUDevice = Eigen::ThreadPoolDevice;

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1
#endif

// --- huge pages --------------------------------------------------------------

// Rows are read and written at random all over a table, so with 4 KiB pages
// nearly every row costs a TLB miss. Tables and slots of 4 MiB and more are
// backed by 2 MiB pages, best effort (a refusal changes nothing but speed):
//
// * A table created empty, before it is filled (TfembAdviseHugePages, from
//   tfemb/table_variables.py): MADV_HUGEPAGE, so the fill's page faults
//   take 2 MiB pages, 512 times fewer faults and nothing to copy later.
// * The first time a kernel sees a table or slot buffer: also
//   MADV_COLLAPSE (Linux >= 6.1, 2 MiB copied at a time) for pages already
//   touched on 4 KiB pages (a table filled whole by its initializer, a
//   restored one); instant where the pages are huge already. Once per
//   variable and buffer: a restore gives a variable a new buffer, which is
//   advised again.
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

// The 2 MiB-aligned interior of `t`'s buffer, [start, end); empty for
// buffers under 4 MiB.
std::pair<uintptr_t, uintptr_t> HugePageRange(const Tensor& t) {
  if (t.TotalBytes() < 2 * kHugePage) return {0, 0};
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.tensor_data().data());
  const uintptr_t start = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (begin + t.TotalBytes()) & ~(kHugePage - 1);
  return {start, std::max(start, end)};
}

void AdviseHugePages(const Tensor& t) {
  const auto [start, end] = HugePageRange(t);
  if (end > start) {
    madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
  }
}

void BackWithHugePages(const Var* var, const Tensor& t) {
  const auto [start, end] = HugePageRange(t);
  if (end <= start) return;
  static std::mutex* mu = new std::mutex;
  static auto* seen = new std::unordered_set<uint64_t>;
  const uint64_t key = static_cast<uint64_t>(start) ^
                       (reinterpret_cast<uintptr_t>(var) * 0x9E3779B97F4A7C15ull);
  {
    std::lock_guard<std::mutex> lock(*mu);
    if (!seen->insert(key).second) return;
  }
  void* at = reinterpret_cast<void*>(start);
  madvise(at, end - start, MADV_HUGEPAGE);
  madvise(at, end - start, MADV_COLLAPSE);
}

// --- input checks ------------------------------------------------------------

// OK if `var` holds an initialized float32 matrix. Checked before anything
// reads it as float (EnsureSparseVariableAccess<float> included, whose copy
// of a buffer of another dtype would abort the process).
// `what` names the variable in the error.
absl::Status CheckFloatMatrix(Var* var, const std::string& what) {
  ::tensorflow::tf_shared_lock lock(*var->mu());
  const Tensor& t = *var->tensor();
  if (!t.IsInitialized() || t.dtype() != ::tensorflow::DT_FLOAT ||
      t.dims() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be an initialized float32 matrix; got ",
        ::tensorflow::DataTypeString(t.dtype()), " ",
        t.shape().DebugString()));
  }
  return absl::OkStatus();
}

// --- shape functions -------------------------------------------------------

absl::Status DedupGatherShape(InferenceContext* c) {
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  if (dim < 1) return absl::InvalidArgumentError("dim must be at least 1");
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  int64_t total = 0;
  bool known = true;
  for (int i = 1; i < c->num_inputs(); ++i) {
    ShapeHandle ids;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &ids));
    auto n = c->Dim(ids, 0);
    if (!c->ValueKnown(n)) {
      known = false;
    } else {
      total += c->Value(n);
    }
  }
  auto n = known ? c->MakeDim(total) : c->UnknownDim();
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->Vector(n));
  c->set_output(2, c->Matrix(n, dim));
  return absl::OkStatus();
}

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

// --- TfembDedupGather -------------------------------------------------------

// Distinct values of `ids` in order of first occurrence (as tf.unique), by
// open addressing over a power-of-two table of at least twice the ids. The
// table holds only each distinct id's int32 position (-1: empty) and the ids
// themselves stay in `unique_`: 32 KiB for a batch of 4096 ids, the L1
// cache's size (int64 ids and positions side by side take four times that,
// and longer).
class Dedup {
 public:
  explicit Dedup(int64_t n) {
    int64_t capacity = 16;
    while (capacity < 2 * n) capacity <<= 1;
    mask_ = capacity - 1;
    at_.assign(capacity, -1);
    unique_.reserve(n);
  }

  // The position of `id` among the distinct ids, adding it if new.
  int64_t Insert(int64_t id) {
    uint64_t h = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull;
    int64_t i = static_cast<int64_t>(h >> 20) & mask_;
    while (true) {
      const int32_t p = at_[i];
      if (p < 0) {
        at_[i] = static_cast<int32_t>(unique_.size());
        unique_.push_back(id);
        return at_[i];
      }
      if (unique_[p] == id) return p;
      i = (i + 1) & mask_;
    }
  }

  const std::vector<int64_t>& unique() const { return unique_; }

 private:
  int64_t mask_;
  std::vector<int32_t> at_;  // position in unique_, or -1
  std::vector<int64_t> unique_;
};

// Rows are read at random from tables far larger than the caches: asking for
// a row this many rows ahead keeps several memory reads in flight.
constexpr int64_t kPrefetchRows = 12;

inline void PrefetchRow(const float* row, int64_t dim) {
  for (int64_t d = 0; d < dim; d += 16) __builtin_prefetch(row + d);
}

inline void CopyRow(float* __restrict to, const float* __restrict from,
                    int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) to[d] = from[d];
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

class DedupGatherOp : public OpKernel {
 public:
  explicit DedupGatherOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("vocabulary_size", &vocabulary_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_names", &feature_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_width", &row_width_));
    if (row_width_ == 0) row_width_ = dim_;
    OP_REQUIRES(ctx, dim_ >= 1 && vocabulary_size_ >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", table_name_, "`: dim must be at least 1 and "
                    "vocabulary_size at least 0; got ", dim_, " and ",
                    vocabulary_size_)));
    OP_REQUIRES(ctx, row_width_ >= dim_,
                absl::InvalidArgumentError("row_width below dim"));
    OP_REQUIRES(ctx,
                static_cast<int>(feature_names_.size()) ==
                    ctx->num_inputs() - 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", table_name_, "`: ", feature_names_.size(),
                    " feature names for ", ctx->num_inputs() - 1,
                    " id tensors")));
    std::vector<int64_t> stacked;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stacked", &stacked));
    OP_REQUIRES(ctx, stacked.empty() ||
                         (stacked.size() == 5 && stacked[0] >= 0 &&
                          stacked[1] > 0 && stacked[2] > 0 &&
                          stacked[3] >= 0 && stacked[4] >= 0),
                absl::InvalidArgumentError(
                    "stacked: [rows, sparse cores, rows per sparse core, "
                    "row offset, rotation], none negative"));
    if (!stacked.empty()) {
      rows_ = stacked[0];
      cores_ = stacked[1];
      rows_per_core_ = stacked[2];
      row_offset_ = stacked[3];
      rotation_ = stacked[4];
      for (int b = 0; b < 62; ++b) {
        if (cores_ == (int64_t{1} << b)) core_bits_ = b;
      }
    } else {
      rows_ = vocabulary_size_;
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_features = ctx->num_inputs() - 1;
    int64_t total = 0;
    for (int f = 0; f < num_features; ++f) {
      const Tensor& ids = ctx->input(f + 1);
      OP_REQUIRES(ctx, ids.dims() == 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      "Feature `", feature_names_[f], "` (table `",
                      table_name_, "`): ids must be a vector; got ",
                      ids.shape().DebugString())));
      const int64_t* v = ids.flat<int64_t>().data();
      for (int64_t i = 0; i < ids.NumElements(); ++i) {
        if (v[i] < 0 || v[i] >= vocabulary_size_) {
          ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(
              "Feature `", feature_names_[f], "` (table `", table_name_,
              "`): ids must be in [0, ", vocabulary_size_,
              ") (the vocabulary_size of the table); got ",
              v[i], " at position ", i, ".")));
          return;
        }
        const int64_t row = Row(v[i]);
        if (row < 0 || row >= rows_) {  // a stacking that does not fit
          ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(
              "Table `", table_name_, "`: id ", v[i], " maps to row ", row,
              ", outside the ", rows_, " rows of the variable.")));
          return;
        }
      }
      total += ids.NumElements();
    }
    OP_REQUIRES(ctx, total < (int64_t{1} << 30),
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", table_name_, "`: ", total,
                    " ids in one step; at most 2^30 - 1 are supported.")));

    Tensor* positions = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}),
                                             &positions));
    int64_t* pos = positions->flat<int64_t>().data();
    Dedup dedup(total);
    for (int f = 0, k = 0; f < num_features; ++f) {
      const Tensor& ids = ctx->input(f + 1);
      const int64_t* v = ids.flat<int64_t>().data();
      for (int64_t i = 0; i < ids.NumElements(); ++i) {
        pos[k++] = dedup.Insert(Row(v[i]));
      }
    }
    const auto& unique = dedup.unique();
    const int64_t u = static_cast<int64_t>(unique.size());
    Tensor* unique_ids = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({u}), &unique_ids));
    std::copy(unique.begin(), unique.end(),
              unique_ids->flat<int64_t>().data());

    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({total, dim_}),
                                             &rows));
    RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    OP_REQUIRES_OK(ctx, CheckFloatMatrix(
                            var.get(), absl::StrCat("Table `", table_name_,
                                                    "`: the variable")));
    OP_REQUIRES_OK(ctx, ::tensorflow::EnsureSparseVariableAccess<
                            CPUDevice, float>(ctx, var.get()));
    // First each distinct row once, in the order of the distinct ids, into
    // a compact buffer: the prefetches then run kPrefetchRows distinct rows
    // ahead (in the order of the ids, repeats of popular ids would take
    // half of them); then every id's row from that buffer, which the
    // caches hold: faster than one pass in the order of the ids (the whole
    // step: experiments/kernel_ab.py).
    Tensor compact;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                           TensorShape({u, dim_}), &compact));
    float* distinct = compact.flat<float>().data();
    {
      // Held for the whole copy (as ResourceGather does), so that a writer
      // does not see a second reference and copy the whole table.
      ::tensorflow::tf_shared_lock lock(*var->mu());
      RejoinColumns(var.get());  // if a save has split it (column_split.cc)
      const Tensor& table = *var->tensor();
      OP_REQUIRES_OK(ctx, CheckTable(table));
      BackWithHugePages(var.get(), table);
      const float* src = table.flat<float>().data();
      WithWidth(dim_, [&](auto width) {
        const int64_t dim = Width<decltype(width)::value>(dim_);
        for (int64_t r = 0; r < u; ++r) {
          if (r + kPrefetchRows < u) {
            PrefetchRow(src + unique[r + kPrefetchRows] * row_width_, dim);
          }
          CopyRow(distinct + r * dim, src + unique[r] * row_width_, dim);
        }
      });
    }
    float* out = rows->flat<float>().data();
    WithWidth(dim_, [&](auto width) {
      const int64_t dim = Width<decltype(width)::value>(dim_);
      for (int64_t k = 0; k < total; ++k) {
        CopyRow(out + k * dim, distinct + pos[k] * dim, dim);
      }
    });
  }

 private:
  absl::Status CheckTable(const Tensor& table) const {
    if (table.dtype() != ::tensorflow::DT_FLOAT || table.dims() != 2 ||
        table.dim_size(0) != rows_ || table.dim_size(1) != row_width_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Table `", table_name_, "`: expected a float32 variable of shape [",
          rows_, ", ", row_width_, "], got ", table.shape().DebugString()));
    }
    return absl::OkStatus();
  }

  // The variable's row of an id: the id itself, or in a table stacked as
  // on a SparseCore (tfemb/sparsecore/table_stacking.py) the row of its
  // sparse core's block: ((id mod cores + rotation) mod cores) * rows per
  // core + row offset + id / cores.
  int64_t Row(int64_t id) const {
    if (cores_ == 0) return id;
    if (core_bits_ >= 0) {  // a power of two, as on every SparseCore TPU
      const int64_t mask = cores_ - 1;
      return (((id & mask) + rotation_) & mask) * rows_per_core_ +
             row_offset_ + (id >> core_bits_);
    }
    return ((id % cores_ + rotation_) % cores_) * rows_per_core_ +
           row_offset_ + id / cores_;
  }

  int64_t vocabulary_size_;
  int64_t rows_;  // of the variable
  int64_t cores_ = 0;  // 0: not stacked
  int core_bits_ = -1;  // log2(cores_) where cores_ is a power of two
  int64_t rows_per_core_ = 0;
  int64_t row_offset_ = 0;
  int64_t rotation_ = 0;
  int64_t dim_;
  int64_t row_width_;  // of the variable: dim, or more with slots beside
  std::vector<std::string> feature_names_;
  std::string table_name_;
};

// --- TfembReadColumns -------------------------------------------------------

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

// --- TfembWriteColumns ------------------------------------------------------

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

// --- TfembRowGradients ------------------------------------------------------

inline void AddRow(float* __restrict row, const float* __restrict g,
                   int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) row[d] += g[d];
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
    std::fill(sums, sums + u * dim, 0.0f);
    const float* g = grads.flat<float>().data();
    const int64_t* pos = positions.flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, pos[i] >= 0 && pos[i] < u,
                  absl::InvalidArgumentError(absl::StrCat(
                      "Table `", table_name_, "`: position ", pos[i],
                      " outside [0, ", u, ") (the distinct ids)")));
    }
    WithWidth(dim, [&](auto width) {
      const int64_t w = Width<decltype(width)::value>(dim);
      for (int64_t i = 0; i < n; ++i) AddRow(sums + pos[i] * w, g + i * w, w);
    });
    const bool finite = AllFinite(sums, u * dim);
    OP_REQUIRES(ctx, finite || !raise_,
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", table_name_,
                    "`: non-finite (NaN or Inf) embedding gradient; no table "
                    "was updated.")));
    Tensor* ok = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &ok));
    ok->scalar<bool>()() = finite;
  }

 private:
  std::string table_name_;
  bool raise_;
};

// --- TfembApplyRows ---------------------------------------------------------

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

// The whole pipeline on every touched row: clip g, rule, decay, clip w.
// Row i of the parameters is at w + i * stride, of the slots at s0 and s1 +
// i * stride: stride is dim for separate variables, or (1 + slots) x dim with
// the slots beside the parameters in one variable (s0 = w + dim, ...).
// kDim: the row width compiled in (WithWidth), or 0 for `width` at run time.
template <typename Rule, int64_t kDim>
void ApplyAll(const Update& p, const int64_t* ids, const float* grads,
              int64_t u, int64_t width, int64_t stride, float* w, float* s0,
              float* s1) {
  const int64_t dim = Width<kDim>(width);
  std::vector<float> clipped(dim), old(dim);
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
    if (p.decay != 0.0f) std::copy(wr, wr + dim, old.data());
    RuleRow<Rule>(p, g, wr, s0 ? s0 + at : nullptr, s1 ? s1 + at : nullptr,
                   dim);
    if (p.decay != 0.0f) {
      const float decay = p.decay;
      const float* o = old.data();
      for (int64_t d = 0; d < dim; ++d) wr[d] = wr[d] - decay * o[d];
    }
    if (p.clip_w) ClipRow(wr, wr, p.clip_w_min, p.clip_w_max, dim);
  }
}

// ApplyAll for `Rule`, its loops compiled for the row's width where
// WithWidth has it.
template <typename Rule>
void ApplyRule(const Update& p, const int64_t* ids, const float* grads,
               int64_t u, int64_t width, int64_t stride, float* w, float* s0,
               float* s1) {
  WithWidth(width, [&](auto k) {
    ApplyAll<Rule, decltype(k)::value>(p, ids, grads, u, width, stride, w,
                                       s0, s1);
  });
}

using ApplyFn = void (*)(const Update&, const int64_t*, const float*,
                         int64_t, int64_t, int64_t, float*, float*, float*);

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
bool FindRule(const std::string& name, std::tuple<Rules...>*, Rule* found) {
  return ((name == Rules::kName
               ? (*found = Rule{&ApplyRule<Rules>, Rules::kSlots,
                                Rules::kConstants},
                  true)
               : false) ||
          ...);
}

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

  void Compute(OpKernelContext* ctx) override {
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

 protected:
  // Whether Finish writes the variables (an exclusive lock) or only reads
  // them (a shared one, so that checks of one variable run side by side).
  virtual bool Writes() const { return true; }

  // One table's rows of the variable: its ids and their gradients.
  struct Part {
    const int64_t* id;
    const float* g;
    int64_t u;
  };

  // With every variable locked and every input checked: the update, the
  // parts side by side (their rows are disjoint).
  virtual void Finish(OpKernelContext* ctx, const Update& p,
                      const std::vector<Part>& parts, int64_t dim,
                      int64_t stride, float* w, float* s0, float* s1) {
    ForParts(ctx, parts, [&](const Part& part, int) {
      apply_(p, part.id, part.g, part.u, dim, stride, w, s0, s1);
    });
  }

  // fn(part, index) for every part, the parts shared out as they are
  // taken: this thread takes them one after another, and so does each of
  // the CPU's worker threads that starts before they are all taken (one op
  // covers tables stacked in one variable, which separate ops would have
  // updated side by side). A worker that starts late finds none left:
  // nothing waits for it.
  template <typename F>
  static void ForParts(OpKernelContext* ctx, const std::vector<Part>& parts,
                       F&& fn) {
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

  // The tables' names, for an error about the variable they share.
  std::string Names() const { return absl::StrJoin(table_names_, "`, `"); }

  ApplyFn apply_;
  int num_parts_;

 private:
  std::vector<std::string> table_names_;
  Update p_;
  bool decay_by_lr_;
  bool interleaved_;  // slots beside the parameters, in one variable
  int slots_;
};

// --- TfembCheckRows -----------------------------------------------------------

// Whether TfembApplyRows with the same inputs would leave every touched row
// of the table and of its slots finite, one bool per part (table); writes
// nothing. The rows are
// updated by the same rule in a scratch copy, kChunk rows at a time
// ([kChunk, 3 x dim]: parameters, slot 0, slot 1; small enough to stay in
// cache).
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

// --- TfembAdviseHugePages ---------------------------------------------------

// MADV_HUGEPAGE on a variable's buffer (above): for a table created empty,
// before it is filled.
class AdviseHugePagesOp : public OpKernel {
 public:
  explicit AdviseHugePagesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    ::tensorflow::tf_shared_lock lock(*var->mu());
    if (var->tensor()->IsInitialized()) AdviseHugePages(*var->tensor());
  }
};

}  // namespace

REGISTER_OP("TfembDedupGather")
    .Input("table: resource")
    .Input("ids: num_features * int64")
    .Output("unique_ids: int64")
    .Output("positions: int64")
    .Output("embeddings: float")
    .Attr("num_features: int >= 1")
    .Attr("vocabulary_size: int")
    .Attr("dim: int")
    .Attr("feature_names: list(string)")
    .Attr("table_name: string")
    .Attr("row_width: int = 0")  // the variable's; 0: dim (parameters only)
    // [rows, sparse cores, rows per sparse core, row offset, rotation] of a
    // stacked table (ids < vocabulary_size, rows of a [rows, ...] variable);
    // empty: the variable's rows are the ids.
    .Attr("stacked: list(int) = []")
    .SetIsStateful()
    .SetShapeFn(DedupGatherShape);

REGISTER_OP("TfembAdviseHugePages")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

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

REGISTER_OP("TfembRowGradients")
    .Input("gradients: float")
    .Input("positions: int64")
    .Input("unique_ids: int64")
    .Output("row_gradients: float")
    .Output("finite: bool")
    .Attr("table_name: string")
    .Attr("raise_non_finite: bool")
    .SetShapeFn(RowGradientsShape);

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
REGISTER_KERNEL_BUILDER(Name("TfembDedupGather").Device(DEVICE_CPU),
                        DedupGatherOp);
REGISTER_KERNEL_BUILDER(Name("TfembAdviseHugePages").Device(DEVICE_CPU),
                        AdviseHugePagesOp);
REGISTER_KERNEL_BUILDER(Name("TfembReadColumns").Device(DEVICE_CPU),
                        ReadColumnsOp);
REGISTER_KERNEL_BUILDER(Name("TfembWriteColumns").Device(DEVICE_CPU),
                        WriteColumnsOp);
REGISTER_KERNEL_BUILDER(Name("TfembRowGradients").Device(DEVICE_CPU),
                        RowGradientsOp);
REGISTER_KERNEL_BUILDER(Name("TfembApplyRows").Device(DEVICE_CPU),
                        ApplyRowsOp);

}  // namespace tfemb
