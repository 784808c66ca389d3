// TfembIdCounts: one chip's batch -> the ids, and the distinct ids, that
// each (stacked table, SparseCore of the chip, partition) cell of a
// SparseCore gets (tfemb/sparsecore/id_limit_ops.py says what is counted,
// tfemb/sparsecore/id_counting.py in NumPy). One pass over the ids, then
// for the distinct ones an insert per id into a set of one
// SparseCore's ids or one cell's, in place of the dozen ops per feature and
// the tf.unique per table that compute the same counts. Given the limits,
// it also fails a batch over them with id_counting.plan's message, so that
// a step's check is this op alone.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tf_kernel.h"

namespace tfemb {
namespace {

absl::Status IdCountsShape(InferenceContext* c) {
  int64_t stacks, cores, partitions;
  TF_RETURN_IF_ERROR(c->GetAttr("stacks", &stacks));
  TF_RETURN_IF_ERROR(c->GetAttr("cores", &cores));
  TF_RETURN_IF_ERROR(c->GetAttr("partitions", &partitions));
  bool count_distinct;
  TF_RETURN_IF_ERROR(c->GetAttr("count_distinct", &count_distinct));
  ShapeHandle unused;
  for (int i = 0; i < c->num_inputs(); ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
  }
  c->set_output(0, c->Matrix(stacks, cores * partitions));
  c->set_output(1, c->Matrix(count_distinct ? stacks : 0,
                             cores * partitions));
  return absl::OkStatus();
}

// A set of non-negative int64 keys by open addressing over a power-of-two
// table of at least twice the keys it may get.
class KeySet {
 public:
  // Empties the set for up to `n` keys.
  void Reset(int64_t n) {
    int64_t capacity = 16;
    int log2 = 4;
    while (capacity < 2 * n) {
      capacity <<= 1;
      ++log2;
    }
    mask_ = capacity - 1;
    shift_ = 64 - log2;
    if (static_cast<int64_t>(keys_.size()) < capacity) keys_.resize(capacity);
    std::fill_n(keys_.begin(), capacity, -1);
  }

  // Whether `key` was new.
  bool Insert(int64_t key) {
    const uint64_t h =
        static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull;  // Fibonacci
    int64_t i = static_cast<int64_t>(h >> shift_);
    while (true) {
      const int64_t k = keys_[i];
      if (k == key) return false;
      if (k < 0) {
        keys_[i] = key;
        return true;
      }
      i = (i + 1) & mask_;
    }
  }

 private:
  int64_t mask_ = 0;
  int shift_ = 60;
  std::vector<int64_t> keys_;  // -1: empty
};

// A set of keys in [0, span) as a bitmap, with no branch on whether a key
// is new: repeats are about as likely as new keys, so a branch on it
// mispredicts at every other id, which costs more than the insert. Emptied
// by clearing the words it set.
class Bitmap {
 public:
  explicit Bitmap(int64_t span) : bits_((span + 63) / 64, 0) {}

  // Empties the set for up to `n` keys.
  void Reset(int64_t n) {
    for (int64_t k = 0; k < touched_; ++k) bits_[words_[k]] = 0;
    touched_ = 0;
    if (static_cast<int64_t>(words_.size()) < n) words_.resize(n);
  }

  // Whether `key` was new.
  bool Insert(int64_t key) {
    uint64_t& word = bits_[key >> 6];
    const uint64_t old = word, bit = uint64_t{1} << (key & 63);
    words_[touched_] = key >> 6;  // kept where the word was empty
    touched_ += old == 0;
    word = old | bit;
    return !(old & bit);
  }

 private:
  std::vector<uint64_t> bits_;
  std::vector<int64_t> words_;  // the first touched_: the words set
  int64_t touched_ = 0;
};

// `x / d` and `x mod d` for x >= 0, by a shift and a mask where d is a
// power of two (a 64-bit division takes tens of cycles: most of a count).
class Divisor {
 public:
  explicit Divisor(int64_t d) : d_(d) {
    for (int b = 0; b < 62; ++b) {
      if (d == (int64_t{1} << b)) shift_ = b;
    }
  }
  int64_t Quotient(int64_t x) const {
    return shift_ >= 0 ? x >> shift_ : x / d_;
  }
  int64_t Remainder(int64_t x) const {
    return shift_ >= 0 ? x & (d_ - 1) : x % d_;
  }

 private:
  int64_t d_;
  int shift_ = -1;
};

// OK if every value of `t` (int64) is in [0, bound); else an error that
// names the feature and the first value outside. One vectorized pass,
// then a search only when a value is outside.
absl::Status CheckRange(const std::string& feature, const char* what,
                        const Tensor& t, int64_t bound, const char* bound_is) {
  const int64_t* x = t.flat<int64_t>().data();
  const int64_t count = t.NumElements();
  // The sign bit of x | (bound - 1 - x) is set exactly where x < 0 or
  // x >= bound: or-ed over the values, a loop the compiler vectorizes.
  // (In unsigned arithmetic, where a wrap is defined.)
  const uint64_t last = static_cast<uint64_t>(bound) - 1;
  uint64_t outside = bound > 0 || count == 0 ? 0 : ~uint64_t{0};
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t v = static_cast<uint64_t>(x[i]);
    outside |= v | (last - v);
  }
  if (!(outside >> 63)) return absl::OkStatus();
  int64_t i = 0;
  while (static_cast<uint64_t>(x[i]) < static_cast<uint64_t>(bound)) ++i;
  return absl::InvalidArgumentError(absl::StrCat(
      feature, ": ", what, " must be in [0, ", bound, ") (", bound_is,
      "); got ", x[i], " at position ", i, "."));
}

// One feature's ids, and what their cells need.
struct Feature {
  int64_t stack;
  const int64_t* ids;
  const int64_t* samples;  // each id's; nullptr: id i is sample i
  int64_t count, cores, per_core, first_cell, partitions, rotation,
      vocabulary, first_id;
};

constexpr int kCopies = 4;  // histograms of the cells' ids; a power of two

// Each counted id's cell and its place among its stack's ids.
struct Counted {
  std::vector<int32_t> cell;
  std::vector<int64_t> place;
};

// Adds one feature's ids to the cells' counts: `h`, kCopies histograms of
// `cells`, the i-th counted id in copy i mod kCopies (ids of one cell in a
// row then add to different counters, not to one chain of increments);
// with kDistinct, appends each counted id to `counted`. Everything the
// loop reads is a value here, not a member the stores could alias.
template <bool kDistinct>
void CountIds(const Feature f, const Divisor partition_of,
              const int64_t cells, int64_t* h, Counted* counted,
              KeySet* pairs) {
  const int64_t* v = f.ids;
  auto add = [=](int64_t i, int64_t core, int64_t id) {
    const int64_t cell = f.first_cell + core * f.partitions +
                         partition_of.Remainder(id + f.rotation);
    ++h[(i & (kCopies - 1)) * cells + cell];
    if (kDistinct) {
      counted->cell.push_back(static_cast<int32_t>(cell));
      counted->place.push_back(id + f.first_id);
    }
  };
  if (f.samples == nullptr) {  // the cores' samples in blocks
    for (int64_t core = 0, i = 0; core < f.cores && i < f.count; ++core) {
      for (const int64_t end = std::min(f.count, i + f.per_core); i < end;
           ++i) {
        add(i, core, v[i]);
      }
    }
    return;
  }
  // A sample's repeated ids count once (sparse and ragged features).
  const Divisor core_of(f.per_core);
  pairs->Reset(f.count);
  for (int64_t i = 0; i < f.count; ++i) {
    if (pairs->Insert(f.samples[i] * f.vocabulary + v[i])) {
      add(i, core_of.Quotient(f.samples[i]), v[i]);
    }
  }
}

// Each cell's distinct places among `counted`, into `d`, given each cell's
// count `runs`: the places laid out cell by cell, then a set per cell,
// small enough for L1 (one set over the whole batch would miss the cache
// at every insert).
template <typename Set>
void CountDistinct(const Counted& counted, const int64_t* runs, int64_t cells,
                   Set* seen, int64_t* d) {
  std::vector<int64_t> start(cells + 1, 0);
  for (int64_t c = 0; c < cells; ++c) start[c + 1] = start[c] + runs[c];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  std::vector<int64_t> by_cell(counted.place.size());
  for (size_t k = 0; k < counted.place.size(); ++k) {
    by_cell[next[counted.cell[k]]++] = counted.place[k];
  }
  for (int64_t c = 0; c < cells; ++c) {
    seen->Reset(runs[c]);
    int64_t distinct = 0;
    for (int64_t k = start[c]; k < start[c + 1]; ++k) {
      distinct += seen->Insert(by_cell[k]);
    }
    d[c] = distinct;
  }
}

// The distinct ids of the cells of one (stacked table `stack`, SparseCore
// `core`), into `d`, for dense features (id i is sample i): the core's
// samples are a block of each feature's ids, counted with a set of the
// ids' places among their stack's (a place is in one partition) that stays
// in L1 or L2, where one set over the batch would miss at every insert.
template <typename Set>
void CountDistinctDense(const std::vector<Feature>& features, int64_t stack,
                        int64_t core, const Divisor partition_of, Set* seen,
                        int64_t* d) {
  int64_t size = 0;
  for (const Feature& f : features) {
    if (f.stack == stack) size += f.per_core;
  }
  if (size == 0) return;
  seen->Reset(size);
  for (const Feature& f : features) {
    if (f.stack != stack) continue;
    const int64_t end = std::min(f.count, (core + 1) * f.per_core);
    int64_t* cells = d + f.first_cell + core * f.partitions;
    for (int64_t i = core * f.per_core; i < end; ++i) {
      const int64_t id = f.ids[i];
      cells[partition_of.Remainder(id + f.rotation)] +=
          seen->Insert(id + f.first_id);
    }
  }
}

// A SparseCoreEmbeddingConfig's limits per stacked table, as
// id_counting.plan checks them (its messages, word for word).
struct Limits {
  std::vector<std::string> names;  // Python's repr of each stacked table's
  std::vector<int64_t> max_ids, max_unique, samples;
  int64_t per_sample = 0;  // max_ids_per_chip_per_sample
  bool allow_id_dropping = false;
  // Each stacked table's buffer on a chip: per_sample x its samples (of
  // the chip's SparseCores, cores x samples / cores).
  std::vector<int64_t> capacity;

  // The first failure in plan's order (stack by stack: its cells' ids and
  // distinct ids, its buffer's size, its buffer), given each cell's ids
  // `r` and distinct ids `d` (nullptr: not counted, as no limit on them
  // can be reached before one on the ids).
  absl::Status Check(const int64_t* r, const int64_t* d, int64_t cores,
                     int64_t partitions) const {
    constexpr int64_t kPad = 8;
    const int64_t row = cores * partitions;
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& name = names[k];
      for (int64_t cell = 0; cell < row; ++cell) {
        const int64_t i = k * row + cell;
        for (const bool distinct : {false, true}) {
          const int64_t count = distinct ? (d ? d[i] : 0) : r[i];
          const int64_t limit = distinct ? max_unique[k] : max_ids[k];
          if (count <= limit) continue;
          const int64_t core = cell / partitions, part = cell % partitions;
          const char* what = distinct ? "unique ids" : "ids";
          return absl::InvalidArgumentError(absl::StrCat(
              "Stacked table ", name, ": SparseCore ", core,
              " of the chip sends ", count, " ", what, " to partition ",
              part, " (SparseCore ", part, " of the TPU), over the limit of ",
              limit, " (max_", distinct ? "unique_ids" : "ids",
              "_per_table[", name, "] of the SparseCoreEmbeddingConfig; "
              "256 when not given)."));
        }
      }
      if (capacity[k] % kPad) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Stacked table ", name, ": max_ids_per_chip_per_sample x "
            "samples = ", capacity[k], " is not a multiple of ", kPad, "."));
      }
      if (allow_id_dropping) continue;
      // The chip's runs fill the buffer in cell order, each padded to 8;
      // `kept` is what a buffer that drops would keep.
      int64_t filled = 0, total = 0, kept = 0;
      bool full = false;
      for (int64_t cell = 0; cell < row; ++cell) {
        const int64_t run = r[k * row + cell];
        const int64_t taken = std::min(run, capacity[k] - filled);
        full |= run > taken;
        total += run;
        kept += taken;
        filled = std::min(capacity[k],
                          (filled + taken + kPad - 1) / kPad * kPad);
      }
      if (full) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Stacked table ", name, ": the chip's ", total,
            " ids do not fit in its buffer of ", capacity[k],
            " (max_ids_per_chip_per_sample ", per_sample, " x ", samples[k],
            " samples, each partition's ids padded to a multiple of ", kPad,
            "); allow_id_dropping would drop ", total - kept, " of them."));
      }
    }
    return absl::OkStatus();
  }
};

class IdCountsOp : public OpKernel {
 public:
  explicit IdCountsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stacks", &stacks_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("cores", &cores_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("partitions", &partitions_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("count_distinct", &count_distinct_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_names", &names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stack", &stack_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("vocabulary", &vocabulary_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rotation", &rotation_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sizes", &samples_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_id", &first_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("limit_names", &limits_.names));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_ids", &limits_.max_ids));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_unique", &limits_.max_unique));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stack_samples", &limits_.samples));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_ids_per_chip_per_sample",
                                     &limits_.per_sample));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("allow_id_dropping",
                                     &limits_.allow_id_dropping));
    const size_t n = names_.size();
    OP_REQUIRES(ctx, ctx->num_inputs() == static_cast<int>(2 * n),
                absl::InvalidArgumentError(absl::StrCat(
                    n, " feature names for ", ctx->num_inputs(),
                    " inputs; expected ids and samples for each")));
    OP_REQUIRES(ctx, stack_.size() == n && vocabulary_.size() == n &&
                         rotation_.size() == n && samples_.size() == n &&
                         first_id_.size() == n,
                absl::InvalidArgumentError(
                    "stack, vocabulary, rotation, sizes and first_id "
                    "need one entry per feature"));
    OP_REQUIRES(ctx, stacks_ >= 1 && cores_ >= 1 && partitions_ >= 1,
                absl::InvalidArgumentError(
                    "stacks, cores and partitions must be at least 1"));
    OP_REQUIRES(ctx, stacks_ * cores_ * partitions_ < (int64_t{1} << 31),
                absl::InvalidArgumentError(absl::StrCat(
                    stacks_ * cores_ * partitions_,
                    " cells; at most 2^31 - 1")));
    const size_t limited = limits_.names.size();
    OP_REQUIRES(ctx, limited == 0 || limited == static_cast<size_t>(stacks_),
                absl::InvalidArgumentError(absl::StrCat(
                    limited, " limit_names for ", stacks_,
                    " stacks; expected none (no check) or one per stack")));
    OP_REQUIRES(ctx, limits_.max_ids.size() == limited &&
                         limits_.max_unique.size() == limited &&
                         limits_.samples.size() == limited,
                absl::InvalidArgumentError(
                    "max_ids, max_unique and stack_samples need one entry "
                    "per limit_names entry"));
    for (size_t k = 0; k < limited; ++k) {
      limits_.capacity.push_back(limits_.per_sample *
                                 (limits_.samples[k] / cores_) * cores_);
      // Where a distinct-id limit is under the ids', the counts must tell.
      OP_REQUIRES(ctx, count_distinct_ ||
                           limits_.max_unique[k] >= limits_.max_ids[k],
                  absl::InvalidArgumentError(absl::StrCat(
                      "Stacked table ", limits_.names[k], ": max_unique ",
                      limits_.max_unique[k], " under max_ids ",
                      limits_.max_ids[k], " needs count_distinct")));
    }
    for (size_t f = 0; f < n; ++f) {
      OP_REQUIRES(
          ctx, stack_[f] >= 0 && stack_[f] < stacks_ && vocabulary_[f] >= 0 &&
                   rotation_[f] >= 0 && samples_[f] >= cores_ &&
                   samples_[f] % cores_ == 0 && first_id_[f] >= 0 &&
                   first_id_[f] <= (int64_t{1} << 62) - vocabulary_[f] &&
                   (vocabulary_[f] == 0 ||
                    samples_[f] < (int64_t{1} << 62) / vocabulary_[f]),
          absl::InvalidArgumentError(absl::StrCat(
              names_[f], ": stack ", stack_[f],
              " outside [0, ", stacks_, "), or vocabulary ", vocabulary_[f],
              ", rotation ", rotation_[f], ", samples ", samples_[f],
              " (a multiple of the ", cores_, " cores) or first id ",
              first_id_[f], " out of range")));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = static_cast<int>(names_.size());
    int64_t total = 0;
    for (int f = 0; f < n; ++f) {
      const Tensor& ids = ctx->input(f);
      const Tensor& samples = ctx->input(n + f);
      OP_REQUIRES(ctx, ids.dims() == 1 && samples.dims() == 1 &&
                           (samples.NumElements() == 0 ||
                            samples.NumElements() == ids.NumElements()),
                  absl::InvalidArgumentError(absl::StrCat(
                      names_[f], ": ids and samples must be "
                      "vectors, samples empty or one per id; got ",
                      ids.shape().DebugString(), " and ",
                      samples.shape().DebugString())));
      OP_REQUIRES(
          ctx, samples.NumElements() > 0 || ids.NumElements() <= samples_[f],
          absl::InvalidArgumentError(absl::StrCat(
              names_[f], ": ", ids.NumElements(),
              " ids without their samples; at most one per sample (",
              samples_[f], ")")));
      OP_REQUIRES_OK(ctx, CheckRange(names_[f], "ids", ids, vocabulary_[f],
                                     "the vocabulary_size of the table"));
      OP_REQUIRES_OK(ctx, CheckRange(names_[f], "samples", samples,
                                     samples_[f], "its output_shape's size"));
      total += ids.NumElements();
    }
    const int64_t row = cores_ * partitions_, cells = stacks_ * row;
    Tensor* runs = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({stacks_, row}), &runs));
    Tensor* distinct = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({count_distinct_ ? stacks_ : 0,
                                            row}),
                            &distinct));
    int64_t* const d = distinct->flat<int64_t>().data();
    std::fill(d, d + distinct->NumElements(), 0);
    const Divisor partition_of(partitions_);
    // Dense features (id i is sample i) have their distinct ids counted
    // SparseCore by SparseCore (CountDistinctDense); others' are gathered
    // by cell first (CountDistinct).
    bool dense = true;
    for (int f = 0; f < n; ++f) dense &= ctx->input(n + f).NumElements() == 0;
    const bool gather = count_distinct_ && !dense;
    std::vector<Feature> features(n);
    for (int f = 0; f < n; ++f) {
      const Tensor& ids = ctx->input(f);
      const Tensor& samples = ctx->input(n + f);
      Feature& feature = features[f];
      feature.stack = stack_[f];
      feature.ids = ids.flat<int64_t>().data();
      feature.samples =
          samples.NumElements() ? samples.flat<int64_t>().data() : nullptr;
      feature.count = ids.NumElements();
      feature.cores = cores_;
      feature.per_core = samples_[f] / cores_;
      feature.first_cell = stack_[f] * cores_ * partitions_;
      feature.partitions = partitions_;
      feature.rotation = rotation_[f];
      feature.vocabulary = vocabulary_[f];
      feature.first_id = first_id_[f];
    }
    std::vector<int64_t> copies(kCopies * cells, 0);
    Counted counted;
    if (gather) {
      counted.cell.reserve(total);
      counted.place.reserve(total);
      KeySet pairs;
      for (int f = 0; f < n; ++f) {
        CountIds<true>(features[f], partition_of, cells, copies.data(),
                       &counted, &pairs);
      }
    } else {
      KeySet pairs;
      for (int f = 0; f < n; ++f) {
        CountIds<false>(features[f], partition_of, cells, copies.data(),
                        &counted, &pairs);
      }
    }
    int64_t* r = runs->flat<int64_t>().data();
    std::fill(r, r + cells, 0);
    for (size_t k = 0; k < copies.size(); ++k) r[k % cells] += copies[k];
    // The distinct places, in one set reused cell by cell (or SparseCore by
    // SparseCore): a Bitmap where its words are no more than 4 a key (its
    // zeroing costs no more than the keys), else a KeySet.
    int64_t span = 0;  // the places' bound
    for (const Feature& f : features) {
      span = std::max(span, f.first_id + f.vocabulary);
    }
    auto count_distinct = [&](auto* seen) {
      if (dense) {
        for (int64_t stack = 0; stack < stacks_; ++stack) {
          for (int64_t core = 0; core < cores_; ++core) {
            CountDistinctDense(features, stack, core, partition_of, seen, d);
          }
        }
      } else {
        CountDistinct(counted, r, cells, seen, d);
      }
    };
    if (count_distinct_ && span <= 256 * total) {
      Bitmap seen(span);
      count_distinct(&seen);
    } else if (count_distinct_) {
      KeySet seen;
      count_distinct(&seen);
    }
    if (!limits_.names.empty()) {
      OP_REQUIRES_OK(ctx, limits_.Check(r, count_distinct_ ? d : nullptr,
                                        cores_, partitions_));
    }
  }

 private:
  int64_t stacks_, cores_, partitions_;
  bool count_distinct_;
  std::vector<std::string> names_;
  std::vector<int64_t> stack_, vocabulary_, rotation_, samples_, first_id_;
  Limits limits_;
};

}  // namespace

REGISTER_OP("TfembIdCounts")
    .Input("ids: num_features * int64")
    .Input("samples: num_features * int64")  // each id's; empty: id k's is k
    .Output("runs: int64")      // [stacks, cores x partitions]
    .Output("distinct: int64")  // the same; [0, ...] unless count_distinct
    .Attr("num_features: int >= 1")
    .Attr("stacks: int")
    .Attr("cores: int")       // SparseCores of a chip
    .Attr("partitions: int")  // SparseCores of the TPU
    .Attr("count_distinct: bool")
    .Attr("feature_names: list(string)")  // as errors name them
    // Per feature: its stacked table, its table's vocabulary size and
    // rotation, its samples (the size of its output_shape) and its table's
    // first id among its stack's.
    .Attr("stack: list(int)")
    .Attr("vocabulary: list(int)")
    .Attr("rotation: list(int)")
    .Attr("sizes: list(int)")
    .Attr("first_id: list(int)")
    // Per stacked table, its limits (none: the counts are not checked): its
    // name as Python's repr gives it, max_ids_per_table, its
    // max_unique_ids_per_table, its samples.
    .Attr("limit_names: list(string) = []")
    .Attr("max_ids: list(int) = []")
    .Attr("max_unique: list(int) = []")
    .Attr("stack_samples: list(int) = []")
    .Attr("max_ids_per_chip_per_sample: int = 0")
    .Attr("allow_id_dropping: bool = false")
    // A check, as tf.debugging.Assert is: Grappler must neither fold it
    // nor drop it where only control edges read it.
    .SetIsStateful()
    .SetShapeFn(IdCountsShape);

REGISTER_KERNEL_BUILDER(Name("TfembIdCounts").Device(DEVICE_CPU), IdCountsOp);

}  // namespace tfemb
