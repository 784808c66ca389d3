// The distinct ids of a step, by one hash pass: TfembDedupGather's
// (dedup_gather.cc), and benchmarks/floor.cc's exact step, which does the
// same work without TensorFlow. No TensorFlow header, so that the floor
// builds on its own.

#ifndef TFEMB_KERNELS_DEDUP_H_
#define TFEMB_KERNELS_DEDUP_H_

#include <cstdint>
#include <vector>

namespace tfemb {

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

}  // namespace tfemb

#endif  // TFEMB_KERNELS_DEDUP_H_
