// ApplyRowsOp, TfembApplyRows' kernel (apply_rows.cc), which TfembCheckRows'
// (check_rows.cc) extends: both check the same inputs and lock the same
// variables, then update the touched rows (ApplyRowsOp) or try the update
// in a scratch copy (CheckRowsOp), in `Finish`.

#ifndef TFEMB_KERNELS_APPLY_ROWS_H_
#define TFEMB_KERNELS_APPLY_ROWS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

#include "update_rules.h"

namespace tfemb {

class ApplyRowsOp : public ::tensorflow::OpKernel {
 public:
  explicit ApplyRowsOp(::tensorflow::OpKernelConstruction* ctx);

  void Compute(::tensorflow::OpKernelContext* ctx) override;

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
  virtual void Finish(::tensorflow::OpKernelContext* ctx, const Update& p,
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
  static void ForParts(::tensorflow::OpKernelContext* ctx,
                       const std::vector<Part>& parts, F&& fn) {
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

// TfembApplyRows' and TfembCheckRows' inputs: per part, vector ids and
// matrix gradients of as many rows; a scalar learning rate.
absl::Status UpdateShape(
    ::tensorflow::shape_inference::InferenceContext* c);

}  // namespace tfemb

#endif  // TFEMB_KERNELS_APPLY_ROWS_H_
