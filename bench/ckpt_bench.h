// ckpt_bench's options and entry point (bench/ckpt_bench.cc measures,
// bench/ckpt_bench_main.cc parses the command line and prints).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "bench/report.h"

namespace ckpt::bench {

struct Options {
  uint64_t bytes = 1ull << 30;
  int tensors = 64;
  int saves = 3;
  int repeat = 3;  // rounds, each figure next to its limit
  int copy_threads = 0;
  std::string root;
  std::string ckptd;
  bool keep = false;
  bool json = false;
  std::string
      object_url;  // object-tier figures too (bench/object_tier_bench.h)
  int object_store_pid = 0;  // a loopback store's process: its CPU time too
};

// Starts a ckptd, measures every figure next to its limit o.repeat times,
// fills *r with medians and spreads, and cleans up.
absl::Status RunBench(const Options& o, Results* r);

// ckpt_bench --reshard N:M (bench/reshard_restore_bench.cc): N ranks save
// o.bytes row-sharded; a restore at M ranks against one at N ranks, from
// memory and from disk. *out: a table, or JSON with o.json.
absl::Status RunReshardBench(const Options& o, int saved, int restored,
                             std::string* out);

}  // namespace ckpt::bench
