// The lookups and updates of a training step outside TensorFlow, in the
// order a training step must use: the floor under tfemb's embedding step
// (no deduplication, no gradient sums, no TensorFlow).
//
//   g++ -O3 -march=native -I benchmarks/native -pthread
//     benchmarks/native/step_order.cc -o /tmp/step_order   (one line)
//   /tmp/step_order 5000000 lookups-first 2 adam
//   /tmp/step_order 1000000 per-table 1 sgd
//
// Arguments: rows per table; the order (`per-table`: each table updated
// right after its own lookup, which no training step can do;
// `lookups-first`: every table looked up before any is updated, as in
// training); threads (1, or 2: tables 0-3 on one, 4-7 on the other); the
// rule (`sgd`: a [rows, 32] table; `adam`: parameters and both slots side
// by side in [rows, 96], tfemb's default layout).
//
// 8 tables; each step's rows are the distinct ids of a batch of the suite
// (4096 Zipf ids per table, suite.h), cycling through 8 batches as the
// suite does. The lookup copies each distinct row's parameters into the
// activations, the update applies the rule to the row, each 12 rows ahead
// prefetched. Prints the median ms per step of 30 rounds of 10 steps.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "suite.h"

namespace {

constexpr int kDim = 32, kTables = 8, kBatches = 8, kAhead = 12;

void Prefetch(const float* p, int lines) {
  for (int i = 0; i < lines; ++i) __builtin_prefetch(p + 16 * i);
}

void Sgd(const float* __restrict g, float* __restrict w) {
  for (int d = 0; d < kDim; ++d) w[d] -= 0.01f * g[d];
}

void Adam(const float* g, float* w, float* m, float* v) {
  AdamRow(g, w, m, v, kDim);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s ROWS per-table|lookups-first 1|2 sgd|adam\n",
            argv[0]);
    return 2;
  }
  const long vocab = atol(argv[1]);
  const std::string order = argv[2], rule = argv[4];
  const int threads = atoi(argv[3]);
  if ((order != "per-table" && order != "lookups-first") ||
      (threads != 1 && threads != 2) || (rule != "sgd" && rule != "adam")) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const bool adam = rule == "adam";
  const int width = adam ? 3 * kDim : kDim;
  std::vector<float*> tables(kTables);
  for (auto& t : tables) t = HugeTable(size_t(vocab) * width);
  std::mt19937_64 rng(1);
  std::vector<std::vector<int64_t>> rows(kBatches * kTables);
  for (size_t b = 0; b < rows.size(); ++b) {
    rows[b] = Distinct(SuiteIds(rng, vocab, b % kTables, 4096));
  }
  std::vector<float> g(4096 * kDim, 1e-3f);
  std::vector<std::vector<float>> out(kTables,
                                      std::vector<float>(4096 * kDim));
  auto batch = [&](int step, int t) -> const std::vector<int64_t>& {
    return rows[(step % kBatches) * kTables + t];
  };
  auto lookup = [&](int step, int t) {
    const auto& b = batch(step, t);
    const int n = int(b.size());
    for (int r = 0; r < n; ++r) {
      if (r + kAhead < n) Prefetch(tables[t] + b[r + kAhead] * width, 2);
      memcpy(out[t].data() + r * kDim, tables[t] + b[r] * width,
             kDim * sizeof(float));
    }
  };
  auto update = [&](int step, int t) {
    const auto& b = batch(step, t);
    const int n = int(b.size());
    for (int r = 0; r < n; ++r) {
      if (r + kAhead < n) {
        Prefetch(tables[t] + b[r + kAhead] * width, width / 16);
      }
      float* row = tables[t] + b[r] * width;
      if (adam) {
        Adam(g.data() + r * kDim, row, row + kDim, row + 2 * kDim);
      } else {
        Sgd(g.data() + r * kDim, row);
      }
    }
  };
  auto tables_of_step = [&](int step, int begin, int end) {
    if (order == "per-table") {
      for (int t = begin; t < end; ++t) {
        lookup(step, t);
        update(step, t);
      }
      return;
    }
    for (int t = begin; t < end; ++t) lookup(step, t);
    for (int t = begin; t < end; ++t) update(step, t);
  };
  size_t distinct = 0;  // per step, averaged over the batches
  for (const auto& b : rows) distinct += b.size();
  distinct /= kBatches;
  std::vector<double> ms;
  for (int round = 0; round < 33; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) {
      const int step = round * 10 + i;
      if (threads == 1) {
        tables_of_step(step, 0, kTables);
      } else {
        std::thread other([&] { tables_of_step(step, 0, kTables / 2); });
        tables_of_step(step, kTables / 2, kTables);
        other.join();
      }
    }
    if (round < 3) continue;  // warm-up: the pages and the caches
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - start).count() / 10);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  printf("%s, %ld rows x %d tables, %s, %d thread%s: %.3f ms per step "
         "(%zu distinct rows, %.0f ns each)\n", rule.c_str(), vocab, kTables,
         order.c_str(), threads, threads == 1 ? "" : "s", median, distinct,
         median * 1e6 / distinct);
  return 0;
}
