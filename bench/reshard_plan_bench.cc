// The resharding planner at scale (doc/resharding.md): a step saved by
// --ranks ranks, every tensor row-sharded over all of them, loaded by
// --new-ranks ranks row-sharded the same way (16,384 -> 12,288 by default:
// 8-way -> 6-way style). Prints the index's size per piece, the plan time
// (median of --runs) next to the time of one pass that only reads both
// indexes (the floor of any planner), and the planner's own peak memory
// next to the index's size, counted by this binary's operator new.
// --threads: tensors are planned in ranges on that many threads (default
// 1: on a shared machine a second thread waits for a core).
// It also times the coordinator's commit-time merge: one index blob per
// saved rank (what each rank's DURABLE report carries) merged into the
// step's index, checked equal to it byte for byte, next to one validating
// parse of that index.
// --smoke: a small layout, for ctest; --json: one JSON object on stdout.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/layout_merge.h"
#include "storage/reshard_plan.h"
#include "util/program.h"

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};

void Count(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  const int64_t now =
      g_live.fetch_add(malloc_usable_size(p)) + malloc_usable_size(p);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
void Uncount(void* p) {
  if (p != nullptr) g_live.fetch_sub(malloc_usable_size(p));
}

}  // namespace

void* operator new(size_t n) {
  void* p = std::malloc(n ? n : 1);
  Count(p);
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, std::align_val_t a) {
  void* p =
      std::aligned_alloc(static_cast<size_t>(a),
                         (n + static_cast<size_t>(a) - 1) /
                             static_cast<size_t>(a) * static_cast<size_t>(a));
  Count(p);
  return p;
}
void* operator new[](size_t n, std::align_val_t a) {
  return operator new(n, a);
}
void operator delete(void* p) noexcept {
  Uncount(p);
  std::free(p);
}
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete(void* p, size_t) noexcept { operator delete(p); }
void operator delete[](void* p, size_t) noexcept { operator delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { operator delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept {
  operator delete(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  operator delete(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  operator delete(p);
}

namespace {

using ckpt::DType;
using namespace ckpt::storage;

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "reshard_plan_bench: %s\n", what.c_str());
  std::exit(1);
}

// Tensor t: rows = unit * (1 + t % 4) with unit divisible by both world
// sizes, cols 64 * (1 + t % 8), bfloat16; rank r holds rows [r * n, (r+1) * n).
// only_rank >= 0: that rank's pieces only (its report's index).
LayoutIndex RowSharded(uint32_t world, uint32_t tensors, uint64_t unit,
                       int64_t only_rank = -1) {
  LayoutIndexBuilder b(world);
  b.Reserve(tensors, uint64_t{only_rank < 0 ? world : 1} * tensors);
  std::vector<uint64_t> shapes;
  for (uint32_t t = 0; t < tensors; ++t) {
    const uint64_t shape[2] = {unit * (1 + t % 4), 64u * (1 + t % 8)};
    char name[32];
    std::snprintf(name, sizeof(name), "layers.%04u.weight", t);
    if (!b.AddTensor(name, DType::kBFloat16, shape).ok()) Die("AddTensor");
  }
  for (uint32_t r = 0; r < world; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    uint64_t data = 0;
    for (uint32_t t = 0; t < tensors; ++t) {
      const uint64_t rows = unit * (1 + t % 4) / world,
                     cols = 64u * (1 + t % 8);
      const uint64_t off[2] = {rows * r, 0}, len[2] = {rows, cols};
      if (!b.AddPiece(t, r, data, off, len).ok()) Die("AddPiece");
      data += (rows * cols * 2 + 4095) / 4096 * 4096;
    }
  }
  absl::StatusOr<LayoutIndex> idx = std::move(b).Finish();
  if (!idx.ok()) Die(std::string(idx.status().message()));
  return *std::move(idx);
}

// Reads every piece of both indexes once: what any planner must at least do.
double ScanSeconds(const LayoutIndex& a, const LayoutIndex& b) {
  const double t0 = Now();
  uint64_t sum = 0;
  for (const LayoutIndex* idx : {&a, &b})
    for (const LayoutTensor& t : idx->tensors())
      for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p)
        sum += idx->piece_offset(p, 0) + idx->piece_length(p, 0) +
               idx->piece_rank(p);
  const double s = Now() - t0;
  if (sum == 42) std::puts("");  // keeps the loop
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "reshard_plan_bench", CKPT_VERSION))
    return 0;
  uint32_t ranks = 16384, new_ranks = 12288, tensors = 1000, runs = 5;
  uint32_t threads = 1;
  bool json = false, smoke = false;
  CLI::App app{
      "The resharding planner at scale: a step saved by --ranks ranks, "
      "loaded by --new-ranks ranks (doc/resharding.md)"};
  app.add_option("--ranks", ranks, "saved world size")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--new-ranks", new_ranks, "requested world size")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--tensors", tensors, "tensors in the state")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--runs", runs, "plans timed (the median is reported)")
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--threads", threads, "threads planning ranges of tensors")
      ->check(CLI::Range(1u, 1024u));
  app.add_flag("--smoke", smoke, "64 -> 48 ranks, 10 tensors, 2 runs (ctest)");
  app.add_flag("--json", json, "one JSON object on stdout");
  CLI11_PARSE(app, argc, argv);
  if (smoke) ranks = 64, new_ranks = 48, tensors = 10, runs = 2;
  // Rows divisible by both world sizes.
  uint64_t unit = uint64_t{ranks} * new_ranks;
  for (uint64_t x = ranks, y = new_ranks; y != 0;) {
    const uint64_t r = x % y;
    x = y;
    y = r;
    if (y == 0) unit /= x;
  }

  double t0 = Now();
  std::string bytes;
  {
    LayoutIndex built = RowSharded(ranks, tensors, unit);
    bytes = SerializeLayoutIndex(built);
  }
  const double build_s = Now() - t0;
  double merge_s = 0;
  uint64_t rank_index_bytes = 0;
  {
    std::vector<std::string> blobs(ranks);
    for (uint32_t r = 0; r < ranks; ++r) {
      blobs[r] = SerializeLayoutIndex(RowSharded(ranks, tensors, unit, r));
      rank_index_bytes += blobs[r].size();
    }
    const std::vector<std::string_view> views(blobs.begin(), blobs.end());
    t0 = Now();
    absl::StatusOr<LayoutIndex> merged = MergeRankLayoutIndexes(views);
    if (!merged.ok()) Die(std::string(merged.status().message()));
    const std::string merged_bytes = SerializeLayoutIndex(*merged);
    merge_s = Now() - t0;
    if (merged_bytes != bytes)
      Die("the merge of the ranks' indexes is not the step's index");
  }
  t0 = Now();
  absl::StatusOr<LayoutIndex> saved = ParseLayoutIndex(bytes);
  const double parse_s = Now() - t0;
  if (!saved.ok()) Die(std::string(saved.status().message()));
  const LayoutIndex requested = RowSharded(new_ranks, tensors, unit);
  const uint64_t pieces = saved->num_pieces();

  std::vector<uint64_t> read_bytes(new_ranks);
  uint64_t reads = 0;
  std::vector<double> plan_s, plan_cpu_s;
  int64_t planner_peak = 0;
  // Tensors are independent: each thread plans a range with its own sums
  // (allocated here, outside the measured allocations).
  std::vector<std::vector<uint64_t>> part(threads,
                                          std::vector<uint64_t>(new_ranks));
  std::vector<uint64_t> part_reads(threads);
  std::vector<absl::Status> status(threads);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  const size_t nt = requested.tensors().size();
  for (uint32_t run = 0; run < runs; ++run) {
    for (auto& v : part) std::fill(v.begin(), v.end(), 0);
    std::fill(part_reads.begin(), part_reads.end(), 0);
    pool.clear();
    const int64_t base = g_live.load();
    g_peak.store(base);
    t0 = Now();
    const double c0 = CpuNow();
    for (uint32_t k = 0; k < threads; ++k)
      pool.emplace_back([&, k] {
        status[k] = PlanReshardTensors(
            *saved, requested, {}, nt * k / threads, nt * (k + 1) / threads,
            [&](const PlannedRead& r) {
              ++part_reads[k];
              part[k][requested.piece_rank(r.request)] += r.box.Elements() * 2;
            });
      });
    for (std::thread& th : pool) th.join();
    plan_s.push_back(Now() - t0);
    plan_cpu_s.push_back(CpuNow() - c0);
    planner_peak = std::max(planner_peak, g_peak.load() - base);
    for (uint32_t k = 0; k < threads; ++k)
      if (!status[k].ok()) Die(std::string(status[k].message()));
  }
  reads = 0;
  for (uint32_t k = 0; k < threads; ++k) {
    reads += part_reads[k];
    for (uint32_t r = 0; r < new_ranks; ++r) read_bytes[r] += part[k][r];
  }
  // Every requested byte once: the reads add up to the requested bytes.
  uint64_t want = 0, got = 0;
  for (uint64_t q = 0; q < requested.num_pieces(); ++q)
    want += requested.PieceBox(q).Elements() * 2;
  for (uint64_t b : read_bytes) got += b;
  if (want != got) Die("reads do not add up to the requested bytes");
  const double scan_s = ScanSeconds(*saved, requested);
  std::sort(plan_s.begin(), plan_s.end());
  const double median = plan_s[plan_s.size() / 2];
  std::sort(plan_cpu_s.begin(), plan_cpu_s.end());
  const double cpu_median = plan_cpu_s[plan_cpu_s.size() / 2];
  const double per_piece = static_cast<double>(bytes.size()) / pieces;
  const uint64_t memory = saved->MemoryBytes();

  if (json) {
    std::printf(
        "{\"saved_ranks\": %u, \"new_ranks\": %u, \"tensors\": %u, "
        "\"pieces\": %lu, \"requests\": %lu, \"reads\": %lu, "
        "\"index_bytes\": %zu, \"index_bytes_per_piece\": %.2f, "
        "\"index_memory_bytes\": %lu, \"plan_s\": %.4f, \"plan_s_min\": %.4f, "
        "\"plan_s_max\": %.4f, \"plan_cpu_s\": %.4f, \"threads\": %u, "
        "\"runs\": %u, \"scan_s\": %.4f, "
        "\"plan_over_scan\": %.2f, \"planner_peak_bytes\": %ld, "
        "\"planner_peak_over_index\": %.6f, \"build_serialize_s\": %.3f, "
        "\"parse_s\": %.3f, \"merge_s\": %.3f, \"rank_index_bytes\": %lu, "
        "\"merge_over_parse\": %.2f}\n",
        ranks, new_ranks, tensors, pieces, requested.num_pieces(), reads,
        bytes.size(), per_piece, memory, median, plan_s.front(), plan_s.back(),
        cpu_median, threads, runs, scan_s, median / scan_s, planner_peak,
        static_cast<double>(planner_peak) / bytes.size(), build_s, parse_s,
        merge_s, rank_index_bytes, merge_s / parse_s);
    return 0;
  }
  std::printf(
      "saved %u ranks x %u tensors (row-sharded over all ranks) -> %u ranks\n",
      ranks, tensors, new_ranks);
  std::printf(
      "index: %zu bytes, %lu pieces, %.2f bytes/piece (target <= 64); "
      "%lu bytes in memory\n",
      bytes.size(), pieces, per_piece, memory);
  std::printf(
      "plan: median %.3f s of %u runs [%.3f, %.3f] on %u threads "
      "(target <= 1 s); %lu requests, %lu reads\n",
      median, runs, plan_s.front(), plan_s.back(), threads,
      requested.num_pieces(), reads);
  std::printf(
      "plan CPU time (all threads): median %.3f s (the machine is shared: wall "
      "time includes waiting for a core)\n",
      cpu_median);
  std::printf("limit: one pass over both indexes %.3f s; plan / pass = %.2f\n",
              scan_s, median / scan_s);
  std::printf(
      "planner memory: peak %ld bytes = %.4f x the index "
      "(target <= 2)\n",
      planner_peak, static_cast<double>(planner_peak) / bytes.size());
  std::printf("build + serialize %.3f s, parse (validating) %.3f s\n", build_s,
              parse_s);
  std::printf(
      "commit merge: %u rank indexes (%lu bytes in all) merged and "
      "serialized in %.3f s = %.2f x the validating parse of the result\n",
      ranks, rank_index_bytes, merge_s, merge_s / parse_s);
  return 0;
}
