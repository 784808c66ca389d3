// tfemb's embedding step outside TensorFlow: the same algorithm as the
// fused kernels (tfemb/kernels/embedding_kernels.cc), in plain C++, so that
// what TensorFlow adds to it can be told apart from the algorithm's cost.
//
//   g++ -O3 -march=native -fno-math-errno -I benchmarks/native -pthread
//     benchmarks/native/step_algorithm.cc -o /tmp/step_algorithm   (one line)
//   /tmp/step_algorithm 100000,5000000 adam
//
// Per table and step, as TfembDedupGather: the batch's 4096 ids
// deduplicated by open addressing (positions of every id), each distinct
// row's parameters copied once into a compact buffer (12 rows ahead
// prefetched), then every id's activation copied from it; as
// TfembRowGradients and TfembApplyRows: every id's gradient summed per
// distinct row, then the rule applied to each distinct row (parameters and
// slots side by side). Like the suite's batches, each batch and table has
// its own gradients. 8 tables on 2 threads (4 each), every table looked
// up before any is updated, as in training; several sizes (comma
// separated) timed side by side in one process, as step_order.cc does.
// Prints the median ms per step of each size.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "suite.h"

namespace {

constexpr int kDim = 32, kTables = 8, kBatches = 8, kAhead = 12;
constexpr int kBatch = 4096;

// Distinct ids in order of first occurrence, as tfemb's Dedup.
class Dedup {
 public:
  Dedup() {
    int capacity = 16;
    while (capacity < 2 * kBatch) capacity <<= 1;
    mask_ = capacity - 1;
    at_.resize(capacity);
    unique_.reserve(kBatch);
  }
  void Clear() {
    std::fill(at_.begin(), at_.end(), -1);
    unique_.clear();
  }
  int Insert(int64_t id) {
    const uint64_t h = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull;
    int i = static_cast<int>(h >> 20) & mask_;
    while (true) {
      const int p = at_[i];
      if (p < 0) {
        at_[i] = static_cast<int>(unique_.size());
        unique_.push_back(id);
        return at_[i];
      }
      if (unique_[p] == id) return p;
      i = (i + 1) & mask_;
    }
  }
  const std::vector<int64_t>& unique() const { return unique_; }

 private:
  int mask_;
  std::vector<int> at_;
  std::vector<int64_t> unique_;
};

// One size: 8 tables and the suite's batches of ids.
struct Setup {
  Setup(long vocab, int width) : width(width) {
    for (auto& t : tables) t = HugeTable(size_t(vocab) * width);
    std::mt19937_64 rng(1);
    ids.resize(kBatches * kTables);
    for (size_t b = 0; b < ids.size(); ++b) {
      ids[b] = SuiteIds(rng, vocab, b % kTables, kBatch);
    }
  }
  int width;
  float* tables[kTables];
  std::vector<std::vector<int64_t>> ids;
};

// What a table's step keeps from its lookup to its update.
struct TableStep {
  Dedup dedup;
  std::vector<int> positions = std::vector<int>(kBatch);
  std::vector<float> compact = std::vector<float>(kBatch * kDim);
  std::vector<float> activations = std::vector<float>(kBatch * kDim);
  std::vector<float> sums = std::vector<float>(kBatch * kDim);
};

void Lookup(const Setup& s, const std::vector<int64_t>& ids, int t,
            TableStep& step) {
  step.dedup.Clear();
  for (int i = 0; i < kBatch; ++i) step.positions[i] = step.dedup.Insert(ids[i]);
  const auto& unique = step.dedup.unique();
  const int n = static_cast<int>(unique.size());
  const float* table = s.tables[t];
  float* compact = step.compact.data();
  for (int r = 0; r < n; ++r) {
    if (r + kAhead < n) PrefetchLines(table + unique[r + kAhead] * s.width, 2);
    memcpy(compact + r * kDim, table + unique[r] * s.width,
           kDim * sizeof(float));
  }
  for (int i = 0; i < kBatch; ++i) {
    memcpy(step.activations.data() + i * kDim,
           compact + step.positions[i] * kDim, kDim * sizeof(float));
  }
}

void Update(const Setup& s, const std::vector<float>& grads, int t,
            TableStep& step) {
  const auto& unique = step.dedup.unique();
  const int n = static_cast<int>(unique.size());
  float* sums = step.sums.data();
  std::fill(sums, sums + n * kDim, 0.0f);
  for (int i = 0; i < kBatch; ++i) {
    float* row = sums + step.positions[i] * kDim;
    const float* g = grads.data() + i * kDim;
    for (int d = 0; d < kDim; ++d) row[d] += g[d];
  }
  float* table = s.tables[t];
  for (int r = 0; r < n; ++r) {
    if (r + kAhead < n) {
      PrefetchLines(table + unique[r + kAhead] * s.width, s.width / 16);
    }
    UpdateRow(sums + r * kDim, table + unique[r] * s.width, s.width, kDim);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ROWS[,ROWS...] sgd|adagrad|adam\n", argv[0]);
    return 2;
  }
  const std::vector<long> sizes = ParseSizes(argv[1]);
  const std::string rule = argv[2];
  if (RowWidth(rule, kDim) == 0 || sizes.empty()) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const int width = RowWidth(rule, kDim);
  std::vector<std::unique_ptr<Setup>> setups;
  for (long vocab : sizes) setups.push_back(std::make_unique<Setup>(vocab, width));
  // One gradient per id, batch and table (32 MiB), cycled with the batches
  // as the suite's embedding-only step cycles its stand-in gradients: the
  // sums read them from memory, not from a cache that holds one batch.
  std::vector<std::vector<float>> grads(kBatches * kTables);
  for (size_t b = 0; b < grads.size(); ++b) {
    grads[b].assign(kBatch * kDim, 1e-3f * (1 + b % 7));
  }
  std::vector<TableStep> steps(kTables);
  auto tables = [&](const Setup& s, int step, int begin, int end) {
    const int batch = (step % kBatches) * kTables;
    for (int t = begin; t < end; ++t) {
      Lookup(s, s.ids[batch + t], t, steps[t]);
    }
    for (int t = begin; t < end; ++t) Update(s, grads[batch + t], t, steps[t]);
  };
  const std::vector<double> ms =
      SideBySide(setups.size(), [&](size_t i, int step) {
        const Setup& s = *setups[i];
        std::thread other([&] { tables(s, step, 0, kTables / 2); });
        tables(s, step, kTables / 2, kTables);
        other.join();
      });
  for (size_t i = 0; i < setups.size(); ++i) {
    printf("%s, %ld rows x %d tables, tfemb's algorithm: %.3f ms per step\n",
           rule.c_str(), sizes[i], kTables, ms[i]);
  }
  return 0;
}
