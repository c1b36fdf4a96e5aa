// ckpt_bench's command line: see bench/ckpt_bench.cc for what it measures.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "bench/ckpt_bench.h"
#include "bench/report.h"
#include "util/program.h"

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "ckpt_bench", CKPT_VERSION)) return 0;
  ckpt::bench::Options o;
  CLI::App app{
      "ckpt_bench: ckptd's save/persist/restore against memcpy and raw disk "
      "I/O"};
  app.add_option("--bytes", o.bytes, "bytes of state (float32 host tensors)")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{1} << 40));
  app.add_option("--tensors", o.tensors, "number of tensors")
      ->check(CLI::Range(1, 65536));
  app.add_option("--saves", o.saves,
                 "measured saves after the first, in each round")
      ->check(CLI::Range(1, 100));
  app.add_option("--repeat", o.repeat,
                 "rounds: each figure measured next to its limit this many "
                 "times; medians and "
                 "spreads (min-max) are reported")
      ->check(CLI::Range(1, 100));
  app.add_option("--copy-threads", o.copy_threads,
                 "client copy threads (0 = online CPUs)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--root", o.root,
                 "directory on the disk to measure (default /var/tmp)");
  app.add_option("--ckptd", o.ckptd,
                 "ckptd binary (default ../daemon/ckptd next to this one)");
  app.add_flag("--keep", o.keep,
               "leave the run's directory (checkpoints, daemon log) behind");
  app.add_flag("--json", o.json, "print one JSON object");
  app.add_option(
      "--object-url", o.object_url,
      "also measure the object tier on s3://BUCKET/PREFIX (AWS_* environment)");
  app.add_option("--object-store-pid", o.object_store_pid,
                 "the object store's process on this machine (a loopback "
                 "server): its CPU time is reported beside ours")
      ->check(CLI::Range(0, 1 << 30));
  std::string reshard;
  app.add_option("--reshard", reshard,
                 "N:M: only the resharding figures: N ranks save --bytes "
                 "row-sharded, M ranks restore (reshard_restore_s) against N "
                 "ranks (same_layout_restore_s), from memory and disk");
  CLI11_PARSE(app, argc, argv);
  if (!reshard.empty()) {
    int n = 0, m = 0;
    char end = 0;
    if (std::sscanf(reshard.c_str(), "%d:%d%c", &n, &m, &end) != 2 || n < 1 ||
        m < 1 || n > 4096 || m > 4096) {
      std::fprintf(stderr, "ckpt_bench: --reshard: \"%s\" is not N:M\n",
                   reshard.c_str());
      return 2;
    }
    std::string out;
    absl::Status rs = ckpt::bench::RunReshardBench(o, n, m, &out);
    if (!out.empty()) std::printf("%s\n", out.c_str());
    if (!rs.ok()) {
      std::fprintf(stderr, "ckpt_bench: %s\n",
                   std::string(rs.message()).c_str());
      return 1;
    }
    return 0;
  }

  ckpt::bench::Results r;
  absl::Status s;
  s = ckpt::bench::RunBench(o, &r);
  if (!s.ok()) {
    std::fprintf(stderr, "ckpt_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("%s\n", (o.json ? ckpt::bench::FormatJson(r)
                              : ckpt::bench::FormatTable(r))
                          .c_str());
  return 0;
}
