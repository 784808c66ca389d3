// Tables and slots backed by 2 MiB pages, and TfembAdviseHugePages.
//
// Rows are read and written at random all over a table, so with 4 KiB pages
// nearly every row costs a TLB miss. Tables and slots of 4 MiB and more are
// backed by 2 MiB pages, best effort (a refusal changes nothing but speed):
//
// * A table created empty, before it is filled (TfembAdviseHugePages,
//   through tfemb/kernels/fused_ops.py's advise_huge_pages): MADV_HUGEPAGE, so
//   the fill's page faults take 2 MiB pages, 512 times fewer faults and
//   nothing to copy later.
// * The first time a kernel sees a table or slot buffer (BackWithHugePages):
//   also MADV_COLLAPSE (Linux >= 6.1, 2 MiB copied at a time) for pages
//   already touched on 4 KiB pages (a table filled whole by its initializer,
//   a restored one); instant where the pages are huge already. Once per
//   variable and buffer: a restore gives a variable a new buffer, which is
//   advised again.

#include "huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "tf_kernel.h"

namespace tfemb {
namespace {

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1
#endif

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

REGISTER_OP("TfembAdviseHugePages")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("TfembAdviseHugePages").Device(DEVICE_CPU),
                        AdviseHugePagesOp);

}  // namespace tfemb
