// The figures one ckpt_bench run measured, and their presentation: a table
// (figure, the limit it is compared with, ratio, target, verdict) or one
// JSON object. Pure functions of the Results; not thread-safe.
#ifndef CKPT_BENCH_REPORT_H_
#define CKPT_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::bench {

// ckpt_bench --object-url (bench/object_tier_bench.h).
struct ObjectFigures {
  bool measured = false;
  std::string url;
  uint64_t part_size = 0;
  unsigned concurrency = 0;
  double upload_s = 0;  // medians
  double raw_put_s = 0;
  double restore_object_s = 0;
  double raw_get_s = 0;       // into memory backed as the arenas are
  double raw_get_anon_s = 0;  // the same into 2 MiB anonymous pages
  // The same into memory created for it, as a restarted ckptd's arena is:
  // the mapping and every page's first fault (zeroing) are timed too.
  double raw_get_fresh_s = 0;
  double save_stall_upload_s = 0;
  double memcpy_s = 0;
  int saves_during_upload =
      0;  // samples whose upload was still in flight when the save ended
  bool restore_matches = false;
  // Where a restore's CPU goes against a raw GET's (medians): CPU seconds
  // (user + system, /proc/PID/stat) of the daemon, of this process (the
  // client's copy; the raw GET's threads) and of the store (only with
  // ObjectTierConfig::store_pid), and the minor faults of each of ours.
  double restore_cpu_daemon_s = 0;
  double restore_cpu_client_s = 0;
  double restore_cpu_store_s = 0;
  double raw_get_cpu_s = 0;  // this process, the GET into the slot-like pages
  double raw_get_cpu_store_s = 0;
  double raw_get_fresh_cpu_s = 0;  // this process, the GET into fresh memory
  double restore_faults_daemon = 0;
  double restore_faults_client = 0;
  double raw_get_faults = 0;
  double raw_get_fresh_faults = 0;
};

// The smallest and largest of a figure's samples.
struct Spread {
  double min = 0;
  double max = 0;
  int samples = 0;
};

struct Results {
  uint64_t bytes = 0;        // tensor bytes saved per step
  uint64_t image_bytes = 0;  // shard image written per step
  int tensors = 0;
  int copy_threads = 0;
  int saves = 0;   // measured saves (after the first) per round
  int repeat = 1;  // rounds; every *_s figure below is a median
  std::string root;
  std::string backend;  // the daemon's storage backend
  std::string checksum_impl;
  std::string shm_huge_pages;  // shm::ShmHugePagesOf("/dev/shm")

  double first_save_s = 0;
  double save_stall_s = 0;  // median Client::Save
  double save_copy_s = 0;   // of which copy + checksum (median)
  double memcpy_s = 0;
  double sync_write_s = 0;
  double persist_s = 0;         // median commit -> durable
  double raw_write_s = 0;       // from memory backed as the arenas are
  double raw_write_anon_s = 0;  // the same from 2 MiB anonymous pages
  double restore_shm_s = 0;
  double restore_disk_s = 0;
  double restore_disk_warm_s = 0;  // from disk into an arena that exists
  double raw_read_s = 0;
  bool restore_matches = false;  // restored bytes equal the saved ones
  // Each median's spread, keyed by its JSON name ("save_stall_s", ...).
  std::vector<std::pair<std::string, Spread>> spreads;
  ObjectFigures object;
};

struct Check {
  const char* name;
  const char* figure;
  double figure_s;
  const char* limit;
  double limit_s;
  double ratio;        // as the target states it
  const char* target;  // e.g. "<= 1.15"
  bool met;
};

// The targets of ckptd, evaluated on r.
std::vector<Check> Evaluate(const Results& r);
std::string FormatJson(const Results& r);
std::string FormatTable(const Results& r);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_REPORT_H_
