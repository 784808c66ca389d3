// What the native benchmarks share: a float32 table backed by 2 MiB pages
// (or 4 KiB ones), a batch of ids drawn as benchmarks/workload.py's
// zipf_ids draws them (same law, another random generator) and their
// distinct values, Adam's rule.
#ifndef TFEMB_BENCHMARKS_NATIVE_SUITE_H_
#define TFEMB_BENCHMARKS_NATIVE_SUITE_H_

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

// `floats` zeroed floats, touched once so that the pages exist.
inline float* HugeTable(size_t floats, bool small_pages = false) {
  const size_t huge = size_t{2} << 20;
  const size_t bytes = (floats * sizeof(float) + huge - 1) & ~(huge - 1);
  void* p = aligned_alloc(huge, bytes);
  madvise(p, bytes, small_pages ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
  memset(p, 0, bytes);
  return static_cast<float*>(p);
}

// `n` ids of table number `table`: rank r with probability ~ r^-1.1, popular
// ranks scattered over the table.
inline std::vector<int64_t> SuiteIds(std::mt19937_64& rng, long vocab,
                                     int table, int n) {
  const double s = 1.1, top = std::pow(double(vocab), 1 - s) - 1;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int64_t> ids(n);
  for (auto& id : ids) {
    long rank = long(std::floor(std::pow(top * uniform(rng) + 1, 1 / (1 - s))));
    rank = std::min(std::max(rank - 1, 0L), vocab - 1);
    id = int64_t((__int128(rank) * 2654435761L + table * 7919) % vocab);
  }
  return ids;
}

// The distinct values of `ids`, in the order they first appear.
inline std::vector<int64_t> Distinct(const std::vector<int64_t>& ids) {
  std::unordered_set<int64_t> seen;
  std::vector<int64_t> out;
  for (const int64_t id : ids) {
    if (seen.insert(id).second) out.push_back(id);
  }
  return out;
}

// Adam's rule on one row of `dim` floats (the benchmarks' constants), in
// place: parameters w, first and second moments m and v.
inline void AdamRow(const float* __restrict g, float* __restrict w,
                    float* __restrict m, float* __restrict v, int dim) {
  for (int d = 0; d < dim; ++d) {
    const float mm = 0.9f * m[d] + 0.1f * g[d];
    const float vv = 0.999f * v[d] + 0.001f * g[d] * g[d];
    m[d] = mm;
    v[d] = vv;
    w[d] -= 0.001f * (mm / (std::sqrt(vv) + 1e-7f));
  }
}

// Floats per row of a table whose slots sit beside its parameters
// (tfemb's default layout): 1, 2 or 3 x dim for "sgd", "adagrad" and
// "adam"; 0 for any other rule.
inline int RowWidth(const std::string& rule, int dim) {
  if (rule == "sgd") return dim;
  if (rule == "adagrad") return 2 * dim;
  if (rule == "adam") return 3 * dim;
  return 0;
}

// The rule whose RowWidth is `width`, in place on one row [w, slots...]
// from its gradient g (the benchmarks' constants).
inline void UpdateRow(const float* __restrict g, float* __restrict w,
                      int width, int dim) {
  if (width == dim) {
    for (int d = 0; d < dim; ++d) w[d] -= 0.01f * g[d];
  } else if (width == 2 * dim) {
    float* a = w + dim;
    for (int d = 0; d < dim; ++d) {
      a[d] += g[d] * g[d];
      w[d] -= 0.01f * g[d] * (1.0f / std::sqrt(a[d]));
    }
  } else {
    AdamRow(g, w, w + dim, w + 2 * dim, dim);
  }
}

// The first `lines` cache lines (16 floats each) from p, asked for ahead.
inline void PrefetchLines(const float* p, int lines) {
  for (int i = 0; i < lines; ++i) __builtin_prefetch(p + 16 * i);
}

// "100000,5000000" -> {100000, 5000000}; empty if any size is not positive.
inline std::vector<long> ParseSizes(const char* text) {
  std::vector<long> sizes;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    const long n = atol(item.c_str());
    if (n <= 0) return {};
    sizes.push_back(n);
  }
  return sizes;
}

// Median ms per step of each of `n` sizes, timed side by side: 33 rounds
// (the first 3 warm-up: pages and caches), each running 10 steps of every
// size in turn, the order reversed every other round (as
// benchmarks/flatness.py does). `step(i, k)` runs step k of size i.
inline std::vector<double> SideBySide(
    size_t n, const std::function<void(size_t, int)>& step) {
  std::vector<std::vector<double>> ms(n);
  std::vector<int> done(n, 0);
  for (int round = 0; round < 33; ++round) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = round % 2 ? n - 1 - k : k;
      const auto start = std::chrono::steady_clock::now();
      for (int j = 0; j < 10; ++j) step(i, done[i]++);
      if (round < 3) continue;
      ms[i].push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start).count() /
                      10);
    }
  }
  std::vector<double> medians;
  for (auto& m : ms) {
    std::sort(m.begin(), m.end());
    medians.push_back(m[m.size() / 2]);
  }
  return medians;
}

#endif  // TFEMB_BENCHMARKS_NATIVE_SUITE_H_
