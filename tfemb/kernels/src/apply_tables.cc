// TfembApplyTables: a step's whole update, every table with variables of
// its own, in one op that is all or nothing by itself; on one replica it
// sums each table's per-id gradients first (row_sums.h).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "tf_kernel.h"

#include "row_sums.h"
#include "update_kernel.h"

namespace tfemb {
namespace {

// TfembApplyTables: TfembApplyRows on several tables, each with variables
// of its own (and its own learning rate and width), in one op: every
// variable locked at once, the tables updated side by side, and all of
// them put back if any table's new values are not finite. The step's whole
// update is then one op, all or nothing by itself: no lock around it and
// no TfembRestoreRows after it. With `gradients_finite` false nothing is
// computed or written (a gradient of the step is not finite).
//
// With positions (`num_positions` = `num_tables`), each table's gradients
// are one row per id looked up, and the op sums them into its distinct
// ids' rows itself (as TfembRowGradients), each table right before its
// update: no op and no hand-off between the sums and the update. They may
// come in pieces (`gradient_pieces`, per table: a host TPU's replicas'
// gradients), read where they are: the sums are those of the pieces'
// rows one after the other, with no op to join them first. A table
// whose summed gradient is not finite is not updated, its `finite` is
// false and every table is put back; with `raise_non_finite`, the op fails
// naming it, after putting them back.
class ApplyTablesOp : public UpdateKernel {
 public:
  explicit ApplyTablesOp(OpKernelConstruction* ctx)
      : UpdateKernel(ctx, "num_tables", 3 + PerId(ctx), true,
                     ExtraPieces(ctx)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("raise_non_finite", &raise_));
    int positions;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_positions", &positions));
    OP_REQUIRES(ctx, positions == 0 || positions == num_parts_,
                absl::InvalidArgumentError(
                    "num_positions: 0 or one per table"));
    per_id_ = positions > 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("gradient_pieces", &pieces_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_gradients", &num_gradients_));
    if (pieces_.empty()) pieces_.assign(num_parts_, 1);
    int64_t total = 0;
    for (int p : pieces_) total += p;
    OP_REQUIRES(ctx,
                static_cast<int>(pieces_.size()) == num_parts_ &&
                    total == num_gradients_ &&
                    (per_id_ || total == num_parts_),
                absl::InvalidArgumentError(
                    "gradient_pieces: one count per table, adding up to "
                    "num_gradients; more than one piece only with "
                    "positions"));
  }

  void Compute(OpKernelContext* ctx) override {
    // variables per table, then ids, gradients, positions (with per_id_)
    // and learning rates per table, then gradients_finite
    const int n = num_parts_;
    const int per_table = rule_.VariablesPerTable();
    const int num_vars = n * per_table;
    const int first_grads = num_vars + n;
    const int first_positions = first_grads + num_gradients_;
    const int first_lr = first_positions + (per_id_ ? n : 0);
    const Tensor& go = ctx->input(ctx->num_inputs() - 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(go.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "Table `", absl::StrJoin(table_names_, "`, `"),
                    "`: gradients_finite must be a scalar; got shape ",
                    go.shape().DebugString())));
    std::vector<Update> p(n);
    for (int k = 0; k < n; ++k) {
      OP_REQUIRES_OK(ctx, rule_.At(ctx->input(first_lr + k), table_names_[k],
                                   &p[k]));
    }
    std::vector<Part> parts(n);
    std::vector<int64_t> dims;
    std::vector<std::vector<const float*>> piece_rows(n);
    std::vector<std::vector<int64_t>> piece_sizes(n);
    if (per_id_) {
      OP_REQUIRES_OK(ctx, ReadParts(ctx, num_vars, table_names_, &parts));
      OP_REQUIRES_OK(ctx, ReadPieces(ctx, first_grads, first_positions,
                                     &dims, &piece_rows, &piece_sizes));
    } else {
      OP_REQUIRES_OK(ctx, ReadParts(ctx, num_vars, table_names_, &parts,
                                    &dims, false));
    }
    std::vector<bool*> ok;
    OP_REQUIRES_OK(ctx, FiniteOutputs(ctx, n, &ok));
    if (!go.scalar<bool>()()) return;
    const int slots = rule_.slots;
    std::vector<int64_t> strides(n);
    std::vector<Tensor> undo(n), sums(n);
    for (int k = 0; k < n; ++k) {
      strides[k] = rule_.interleaved ? (1 + slots) * dims[k] : dims[k];
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                              ::tensorflow::DT_FLOAT,
                              TensorShape({parts[k].u, (1 + slots) * dims[k]}),
                              &undo[k]));
      if (per_id_) {
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                                ::tensorflow::DT_FLOAT,
                                TensorShape({parts[k].u, dims[k]}), &sums[k]));
      }
    }
    LockedTables locked;
    OP_REQUIRES_OK(ctx, locked.Open(ctx, 0, per_table, strides, slots,
                                    rule_.interleaved, table_names_));
    std::vector<Target> targets;
    for (int k = 0; k < n; ++k) {
      OP_REQUIRES_OK(ctx, CheckIdRange({parts[k]}, locked.table(k).rows,
                                       {table_names_[k]}));
      targets.push_back(Target{p[k], dims[k], strides[k],
                               (1 + slots) * dims[k], locked.table(k),
                               undo[k].flat<float>().data()});
    }
    if (!per_id_) {
      ApplyAllOrNothing(ctx, rule_, parts, targets, ok);
      return;
    }
    // Each table's gradient summed in its own turn, before its update; a
    // bad position or a gradient that is not finite stops that table.
    std::vector<absl::Status> refused(n);
    std::vector<char> finite_gradient(n, 1);
    ApplyAllOrNothing(ctx, rule_, parts, targets, ok, [&](int k) {
      const Tensor& positions = ctx->input(first_positions + k);
      const int64_t* pos = positions.flat<int64_t>().data();
      const int64_t looked_up = positions.dim_size(0);
      refused[k] = CheckPositions(pos, looked_up, parts[k].u,
                                  table_names_[k]);
      if (!refused[k].ok()) return false;
      float* summed = sums[k].flat<float>().data();
      SumRowPieces(piece_rows[k].data(), piece_sizes[k].data(),
                   static_cast<int>(piece_rows[k].size()), pos, parts[k].u,
                   dims[k], summed);
      parts[k].rows = summed;
      finite_gradient[k] = AllFinite(summed, parts[k].u * dims[k]);
      return finite_gradient[k] != 0;
    });
    for (int k = 0; k < n; ++k) OP_REQUIRES_OK(ctx, refused[k]);
    for (int k = 0; k < n && raise_; ++k) {
      OP_REQUIRES(ctx, finite_gradient[k], NonFiniteGradient(table_names_[k]));
    }
  }

 private:
  // 1 if the op sums per-id gradients (its positions), else 0.
  static int PerId(OpKernelConstruction* ctx) {
    int positions = 0;
    return ctx->GetAttr("num_positions", &positions).ok() && positions > 0
               ? 1 : 0;
  }

  // The gradients' inputs beyond one per table (pieces).
  static int ExtraPieces(OpKernelConstruction* ctx) {
    int gradients = 0, tables = 0;
    if (!ctx->GetAttr("num_gradients", &gradients).ok() ||
        !ctx->GetAttr("num_tables", &tables).ok()) {
      return 0;
    }
    return gradients - tables;
  }

  // Each table's gradient pieces (per-id rows): their rows and sizes, and
  // the table's width; all of a table's pieces `dim` wide, as many rows in
  // all as its positions.
  absl::Status ReadPieces(OpKernelContext* ctx, int first_grads,
                          int first_positions, std::vector<int64_t>* dims,
                          std::vector<std::vector<const float*>>* rows,
                          std::vector<std::vector<int64_t>>* sizes) const {
    int input = first_grads;
    for (int k = 0; k < num_parts_; ++k) {
      const Tensor& positions = ctx->input(first_positions + k);
      if (positions.dims() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Table `", table_names_[k], "`: positions must be a vector; got ",
            positions.shape().DebugString()));
      }
      int64_t total = 0, dim = -1;
      for (int p = 0; p < pieces_[k]; ++p, ++input) {
        const Tensor& grads = ctx->input(input);
        if (grads.dims() != 2 || (dim >= 0 && grads.dim_size(1) != dim)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "Table `", table_names_[k], "`: gradient piece ", p,
              " of shape ", grads.shape().DebugString(), " is not a matrix ",
              dim >= 0 ? absl::StrCat(dim, " wide") : std::string()));
        }
        dim = grads.dim_size(1);
        total += grads.dim_size(0);
        (*rows)[k].push_back(grads.flat<float>().data());
        (*sizes)[k].push_back(grads.dim_size(0));
      }
      if (total != positions.dim_size(0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Table `", table_names_[k], "`: ", positions.dim_size(0),
            " ids looked up but gradients of ", total, " rows"));
      }
      dims->push_back(dim);
    }
    return absl::OkStatus();
  }

  std::vector<int> pieces_;
  int num_gradients_ = 0;
  bool per_id_ = false;
  bool raise_ = false;
};

}  // namespace

REGISTER_OP("TfembApplyTables")
    .Input("variables: num_variables * resource")  // per table, in order
    .Input("ids: num_tables * int64")
    .Input("gradients: num_gradients * float")  // per table, in pieces
    .Input("positions: num_positions * int64")  // none, or one per table
    .Input("learning_rates: num_tables * float")
    .Input("gradients_finite: bool")
    .Output("finite: num_tables * bool")  // each table's new values
    .Attr("num_variables: int >= 1")
    .Attr("num_tables: int >= 1")
    .Attr("num_positions: int >= 0 = 0")
    .Attr("num_gradients: int >= 1")
    .Attr("gradient_pieces: list(int) = []")  // per table; [] one each
    .Attr("table_names: list(string)")  // one per table
    .Attr("rule: string")
    .Attr("hyperparameters: list(float)")
    .Attr("clip_gradient: list(float)")
    .Attr("clip_weight: list(float)")
    .Attr("weight_decay_factor: float")
    .Attr("multiply_weight_decay_by_lr: bool")
    .Attr("interleaved: bool = false")
    .Attr("raise_non_finite: bool = false")  // with positions
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int tables, positions;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &tables));
      TF_RETURN_IF_ERROR(c->GetAttr("num_positions", &positions));
      if (positions != 0 && positions != tables) {
        return absl::InvalidArgumentError(absl::StrCat(
            "num_positions: 0 or one per table (", tables, "); got ",
            positions));
      }
      int gradients;
      std::vector<int> pieces;
      TF_RETURN_IF_ERROR(c->GetAttr("num_gradients", &gradients));
      TF_RETURN_IF_ERROR(c->GetAttr("gradient_pieces", &pieces));
      if (pieces.empty()) pieces.assign(tables, 1);
      const int first = c->num_inputs() - 1 - 2 * tables - gradients -
                        positions;
      const int first_grads = first + tables;
      const int first_positions = first_grads + gradients;
      int grads_in = first_grads;
      for (int k = 0; k < tables; ++k) {
        ShapeHandle ids, grads, lr;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(first + k), 1, &ids));
        for (int p = 0; p < pieces[k]; ++p) {
          TF_RETURN_IF_ERROR(c->WithRank(c->input(grads_in++), 2, &grads));
        }
        if (pieces[k] == 1) {  // its rows: the distinct ids, or the ids
          ShapeHandle rows_of = ids;  // looked up
          if (positions > 0) {
            TF_RETURN_IF_ERROR(
                c->WithRank(c->input(first_positions + k), 1, &rows_of));
          }
          DimensionHandle rows;
          TF_RETURN_IF_ERROR(
              c->Merge(c->Dim(rows_of, 0), c->Dim(grads, 0), &rows));
        }
        TF_RETURN_IF_ERROR(c->WithRank(
            c->input(first_positions + positions + k), 0, &lr));
      }
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(c->num_inputs() - 1), 0,
                                     &unused));
      for (int k = 0; k < tables; ++k) c->set_output(k, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TfembApplyTables").Device(DEVICE_CPU),
                        ApplyTablesOp);

}  // namespace tfemb
