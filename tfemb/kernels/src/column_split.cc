// Saving an interleaved table without a second copy of it.
//
// An interleaved table (tfemb/interleaved_tables/) is one variable of
// [rows, parts x width]: the parameters, then each slot. A checkpoint holds
// each part as a [rows, width] tensor under TensorFlow's own key, and
// TensorFlow's saver holds all of a checkpoint's tensors at once, so copying
// the columns out would need every table's bytes a second time.
//
//   TfembSplitColumns   moves the table's rows into `parts` contiguous
//                       blocks, [parts, rows, width], a buffer of its own,
//                       giving the table's pages back to the system as it
//                       goes; the saver's tensors are slices of the blocks,
//                       without a copy. Called again for the same table
//                       while the blocks live, it returns the same blocks.
//   (the blocks' end)   when the last tensor on the blocks is gone (the save
//                       is over), the rows go back into the table, giving
//                       the blocks' pages back as they go.
//   TfembRejoinColumns  puts the rows back now and keeps the blocks, for a
//                       read or write of the table by TensorFlow's own ops
//                       while a save's tensors are still alive. Every tfemb
//                       kernel does the same first (RejoinColumns).
//
// The peak is the tables plus what is in flight (a chunk and the 2 MiB
// pages at its edges), where a copy would be twice the tables. Where the
// table's buffer is shared (another tensor aliases it) or a split of it is
// ending, SplitColumns copies the blocks and gives nothing back.
//
// Between a split and its end, the table's own buffer holds zeros: a
// TensorFlow op that reads the variable's buffer directly (not through
// tfemb, which rejoins first) would see them. tfemb's views rejoin before
// their eager reads and writes; the variable itself is not a checkpoint's
// (the views are).

#include "column_split.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tf_kernel.h"

namespace tfemb {
namespace {

constexpr uintptr_t kPage = uintptr_t{2} << 20;   // released whole
constexpr int64_t kChunkBytes = int64_t{64} << 20;  // moved between releases

// Row r's part p: table[(r * parts + p) * width], blocks[(p * rows + r) *
// width].
struct Layout {
  int64_t rows, parts, width;
  int64_t bytes() const { return rows * parts * width * int64_t{4}; }
};

// Gives back the whole pages in [*from, to); *from: where the pages not yet
// given back begin.
void Release(uintptr_t* from, uintptr_t to) {
  const uintptr_t begin = (*from + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = to & ~(kPage - 1);
  if (end <= begin) return;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  *from = end;
}

int64_t ChunkRows(const Layout& l) {
  return std::max<int64_t>(1, kChunkBytes / (l.parts * l.width * 4));
}

// Moves every row between the table and the blocks (`out`: table -> blocks,
// else blocks -> table), a chunk of rows at a time; with `release`, the
// pages read from are given back behind it (the table's one stream, or the
// blocks' `parts` streams).
void Move(const Layout& l, float* table, float* blocks, bool out,
          bool release) {
  const int64_t row = l.parts * l.width, chunk = ChunkRows(l);
  std::vector<uintptr_t> released(out ? 1 : l.parts);
  for (size_t p = 0; p < released.size(); ++p) {
    released[p] = reinterpret_cast<uintptr_t>(
        out ? table : blocks + p * l.rows * l.width);
  }
  for (int64_t r0 = 0; r0 < l.rows; r0 += chunk) {
    const int64_t r1 = std::min(l.rows, r0 + chunk);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t p = 0; p < l.parts; ++p) {
        float* in_table = table + r * row + p * l.width;
        float* in_blocks = blocks + (p * l.rows + r) * l.width;
        if (out) {
          std::copy_n(in_table, l.width, in_blocks);
        } else {
          std::copy_n(in_blocks, l.width, in_table);
        }
      }
    }
    if (!release) continue;
    for (size_t p = 0; p < released.size(); ++p) {
      Release(&released[p], reinterpret_cast<uintptr_t>(
                                out ? table + r1 * row
                                    : blocks + (p * l.rows + r1) * l.width));
    }
  }
}

class Blocks;

// The tables split now, by the address of their buffer.
struct Split {
  const Var* var;
  Blocks* blocks;
  bool rejoined;  // the rows are back (the blocks may still be read)

  void Rejoin();  // with the registry's lock held
};

std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

std::unordered_map<const void*, Split>& Registry() {
  static auto* splits = new std::unordered_map<const void*, Split>;
  return *splits;
}

std::atomic<int> num_splits{0};

// The blocks' buffer: pages of their own (mmap, handed back at the end),
// and at the end the rows back into the table.
class Blocks : public ::tensorflow::TensorBuffer {
 public:
  // nullptr if the pages cannot be had.
  static Blocks* Make(Var* var, float* table, const Layout& l) {
    const size_t mapped = l.bytes() + kPage;
    void* mapping = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) return nullptr;
    const uintptr_t at =
        (reinterpret_cast<uintptr_t>(mapping) + kPage - 1) & ~(kPage - 1);
    madvise(reinterpret_cast<void*>(at), l.bytes(), MADV_HUGEPAGE);
    var->Ref();
    return new Blocks(reinterpret_cast<void*>(at), mapping, mapped, var,
                      table, l);
  }

  size_t size() const override { return layout_.bytes(); }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(
      ::tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(size());
    proto->set_allocated_bytes(size());
    proto->set_allocator_name("tfemb_column_split");
  }

  // A new reference, unless the last one is already gone.
  bool TryAcquire() const { return TryRef(); }

  void CopyBack(bool release) {
    Move(layout_, table_, base<float>(), /*out=*/false, release);
  }

  ~Blocks() override {
    {
      ::tensorflow::mutex_lock lock(*var_->mu());
      std::lock_guard<std::mutex> registry(RegistryMutex());
      auto it = Registry().find(table_);
      if (it != Registry().end() && it->second.blocks == this) {
        if (!it->second.rejoined &&
            var_->tensor()->tensor_data().data() ==
                reinterpret_cast<const char*>(table_)) {
          CopyBack(/*release=*/true);
        }
        Registry().erase(it);
        num_splits.fetch_sub(1);
      }
    }
    munmap(mapping_, mapped_);
  }

 private:
  Blocks(void* data, void* mapping, size_t mapped, Var* var, float* table,
         const Layout& l)
      : TensorBuffer(data), mapping_(mapping), mapped_(mapped), var_(var),
        table_(table), layout_(l) {}

  void* const mapping_;
  const size_t mapped_;
  const RefCountPtr<Var> var_;  // keeps the table's buffer alive
  float* const table_;
  const Layout layout_;
};

void Split::Rejoin() {
  blocks->CopyBack(/*release=*/false);
  rejoined = true;
}

class SplitColumnsOp : public OpKernel {
 public:
  explicit SplitColumnsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("parts", &parts_));
    OP_REQUIRES(ctx, parts_ >= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfembSplitColumns: parts must be at least 1; got ",
                    parts_)));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    Tensor blocks;  // released after the locks: its end takes them
    {
      ::tensorflow::mutex_lock lock(*var->mu());
      Tensor* table = var->tensor();
      OP_REQUIRES(ctx,
                  table->dtype() == ::tensorflow::DT_FLOAT &&
                      table->dims() == 2 && parts_ >= 1 &&
                      table->dim_size(1) % parts_ == 0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "TfembSplitColumns: a float32 matrix of ", parts_,
                      " parts of equal width; got ",
                      table->shape().DebugString())));
      const Layout l{table->dim_size(0), parts_, table->dim_size(1) / parts_};
      const TensorShape shape({l.parts, l.rows, l.width});
      float* data = table->flat<float>().data();
      std::lock_guard<std::mutex> registry(RegistryMutex());
      auto it = Registry().find(data);
      bool done = false;
      if (it != Registry().end() && it->second.var == var.get() &&
          !it->second.rejoined) {
        Blocks* b = it->second.blocks;
        if (b->TryAcquire()) {  // the same save: the same blocks
          blocks = Tensor(::tensorflow::DT_FLOAT, shape, b);
          b->Unref();
          done = true;
        } else {  // ending, waiting for these locks: the rows back now
          it->second.Rejoin();
        }
      }
      if (!done && it == Registry().end() && table->RefCountIsOne() &&
          l.bytes() > 0) {
        if (Blocks* b = Blocks::Make(var.get(), data, l)) {
          Move(l, data, b->base<float>(), /*out=*/true, /*release=*/true);
          Registry()[data] = Split{var.get(), b, false};
          num_splits.fetch_add(1);
          blocks = Tensor(::tensorflow::DT_FLOAT, shape, b);
          b->Unref();
          done = true;
        }
      }
      if (!done) {  // a copy; the table keeps its rows
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, shape,
                                               &blocks));
        Move(l, data, blocks.flat<float>().data(), /*out=*/true,
             /*release=*/false);
      }
    }
    ctx->set_output(0, blocks);
  }

 private:
  int64_t parts_;
};

class RejoinColumnsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    ::tensorflow::mutex_lock lock(*var->mu());
    RejoinColumns(var.get());
  }
};

}  // namespace

void RejoinColumns(Var* var) {
  if (num_splits.load() == 0) return;
  const void* data = var->tensor()->tensor_data().data();
  std::lock_guard<std::mutex> registry(RegistryMutex());
  auto it = Registry().find(data);
  if (it == Registry().end() || it->second.var != var ||
      it->second.rejoined) {
    return;
  }
  it->second.Rejoin();
}

REGISTER_OP("TfembSplitColumns")
    .Input("table: resource")
    .Output("blocks: float")
    .Attr("parts: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t parts;
      TF_RETURN_IF_ERROR(c->GetAttr("parts", &parts));
      if (parts < 1) return absl::InvalidArgumentError("parts below 1");
      c->set_output(0, c->MakeShape({c->MakeDim(parts), c->UnknownDim(),
                                     c->UnknownDim()}));
      return absl::OkStatus();
    });

REGISTER_OP("TfembRejoinColumns")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("TfembSplitColumns").Device(DEVICE_CPU),
                        SplitColumnsOp);
REGISTER_KERNEL_BUILDER(Name("TfembRejoinColumns").Device(DEVICE_CPU),
                        RejoinColumnsOp);

}  // namespace tfemb
