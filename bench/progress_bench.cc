// progress_bench: what Client::Progress costs a trainer (target: <= 100 ns
// a call), beside the limit, a plain atomic store.
//   progress_bench [--dir DIR] [--json]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/progress_cost.h"
#include "tests/temp_dir.h"
#include "util/program.h"

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "progress_bench", CKPT_VERSION))
    return 0;
  if (ckpt::PrintedHelp(argc, argv,
                        "usage: progress_bench [--dir DIR] [--json]"))
    return 0;
  bool json = false;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: progress_bench [--dir DIR] [--json]\n");
      return 2;
    }
  }
  ckpt::testing::TempDir tmp;
  auto cost = ckpt::bench::MeasureProgressCost(dir.empty() ? tmp.path() : dir);
  if (!cost.ok()) {
    std::fprintf(stderr, "progress_bench: %s\n",
                 std::string(cost.status().message()).c_str());
    return 1;
  }
  if (json) {
    std::printf(
        "{\"progress_ns\":%.2f,\"progress_compute_ns\":%.2f,"
        "\"progress_c_api_ns\":%.2f,\"atomic_store_ns\":%.2f}\n",
        cost->progress_ns, cost->progress_compute_ns, cost->c_api_ns,
        cost->store_ns);
    return 0;
  }
  std::printf("Client::Progress(step)            %7.2f ns\n",
              cost->progress_ns);
  std::printf("Client::Progress(step, compute)   %7.2f ns\n",
              cost->progress_compute_ns);
  std::printf("ckpt_progress                     %7.2f ns\n", cost->c_api_ns);
  std::printf("atomic release store (the limit)  %7.2f ns\n", cost->store_ns);
  std::printf("target <= 100 ns: %s\n",
              cost->progress_ns <= 100 ? "met" : "NOT met");
  return 0;
}
