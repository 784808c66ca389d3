// TfembDedupGather: the table's ids (every feature that shares it) ->
// distinct ids, each id's position among them, and each id's row (one hash
// pass, one read of each distinct row). Checks the id range first, naming
// the feature.
//
// A table's slots may also sit beside its parameters in one variable of
// [rows, (1 + slots) x dim] (parameters first, then the slots in the
// optimizer's order): `row_width` says so, and the lookup then brings in
// the lines and the page the table's update needs (experiments/layout.py
// compares the two layouts).

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tf_kernel.h"

#include "column_split.h"
#include "dedup.h"
#include "huge_pages.h"
#include "input_checks.h"
#include "row_loops.h"

namespace tfemb {
namespace {

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

REGISTER_KERNEL_BUILDER(Name("TfembDedupGather").Device(DEVICE_CPU),
                        DedupGatherOp);

}  // namespace tfemb
