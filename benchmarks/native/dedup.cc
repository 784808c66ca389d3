// How fast the lookup deduplicates a batch's ids, outside TensorFlow: two
// layouts of TfembDedupGather's hash table (tfemb/kernels/
// embedding_kernels.cc), alone and followed by the lookup's row copies.
//
//   g++ -O3 -march=native benchmarks/native/dedup.cc -o /tmp/dedup
//   /tmp/dedup 5000000 && /tmp/dedup 100000
//
//   pairs      int64 ids and int64 positions side by side in the table (16
//              bytes a slot: 128 KiB for 4096 ids; an earlier kernel)
//   positions  int32 positions only, the ids in the vector of distinct ids
//              (4 bytes a slot: 32 KiB, the L1 cache's size; the kernel now)
//
// Each step deduplicates 8 tables' batches of 4096 ids drawn as
// benchmarks/workload.py draws them (Zipf law of exponent 1.1, popular ranks
// scattered over the table), cycling through 8 batches as the suite does;
// "+ rows" then copies every id's row of a [vocab, 32] float32 table on
// 2 MiB pages into the activations in the order of the ids, 12 ids ahead
// prefetched (an earlier kernel); "+ distinct rows" copies each
// distinct row once into a compact buffer, 12 distinct rows ahead
// prefetched, then every id's row from that buffer (the kernel now: in the
// order of the ids, repeats of popular ids take half the prefetch distance).
// Alternating rounds of 10 steps; prints the median per step of 8 tables.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "suite.h"

namespace {

constexpr int kDim = 32, kTables = 8, kBatches = 8, kIds = 4096, kAhead = 12;

int64_t Capacity(int64_t n) {
  int64_t c = 16;
  while (c < 2 * n) c <<= 1;
  return c;
}

int64_t Slot(int64_t id, int64_t mask) {
  return int64_t((uint64_t(id) * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

// Both fill `unique` (first-occurrence order) and `pos`, as the kernel.
void DedupPairs(const std::vector<int64_t>& ids, std::vector<int64_t>& unique,
                int64_t* pos) {
  const int64_t mask = Capacity(ids.size()) - 1;
  std::vector<int64_t> keys(mask + 1, -1), slots(mask + 1);
  for (size_t k = 0; k < ids.size(); ++k) {
    const int64_t id = ids[k];
    for (int64_t i = Slot(id, mask);; i = (i + 1) & mask) {
      if (keys[i] == id) { pos[k] = slots[i]; break; }
      if (keys[i] < 0) {
        keys[i] = id;
        pos[k] = slots[i] = int64_t(unique.size());
        unique.push_back(id);
        break;
      }
    }
  }
}

void DedupPositions(const std::vector<int64_t>& ids,
                    std::vector<int64_t>& unique, int64_t* pos) {
  const int64_t mask = Capacity(ids.size()) - 1;
  std::vector<int32_t> at(mask + 1, -1);
  unique.reserve(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const int64_t id = ids[k];
    for (int64_t i = Slot(id, mask);; i = (i + 1) & mask) {
      const int32_t p = at[i];
      if (p < 0) {
        pos[k] = at[i] = int32_t(unique.size());
        unique.push_back(id);
        break;
      }
      if (unique[p] == id) { pos[k] = p; break; }
    }
  }
}

volatile float sink;

}  // namespace

int main(int argc, char** argv) {
  const long vocab = argc > 1 ? atol(argv[1]) : 5000000;
  std::vector<float*> tables(kTables);
  for (auto& t : tables) t = HugeTable(size_t(vocab) * kDim);
  std::mt19937_64 rng(1);
  std::vector<std::vector<int64_t>> ids;
  for (int b = 0; b < kBatches; ++b) {
    for (int t = 0; t < kTables; ++t) ids.push_back(SuiteIds(rng, vocab, t, kIds));
  }
  std::vector<float> out(size_t(kIds) * kDim);
  std::vector<int64_t> pos(kIds), pos2(kIds);
  for (const auto& batch : ids) {  // both layouts give the same answer
    std::vector<int64_t> unique, unique2;
    DedupPairs(batch, unique, pos.data());
    DedupPositions(batch, unique2, pos2.data());
    if (unique != unique2 || pos != pos2) {
      fprintf(stderr, "the two layouts disagree\n");
      return 1;
    }
  }
  const char* names[] = {"pairs", "positions", "pairs + rows",
                         "positions + rows", "positions + distinct rows"};
  constexpr int kVariants = 5;
  std::vector<float> compact(size_t(kIds) * kDim);  // the distinct rows
  std::vector<std::vector<double>> ms(kVariants);
  for (int round = 0; round < 30; ++round) {
    for (int variant = 0; variant < kVariants; ++variant) {
      const auto start = std::chrono::steady_clock::now();
      for (int step = 0; step < 10; ++step) {
        for (int t = 0; t < kTables; ++t) {
          const auto& batch = ids[(step % kBatches) * kTables + t];
          std::vector<int64_t> unique;
          if (variant == 0 || variant == 2) DedupPairs(batch, unique, pos.data());
          else DedupPositions(batch, unique, pos.data());
          if (variant < 2) { sink = float(unique.size()); continue; }
          const float* src = tables[t];
          if (variant == 4) {
            const int64_t u = int64_t(unique.size());
            for (int64_t r = 0; r < u; ++r) {
              if (r + kAhead < u) {
                const float* ahead = src + unique[r + kAhead] * kDim;
                __builtin_prefetch(ahead);
                __builtin_prefetch(ahead + 16);
              }
              memcpy(&compact[size_t(r) * kDim], src + unique[r] * kDim,
                     kDim * sizeof(float));
            }
            for (int k = 0; k < kIds; ++k) {
              memcpy(&out[size_t(k) * kDim], &compact[size_t(pos[k]) * kDim],
                     kDim * sizeof(float));
            }
            sink = out[size_t(kIds) * kDim - 1];
            continue;
          }
          for (int k = 0; k < kIds; ++k) {
            if (k + kAhead < kIds) {
              const float* ahead = src + unique[pos[k + kAhead]] * kDim;
              __builtin_prefetch(ahead);
              __builtin_prefetch(ahead + 16);
            }
            memcpy(&out[size_t(k) * kDim], src + unique[pos[k]] * kDim,
                   kDim * sizeof(float));
          }
          sink = out[size_t(kIds) * kDim - 1];
        }
      }
      ms[variant].push_back(std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - start)
                                .count() / 10);
    }
  }
  printf("%ld rows per table, median ms per step of %d tables (%d ids each)\n",
         vocab, kTables, kIds);
  for (int variant = 0; variant < kVariants; ++variant) {
    std::sort(ms[variant].begin(), ms[variant].end());
    printf("  %-25s %.3f\n", names[variant], ms[variant][15]);
  }
  return 0;
}
