// The floor under every exact sparse step (benchmarks/floor.py builds and
// runs it): the suite's batches outside TensorFlow, in one of two kinds.
//
// rows: the step's distinct rows alone. Each table's distinct rows are
//   looked up (the parameters copied out), then updated in place by the
//   rule. No deduplication, no activations per id, no gradient sums.
// step: the whole exact step, as tfemb's kernels do it and nothing else.
//   Each table's ids are checked against its rows and deduplicated (one
//   hash pass), its distinct rows read once and every id's activation
//   written; then the ids' gradients are summed per distinct row and each
//   row is updated in place by the rule, its old values kept beside (so
//   that a step whose new values are not all finite can be put back: all
//   or nothing), and the new values checked finite.
// threads: the whole exact step on one thread (every table in turn) and
//   on two, in alternating blocks: what a second core gives the exact step.
//
// All: the slots beside the parameters (tfemb's default layout); every
// table looked up before any is updated, as in training; tables 0-3 on one
// thread, 4-7 on a second one, made once (no thread is started per step);
// `threads` also times every table on one thread.
//
//   floor IDS RULE KIND [ROWS...]
//
// IDS: a file of little-endian int64s, written by benchmarks/floor.py: for
// each size in turn, its rows per table, batches, tables and ids per batch,
// then every batch's ids, table after table. RULE: sgd (a [rows, 32]
// table), adagrad or adam ([rows, 64] and [rows, 96], the slots beside the
// parameters). KIND: rows, step or threads. ROWS: the sizes of IDS to time (rows per
// table); all of them if none.
//
// The sizes are timed side by side in one process, as benchmarks/flatness.py
// times tfemb: 33 rounds (the first 3 warm up pages and caches), each
// running 10 steps of every size in turn, the order reversed every other
// round; a step is one batch, the batches cycled (`threads`: each size's
// one-thread and two-thread blocks in turn, as if two sizes). Prints per
// size the median ms per step (`threads`: as step1 and step2):
//   adam rows, 100000 rows x 8 tables: 0.553 ms per step (12997 distinct rows, 43 ns each)
// and with `step`, what the steps computed (benchmarks' tests check it):
//   adam step, 100000 rows x 8 tables: after 330 steps the parameters sum to ..., the last step's activations to ...
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
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
#include <utility>
#include <vector>

#include "dedup.h"  // tfemb/kernels/src: the lookup's own hash pass
#include "row_loops.h"  // and the kernels' row loops: prefetch, copy, sums

namespace {

using tfemb::CopyRow;
using tfemb::Dedup;
using tfemb::kPrefetchRows;
using tfemb::PrefetchRow;

constexpr int kDim = 32, kRounds = 33, kWarmup = 3, kSteps = 10;

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older kernels refuse it, harmlessly
#endif

// `floats` zeroed floats on 2 MiB pages where the kernel gives them, as
// tfemb's tables (tfemb/kernels/src/huge_pages.cc): touched once, so that
// the pages exist, then collapsed onto 2 MiB pages (a large allocation
// that the kernel could not fault in on them at once would otherwise stay
// partly on 4 KiB pages, and its rows would cost a TLB miss more).
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
  madvise(p, bytes, MADV_COLLAPSE);
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

// No NaN or Inf among n floats: the exponent bits are all ones exactly then.
bool AllFinite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    memcpy(&bits, x + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// One size: its tables, and each batch's ids and distinct ids per table.
struct Size {
  long vocab = 0;
  int batches = 0, tables = 0, batch = 0;
  std::vector<float*> table;
  std::vector<std::vector<int64_t>> ids, rows;  // [batch * tables + table]

  const std::vector<int64_t>& Ids(int step, int t) const {
    return ids[(step % batches) * tables + t];
  }
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
  for (int64_t head[4]; Read(f, &head[0]);) {
    auto s = std::make_unique<Size>();
    if (!Read(f, &head[1]) || !Read(f, &head[2]) || !Read(f, &head[3]) ||
        head[0] <= 0 || head[1] <= 0 || head[2] <= 0 || head[3] <= 0) {
      sizes.clear();
      break;
    }
    s->vocab = head[0];
    s->batches = int(head[1]);
    s->tables = int(head[2]);
    s->batch = int(head[3]);
    s->ids.resize(size_t(s->batches) * s->tables);
    bool ok = true;
    for (auto& b : s->ids) {
      b.resize(s->batch);
      ok = ok && fread(b.data(), sizeof(int64_t), b.size(), f) == b.size();
      for (const int64_t id : b) ok = ok && id >= 0 && id < s->vocab;
      if (!ok) break;
      Dedup dedup(s->batch);
      for (const int64_t id : b) dedup.Insert(id);
      s->rows.push_back(dedup.unique());
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

// A second thread, made once: Both(a, b) runs `a` there and `b` here and
// returns when both have finished.
class Helper {
 public:
  Helper() : thread_([this] { Loop(); }) {}
  ~Helper() {
    Post(nullptr);
    thread_.join();
  }

  void Both(const std::function<void()>& a, const std::function<void()>& b) {
    const int64_t n = Post(&a);
    b();
    while (done_.load(std::memory_order_acquire) != n) {
      std::this_thread::yield();
    }
  }

 private:
  int64_t Post(const std::function<void()>* job) {
    job_.store(job, std::memory_order_relaxed);
    return posted_.fetch_add(1, std::memory_order_release) + 1;
  }

  void Loop() {
    for (int64_t seen = 0;;) {
      while (posted_.load(std::memory_order_acquire) == seen) {
        std::this_thread::yield();
      }
      ++seen;
      const auto* job = job_.load(std::memory_order_relaxed);
      if (job == nullptr) return;
      (*job)();
      done_.store(seen, std::memory_order_release);
    }
  }

  std::atomic<const std::function<void()>*> job_{nullptr};
  std::atomic<int64_t> posted_{0}, done_{0};
  std::thread thread_;
};

// What one table needs in a step besides the table: reused every step, as
// TensorFlow's allocator hands out the same buffers again.
struct Scratch {
  explicit Scratch(size_t ids, int width)
      : positions(ids), distinct(ids * kDim), out(ids * kDim),
        sums(ids * kDim), undo(ids * width) {
    unique.reserve(ids);
  }
  std::vector<int64_t> positions, unique;
  std::vector<float> distinct, out, sums, undo;
  bool finite = true;
};

// The rows alone (see KIND rows above): a table's distinct rows copied out,
// then updated in place, one gradient row each.
void CopyRows(const float* table, const std::vector<int64_t>& rows,
              float* out, int width) {
  for (size_t r = 0; r < rows.size(); ++r) {
    if (r + kPrefetchRows < rows.size()) {
      PrefetchRow(table + rows[r + kPrefetchRows] * width, kDim);
    }
    CopyRow(out + r * kDim, table + rows[r] * width, kDim);
  }
}

void UpdateRows(float* table, const std::vector<int64_t>& rows,
                const float* grads, int width) {
  for (size_t r = 0; r < rows.size(); ++r) {
    if (r + kPrefetchRows < rows.size()) {
      PrefetchRow(table + rows[r + kPrefetchRows] * width, width);
    }
    UpdateRow(grads + r * kDim, table + rows[r] * width, width);
  }
}

// The whole exact step's lookup of one table (see KIND step above).
void LookUp(const Size& s, int step, int t, Scratch* x, int width) {
  const auto& ids = s.Ids(step, t);
  const size_t n = ids.size();
  for (const int64_t id : ids) {
    if (id < 0 || id >= s.vocab) {
      fprintf(stderr, "id %ld outside the table\n", long(id));
      exit(1);
    }
  }
  Dedup dedup(n);  // made per lookup, as the kernel makes it
  for (size_t i = 0; i < n; ++i) x->positions[i] = dedup.Insert(ids[i]);
  x->unique = dedup.unique();  // the kernel's output of the distinct ids
  const auto& unique = x->unique;
  const float* table = s.table[t];
  for (size_t r = 0; r < unique.size(); ++r) {
    if (r + kPrefetchRows < unique.size()) {
      PrefetchRow(table + unique[r + kPrefetchRows] * width, kDim);
    }
    CopyRow(x->distinct.data() + r * kDim, table + unique[r] * width, kDim);
  }
  for (size_t i = 0; i < n; ++i) {
    CopyRow(x->out.data() + i * kDim,
            x->distinct.data() + x->positions[i] * kDim, kDim);
  }
}

// The whole exact step's update of one table from its ids' gradients.
void Update(const Size& s, int t, const float* grads, Scratch* x,
            int width) {
  const auto& unique = x->unique;
  const size_t u = unique.size(), n = x->positions.size();
  float* sums = x->sums.data();
  tfemb::SumRows(grads, x->positions.data(), n, u, kDim, sums);
  float* table = s.table[t];
  bool finite = true;
  for (size_t r = 0; r < u; ++r) {
    if (r + kPrefetchRows < u) {
      PrefetchRow(table + unique[r + kPrefetchRows] * width, width);
    }
    float* row = table + unique[r] * width;
    CopyRow(x->undo.data() + r * width, row, width);
    UpdateRow(sums + r * kDim, row, width);
    finite &= AllFinite(row, width);
  }
  x->finite = finite;
}

}  // namespace

int main(int argc, char** argv) {
  const int width = argc >= 4 ? RowWidth(argv[2]) : 0;
  const std::string kind = argc >= 4 ? argv[3] : "";
  const bool threads = kind == "threads";
  const bool exact = kind == "step" || threads;
  if (width == 0 || (kind != "rows" && !exact)) {
    fprintf(stderr,
            "usage: %s IDS sgd|adagrad|adam rows|step|threads [ROWS...]\n",
            argv[0]);
    return 2;
  }
  std::vector<int64_t> keep;
  for (int i = 4; i < argc; ++i) keep.push_back(std::atoll(argv[i]));
  const auto sizes = ReadSizes(argv[1], width, keep);
  if (sizes.empty() || (!keep.empty() && sizes.size() != keep.size())) {
    fprintf(stderr, "%s: not a file of ids with the sizes asked for (see "
            "floor.cc)\n", argv[1]);
    return 2;
  }
  int tables = 0, batches = 0, batch = 0;
  for (const auto& s : sizes) {
    tables = std::max(tables, s->tables);
    batches = std::max(batches, s->batches);
    batch = std::max(batch, s->batch);
  }
  // rows: one gradient per distinct row. step: one per id, every batch and
  // table its own (as the suite's embedding part feeds them), small and
  // never zero.
  const std::vector<float> row_grads(size_t(batch) * kDim, 1e-3f);
  std::vector<float> id_grads;
  if (exact) {
    id_grads.resize(size_t(batches) * tables * batch * kDim);
    for (size_t k = 0; k < id_grads.size(); ++k) {
      const uint32_t h = static_cast<uint32_t>(k) * 2654435761u;
      id_grads[k] = float(1 + (h >> 16) % 1000) * 1e-6f;
    }
  }
  std::vector<std::unique_ptr<Scratch>> scratch;
  for (int t = 0; t < tables; ++t) {
    scratch.push_back(std::make_unique<Scratch>(batch, width));
  }
  // Lookups, then updates, of tables [begin, end) of one step.
  auto tables_of_step = [&](const Size& s, int step, int begin, int end) {
    for (int t = begin; t < end; ++t) {
      if (exact) {
        LookUp(s, step, t, scratch[t].get(), width);
      } else {
        CopyRows(s.table[t], s.Rows(step, t), scratch[t]->out.data(), width);
      }
    }
    for (int t = begin; t < end; ++t) {
      if (exact) {
        const size_t first =
            (size_t(step % s.batches) * s.tables + t) * s.batch * kDim;
        Update(s, t, id_grads.data() + first, scratch[t].get(), width);
      } else {
        UpdateRows(s.table[t], s.Rows(step, t), row_grads.data(), width);
      }
    }
  };
  // What is timed in turn: each size on two threads, and with `threads`
  // each size on one thread too. {size, threads}
  std::vector<std::pair<size_t, int>> blocks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (threads) blocks.push_back({i, 1});
    blocks.push_back({i, 2});
  }
  Helper helper;
  std::vector<std::vector<double>> ms(blocks.size());
  std::vector<int> done(sizes.size(), 0);
  size_t last = 0;  // the size timed last
  for (int round = 0; round < kRounds; ++round) {
    for (size_t k = 0; k < blocks.size(); ++k) {
      const size_t b = round % 2 ? blocks.size() - 1 - k : k;
      const size_t i = blocks[b].first;
      const Size& s = *sizes[i];
      last = i;
      const auto start = std::chrono::steady_clock::now();
      for (int j = 0; j < kSteps; ++j) {
        const int step = done[i]++;
        if (blocks[b].second == 1) {
          tables_of_step(s, step, 0, s.tables);
        } else {
          helper.Both([&] { tables_of_step(s, step, 0, s.tables / 2); },
                      [&] { tables_of_step(s, step, s.tables / 2, s.tables); });
        }
        if (exact) {  // all or nothing: no step here puts back
          for (int t = 0; t < s.tables; ++t) {
            if (!scratch[t]->finite) {
              fprintf(stderr, "non-finite update\n");
              return 1;
            }
          }
        }
      }
      if (round < kWarmup) continue;
      ms[b].push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start).count() /
                      kSteps);
    }
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Size& s = *sizes[blocks[b].first];
    std::sort(ms[b].begin(), ms[b].end());
    const double median = ms[b][ms[b].size() / 2];
    const size_t distinct = s.Distinct();
    const std::string name =
        threads ? "step" + std::to_string(blocks[b].second) : kind;
    printf("%s %s, %ld rows x %d tables: %.3f ms per step (%zu distinct "
           "rows, %.0f ns each)\n", argv[2], name.c_str(), s.vocab, s.tables,
           median, distinct, median * 1e6 / distinct);
  }
  if (exact) {
    // What the last size timed computed: its parameters, and its last
    // step's activations (the scratch holds that size's last lookup).
    const Size& s = *sizes[last];
    double parameters = 0, activations = 0;
    for (int t = 0; t < s.tables; ++t) {
      for (long r = 0; r < s.vocab; ++r) {
        for (int d = 0; d < kDim; ++d) parameters += s.table[t][r * width + d];
      }
      for (const float a : scratch[t]->out) activations += a;
    }
    printf("%s %s, %ld rows x %d tables: after %d steps the parameters sum "
           "to %.9g, the last step's activations to %.9g\n", argv[2],
           kind.c_str(), s.vocab, s.tables, done[last], parameters,
           activations);
  }
  return 0;
}
