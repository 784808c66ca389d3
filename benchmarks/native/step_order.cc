// The lookups and updates of a training step outside TensorFlow, in the
// order a training step must use: the floor under tfemb's embedding step
// (no deduplication, no gradient sums, no TensorFlow).
//
//   g++ -O3 -march=native -fno-math-errno -I benchmarks/native -pthread
//     benchmarks/native/step_order.cc -o /tmp/step_order   (one line)
//   /tmp/step_order 5000000 lookups-first 2 adam
//   /tmp/step_order 1000000 per-table 1 sgd
//   /tmp/step_order 100000,5000000 lookups-first 2 adagrad
//
// Arguments: rows per table (several sizes, comma separated, are timed side
// by side in one process: rounds of each size in turn, the order reversed
// every round, as benchmarks/flatness.py does); the order (`per-table`:
// each table updated right after its own lookup, which no training step can
// do; `lookups-first`: every table looked up before any is updated, as in
// training); threads (1, or 2: tables 0-3 on one, 4-7 on the other); the
// rule (`sgd`: a [rows, 32] table; `adagrad` and `adam`: parameters and
// slots side by side in [rows, 64] and [rows, 96], tfemb's default layout).
//
// 8 tables; each step's rows are the distinct ids of a batch of the suite
// (4096 Zipf ids per table, suite.h), cycling through 8 batches as the
// suite does. The lookup copies each distinct row's parameters into the
// activations, the update applies the rule to the row, each 12 rows ahead
// prefetched. Prints, per size, the median ms per step of 30 rounds of 10
// steps (after 3 rounds of warm-up).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "suite.h"

namespace {

constexpr int kDim = 32, kTables = 8, kBatches = 8, kAhead = 12;

// One size: 8 tables and the distinct rows of the suite's batches.
struct Setup {
  Setup(long vocab, int width) : vocab(vocab), width(width) {
    for (auto& t : tables) t = HugeTable(size_t(vocab) * width);
    std::mt19937_64 rng(1);
    rows.resize(kBatches * kTables);
    for (size_t b = 0; b < rows.size(); ++b) {
      rows[b] = Distinct(SuiteIds(rng, vocab, b % kTables, 4096));
    }
  }
  const std::vector<int64_t>& batch(int step, int t) const {
    return rows[(step % kBatches) * kTables + t];
  }
  size_t distinct() const {  // per step, averaged over the batches
    size_t n = 0;
    for (const auto& b : rows) n += b.size();
    return n / kBatches;
  }
  long vocab;
  int width;
  float* tables[kTables];
  std::vector<std::vector<int64_t>> rows;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s ROWS[,ROWS...] per-table|lookups-first 1|2 "
            "sgd|adagrad|adam\n", argv[0]);
    return 2;
  }
  const std::vector<long> sizes = ParseSizes(argv[1]);
  const std::string order = argv[2], rule = argv[4];
  const int threads = atoi(argv[3]);
  if ((order != "per-table" && order != "lookups-first") ||
      (threads != 1 && threads != 2) ||
      RowWidth(rule, kDim) == 0 || sizes.empty()) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const int width = RowWidth(rule, kDim);
  std::vector<std::unique_ptr<Setup>> setups;
  for (long vocab : sizes) setups.push_back(std::make_unique<Setup>(vocab, width));
  std::vector<float> g(4096 * kDim, 1e-3f);
  std::vector<std::vector<float>> out(kTables,
                                      std::vector<float>(4096 * kDim));
  auto lookup = [&](const Setup& s, int step, int t) {
    const auto& b = s.batch(step, t);
    const int n = int(b.size());
    for (int r = 0; r < n; ++r) {
      if (r + kAhead < n) PrefetchLines(s.tables[t] + b[r + kAhead] * width, 2);
      memcpy(out[t].data() + r * kDim, s.tables[t] + b[r] * width,
             kDim * sizeof(float));
    }
  };
  auto update = [&](const Setup& s, int step, int t) {
    const auto& b = s.batch(step, t);
    const int n = int(b.size());
    for (int r = 0; r < n; ++r) {
      if (r + kAhead < n) {
        PrefetchLines(s.tables[t] + b[r + kAhead] * width, width / 16);
      }
      UpdateRow(g.data() + r * kDim, s.tables[t] + b[r] * width, width, kDim);
    }
  };
  auto tables_of_step = [&](const Setup& s, int step, int begin, int end) {
    if (order == "per-table") {
      for (int t = begin; t < end; ++t) {
        lookup(s, step, t);
        update(s, step, t);
      }
      return;
    }
    for (int t = begin; t < end; ++t) lookup(s, step, t);
    for (int t = begin; t < end; ++t) update(s, step, t);
  };
  const std::vector<double> ms =
      SideBySide(setups.size(), [&](size_t i, int step) {
        const Setup& s = *setups[i];
        if (threads == 1) {
          tables_of_step(s, step, 0, kTables);
        } else {
          std::thread other([&] { tables_of_step(s, step, 0, kTables / 2); });
          tables_of_step(s, step, kTables / 2, kTables);
          other.join();
        }
      });
  for (size_t i = 0; i < setups.size(); ++i) {
    const double median = ms[i];
    const size_t distinct = setups[i]->distinct();
    printf("%s, %ld rows x %d tables, %s, %d thread%s: %.3f ms per step "
           "(%zu distinct rows, %.0f ns each)\n", rule.c_str(), sizes[i],
           kTables, order.c_str(), threads, threads == 1 ? "" : "s", median,
           distinct, median * 1e6 / distinct);
  }
  return 0;
}
