// The floor under every exact sparse step (benchmarks/floor.py builds and
// runs it): the distinct rows of the suite's batches alone, outside
// TensorFlow. Each table's rows are looked up (the parameters copied out),
// then updated in place by the rule (parameters and slots side by side,
// tfemb's default layout), every table looked up before any is updated, as
// in training; tables 0-3 on one thread, 4-7 on the other. No
// deduplication, no activations per id, no gradient sums.
//
//   floor IDS RULE [ROWS...]
//
// IDS: a file of little-endian int64s, written by benchmarks/floor.py: for
// each size in turn, its rows per table, batches and tables, then for each
// batch and table the number of its distinct ids and the ids, in the order
// they first appear in the batch. RULE: sgd (a [rows, 32] table), adagrad
// or adam ([rows, 64] and [rows, 96], the slots beside the parameters).
// ROWS: the sizes of IDS to time (rows per table); all of them if none.
//
// The sizes are timed side by side in one process, as benchmarks/flatness.py
// times tfemb: 33 rounds (the first 3 warm up pages and caches), each
// running 10 steps of every size in turn, the order reversed every other
// round; a step is one batch, the batches cycled. Prints per size the
// median ms per step:
//   adam, 100000 rows x 8 tables: 0.553 ms per step (12997 distinct rows, 43 ns each)
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kDim = 32, kAhead = 12, kRounds = 33, kWarmup = 3, kSteps = 10;

// `floats` zeroed floats on 2 MiB pages where the kernel gives them (as
// tfemb's tables), touched once so that the pages exist.
float* HugeTable(size_t floats) {
  const size_t huge = size_t{2} << 20;
  const size_t bytes = (floats * sizeof(float) + huge - 1) & ~(huge - 1);
  void* p = aligned_alloc(huge, bytes);
  if (p == nullptr) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  memset(p, 0, bytes);
  return static_cast<float*>(p);
}

// Floats per row: 1, 2 or 3 x dim for sgd, adagrad and adam; 0 otherwise.
int RowWidth(const std::string& rule) {
  if (rule == "sgd") return kDim;
  if (rule == "adagrad") return 2 * kDim;
  if (rule == "adam") return 3 * kDim;
  return 0;
}

// The rule whose RowWidth is `width`, in place on one row [w, slots...].
void UpdateRow(const float* __restrict g, float* __restrict w, int width) {
  if (width == kDim) {
    for (int d = 0; d < kDim; ++d) w[d] -= 0.01f * g[d];
  } else if (width == 2 * kDim) {
    float* a = w + kDim;
    for (int d = 0; d < kDim; ++d) {
      a[d] += g[d] * g[d];
      w[d] -= 0.01f * g[d] * (1.0f / std::sqrt(a[d]));
    }
  } else {
    float *m = w + kDim, *v = w + 2 * kDim;
    for (int d = 0; d < kDim; ++d) {
      m[d] = 0.9f * m[d] + 0.1f * g[d];
      v[d] = 0.999f * v[d] + 0.001f * g[d] * g[d];
      w[d] -= 0.001f * (m[d] / (std::sqrt(v[d]) + 1e-7f));
    }
  }
}

// The first `lines` cache lines (16 floats each) from p, asked for ahead.
void Prefetch(const float* p, int lines) {
  for (int i = 0; i < lines; ++i) __builtin_prefetch(p + 16 * i);
}

// One size: its tables and the distinct ids of each batch and table.
struct Size {
  long vocab = 0;
  int batches = 0, tables = 0;
  std::vector<float*> table;
  std::vector<std::vector<int64_t>> rows;  // [batch * tables + table]

  const std::vector<int64_t>& Rows(int step, int t) const {
    return rows[(step % batches) * tables + t];
  }
  size_t Distinct() const {  // per step: all tables, averaged over batches
    size_t n = 0;
    for (const auto& r : rows) n += r.size();
    return n / batches;
  }
};

bool Read(FILE* f, int64_t* x) { return fread(x, sizeof(*x), 1, f) == 1; }

// The sizes of the file at `path`; empty if it is not as described above.
// Only the sizes in `keep` (every size if empty) are kept; the tables of
// the others are never allocated.
std::vector<std::unique_ptr<Size>> ReadSizes(const char* path, int width,
                                             const std::vector<int64_t>& keep) {
  std::vector<std::unique_ptr<Size>> sizes;
  FILE* f = fopen(path, "rb");
  if (f == nullptr) return sizes;
  for (int64_t head[3]; Read(f, &head[0]);) {
    auto s = std::make_unique<Size>();
    if (!Read(f, &head[1]) || !Read(f, &head[2]) || head[0] <= 0 ||
        head[1] <= 0 || head[2] <= 0) {
      sizes.clear();
      break;
    }
    s->vocab = head[0];
    s->batches = int(head[1]);
    s->tables = int(head[2]);
    s->rows.resize(size_t(s->batches) * s->tables);
    bool ok = true;
    for (auto& r : s->rows) {
      int64_t n = 0;
      ok = ok && Read(f, &n) && n >= 0;
      r.resize(ok ? size_t(n) : 0);
      ok = ok && fread(r.data(), sizeof(int64_t), r.size(), f) == r.size();
      for (const int64_t id : r) ok = ok && id >= 0 && id < s->vocab;
    }
    if (!ok) {
      sizes.clear();
      break;
    }
    if (!keep.empty() &&
        std::find(keep.begin(), keep.end(), s->vocab) == keep.end()) {
      continue;
    }
    for (int t = 0; t < s->tables; ++t) {
      s->table.push_back(HugeTable(size_t(s->vocab) * width));
    }
    sizes.push_back(std::move(s));
  }
  fclose(f);
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  const int width = argc >= 3 ? RowWidth(argv[2]) : 0;
  if (width == 0) {
    fprintf(stderr, "usage: %s IDS sgd|adagrad|adam [ROWS...]\n", argv[0]);
    return 2;
  }
  std::vector<int64_t> keep;
  for (int i = 3; i < argc; ++i) keep.push_back(std::atoll(argv[i]));
  const auto sizes = ReadSizes(argv[1], width, keep);
  if (sizes.empty() || (!keep.empty() && sizes.size() != keep.size())) {
    fprintf(stderr, "%s: not a file of ids with the sizes asked for (see "
            "floor.cc)\n", argv[1]);
    return 2;
  }
  size_t most = 0;
  int tables = 0;
  for (const auto& s : sizes) {
    tables = std::max(tables, s->tables);
    for (const auto& r : s->rows) most = std::max(most, r.size());
  }
  const std::vector<float> g(most * kDim, 1e-3f);
  std::vector<std::vector<float>> out(tables, std::vector<float>(most * kDim));
  // Lookups, then updates, of tables [begin, end) of one step.
  auto tables_of_step = [&](const Size& s, int step, int begin, int end) {
    for (int t = begin; t < end; ++t) {
      const auto& b = s.Rows(step, t);
      for (size_t r = 0; r < b.size(); ++r) {
        if (r + kAhead < b.size()) Prefetch(s.table[t] + b[r + kAhead] * width, 2);
        memcpy(out[t].data() + r * kDim, s.table[t] + b[r] * width,
               kDim * sizeof(float));
      }
    }
    for (int t = begin; t < end; ++t) {
      const auto& b = s.Rows(step, t);
      for (size_t r = 0; r < b.size(); ++r) {
        if (r + kAhead < b.size()) {
          Prefetch(s.table[t] + b[r + kAhead] * width, width / 16);
        }
        UpdateRow(g.data() + r * kDim, s.table[t] + b[r] * width, width);
      }
    }
  };
  std::vector<std::vector<double>> ms(sizes.size());
  std::vector<int> done(sizes.size(), 0);
  for (int round = 0; round < kRounds; ++round) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      const size_t i = round % 2 ? sizes.size() - 1 - k : k;
      const Size& s = *sizes[i];
      const auto start = std::chrono::steady_clock::now();
      for (int j = 0; j < kSteps; ++j) {
        const int step = done[i]++;
        std::thread other([&] { tables_of_step(s, step, 0, s.tables / 2); });
        tables_of_step(s, step, s.tables / 2, s.tables);
        other.join();
      }
      if (round < kWarmup) continue;
      ms[i].push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start).count() /
                      kSteps);
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    const double median = ms[i][ms[i].size() / 2];
    const size_t distinct = sizes[i]->Distinct();
    printf("%s, %ld rows x %d tables: %.3f ms per step (%zu distinct rows, "
           "%.0f ns each)\n", argv[2], sizes[i]->vocab, sizes[i]->tables,
           median, distinct, median * 1e6 / distinct);
  }
  return 0;
}
