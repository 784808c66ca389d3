// How fast this machine updates random rows, outside TensorFlow: the floor
// under tfemb's update kernel at large vocabularies (benchmarks/README.md).
//
//   g++ -O3 -march=native -fno-math-errno benchmarks/native/row_update.cc -o /tmp/row_update
//   /tmp/row_update 100000 && /tmp/row_update 5000000
//   /tmp/row_update 5000000 sorted      # the ids of each step in row order
//   /tmp/row_update 5000000 span=100000 # ids drawn from the first 100k rows
//   /tmp/row_update 5000000 4k          # 4 KiB pages instead of 2 MiB
//   /tmp/row_update 5000000 zipf        # the suite's ids (see below)
//   /tmp/row_update 5000000 zipf lookup # each step a lookup, then the update
//   /tmp/row_update 5000000 zipf lookup slots  # only the slots side by side
//
// Per table, 1900 distinct rows drawn uniformly (every one a cache miss at
// 5M rows), each updated in place by Adam's rule (parameters and two slots,
// dim 32, float32), rows prefetched 8 ahead, tables backed by 2 MiB pages:
//   separate     three [rows, 32] arrays (tfemb's layout, TensorFlow's)
//   interleaved  one [rows, 96] array (parameters and slots side by side);
//                with `slots`, the parameters apart and only the two slots
//                side by side in a [rows, 64] array
// With `zipf`, each step's rows are instead the distinct ids of a batch of
// the suite (benchmarks/workload.py: 4096 ids per table drawn from a Zipf
// law of exponent 1.1, popular ranks scattered over the table) and the steps
// cycle through 8 such batches as the suite does, so the rows of a step are
// often ones a recent step touched: at 5M rows about 2,000 per table and
// step, 11,500 per table over the 8 batches.
// Alternating rounds of 10 steps; prints the median per step of 4 tables.
// The options tell what the cost per row depends on: the size of the region
// the rows come from and the page size, not the order of the rows; and,
// with `lookup`, how much the interleaved layout gains once the step's
// lookup has read the rows' parameters before the update (as in training).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "suite.h"

namespace {

constexpr int kDim = 32, kTables = 4, kRows = 1900, kAhead = 8;

bool small_pages = false;  // "4k": no 2 MiB pages

float* Table(size_t floats) { return HugeTable(floats, small_pages); }

void Prefetch(const float* p, int lines) {
  for (int i = 0; i < lines; ++i) __builtin_prefetch(p + 16 * i, 1);
}

void Adam(const float* g, float* w, float* m, float* v) {
  AdamRow(g, w, m, v, kDim);
}

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const long vocab = argc > 1 ? atol(argv[1]) : 5000000;
  long span = vocab;
  bool sorted = false, zipf = false, lookup = false, slots_only = false;
  for (int a = 2; a < argc; ++a) {
    if (!strcmp(argv[a], "sorted")) sorted = true;
    else if (!strcmp(argv[a], "4k")) small_pages = true;
    else if (!strcmp(argv[a], "zipf")) zipf = true;
    else if (!strcmp(argv[a], "lookup")) lookup = true;
    else if (!strcmp(argv[a], "slots")) slots_only = true;
    else if (!strncmp(argv[a], "span=", 5)) span = atol(argv[a] + 5);
    else { fprintf(stderr, "unknown option %s\n", argv[a]); return 2; }
  }
  // both: [rows, 96], or [rows, 64] (the slots) beside w2 with `slots`.
  std::vector<float*> w(kTables), m(kTables), v(kTables), both(kTables),
      w2(kTables);
  const int width = slots_only ? 2 * kDim : 3 * kDim;
  for (int t = 0; t < kTables; ++t) {
    w[t] = Table(vocab * kDim);
    m[t] = Table(vocab * kDim);
    v[t] = Table(vocab * kDim);
    both[t] = Table(vocab * width);
    if (slots_only) w2[t] = Table(vocab * kDim);
  }
  std::mt19937_64 rng(1);
  // ids[step % ids.size() * kTables + table]: one list of rows per table.
  std::vector<std::vector<long>> ids(zipf ? 8 * kTables : 64,
                                     std::vector<long>(kRows));
  for (size_t b = 0; b < ids.size(); ++b) {
    auto& batch = ids[b];
    if (zipf) {
      const auto distinct = Distinct(SuiteIds(rng, vocab, b % kTables, 4096));
      batch.assign(distinct.begin(), distinct.end());
    } else {
      for (auto& id : batch) id = static_cast<long>(rng() % span);
    }
    if (sorted) std::sort(batch.begin(), batch.end());
  }
  size_t rows_per_step = 0;  // over the 8 batches, for ns per row
  for (const auto& batch : ids) rows_per_step += batch.size();
  rows_per_step /= ids.size() / kTables;
  std::vector<float> g(4096 * kDim, 1e-3f);
  // With `lookup`, a step first reads every table's rows of the step as the
  // lookup does (the parameters only, into the activations), then updates.
  std::vector<float> out(4096 * kDim);
  auto read_rows = [&](int step, const std::vector<float*>& base,
                       int stride) {
    for (int t = 0; t < kTables; ++t) {
      const auto& batch = ids[(step * kTables + t) % ids.size()];
      const int rows = batch.size();
      for (int r = 0; r < rows; ++r) {
        if (r + kAhead < rows) Prefetch(base[t] + batch[r + kAhead] * stride, 2);
        std::memcpy(out.data() + r * kDim, base[t] + batch[r] * stride,
                    kDim * sizeof(float));
      }
    }
  };
  auto separate = [&](int step) {
    if (lookup) read_rows(step, w, kDim);
    for (int t = 0; t < kTables; ++t) {
      const auto& batch = ids[(step * kTables + t) % ids.size()];
      const long* u = batch.data();
      const int rows = batch.size();
      for (int r = 0; r < rows; ++r) {
        if (r + kAhead < rows) {
          const long a = u[r + kAhead] * kDim;
          Prefetch(w[t] + a, 2);
          Prefetch(m[t] + a, 2);
          Prefetch(v[t] + a, 2);
        }
        const long a = u[r] * kDim;
        Adam(g.data() + r * kDim, w[t] + a, m[t] + a, v[t] + a);
      }
    }
  };
  auto interleaved = [&](int step) {
    if (lookup) read_rows(step, slots_only ? w2 : both,
                          slots_only ? kDim : width);
    for (int t = 0; t < kTables; ++t) {
      const auto& batch = ids[(step * kTables + t) % ids.size()];
      const long* u = batch.data();
      const int rows = batch.size();
      for (int r = 0; r < rows; ++r) {
        if (r + kAhead < rows) {
          Prefetch(both[t] + u[r + kAhead] * width, width / 16);
          if (slots_only) Prefetch(w2[t] + u[r + kAhead] * kDim, 2);
        }
        float* row = both[t] + u[r] * width;
        if (slots_only) {
          Adam(g.data() + r * kDim, w2[t] + u[r] * kDim, row, row + kDim);
          continue;
        }
        Adam(g.data() + r * kDim, row, row + kDim, row + 2 * kDim);
      }
    }
  };
  using Clock = std::chrono::steady_clock;
  std::vector<double> ts, ti;
  for (int round = 0; round < 20; ++round) {
    const auto t0 = Clock::now();
    for (int i = 0; i < 10; ++i) separate(round * 10 + i);
    const auto t1 = Clock::now();
    for (int i = 0; i < 10; ++i) interleaved(round * 10 + i);
    const auto t2 = Clock::now();
    ts.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / 10);
    ti.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count() / 10);
  }
  const double s = Median(ts), i = Median(ti);
  const double per_row = 1e6 / rows_per_step;
  if (zipf) {
    printf("%ld rows x %d tables, the suite's Zipf batches (%zu distinct "
           "rows per step)", vocab, kTables, rows_per_step);
  } else {
    printf("%ld rows x %d tables, %d random rows each (from the first %ld)",
           vocab, kTables, kRows, span);
  }
  printf("%s%s%s, Adam: separate %.3f ms (%.0f ns per row), %s %.3f ms "
         "(%.0f ns per row)\n", lookup ? ", after a lookup" : "",
         sorted ? ", sorted" : "",
         small_pages ? ", 4 KiB pages" : "", s, s * per_row,
         slots_only ? "slots side by side" : "interleaved", i, i * per_row);
  return 0;
}
