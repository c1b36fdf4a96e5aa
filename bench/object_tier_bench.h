// ckpt_bench's object-tier figures (--object-url s3://BUCKET/PREFIX): a
// ckptd of its own with that object tier (commit tier local) uploads the
// benchmark's state, and the figures are compared with the store's raw
// limits measured in the same run, against the same server, with the same
// part size and concurrency (bench/object_raw.h):
//   upload_s          one shard's upload (the daemon's own timing, Status'
//                     last_upload_s), vs raw_put_s: a plain multipart PUT
//                     of the same bytes;
//   restore_object_s  Client::Restore after the local file and shared
//                     memory are gone, each after a restart of its own
//                     (parallel ranged GETs into a slot, checksums, the
//                     client's copy), vs raw_get_s (a
//                     parallel ranged GET into memory backed as the
//                     arena's slot is; raw_get_anon_s into 2 MiB
//                     anonymous pages, and raw_get_fresh_s into memory
//                     mapped for it and not yet faulted in, as a
//                     restarted ckptd's arena is, beside it);
//   save_stall_upload_s  Client::Save while the previous step's upload is
//                     in flight, vs memcpy sampled beside it;
//   *_cpu_*, *_faults_*  CPU seconds and minor faults of each process
//                     (daemon, this one, the store) per restore and per
//                     raw GET: where the time goes, which load moves less
//                     than the wall time.
// Endpoint and credentials come from the AWS environment, as for ckptd.
// Not thread-safe.
#ifndef CKPT_BENCH_OBJECT_TIER_BENCH_H_
#define CKPT_BENCH_OBJECT_TIER_BENCH_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "bench/report.h"
#include "ckpt/client.h"

namespace ckpt::bench {

struct ObjectTierConfig {
  std::string url;    // s3://BUCKET/PREFIX
  std::string dir;    // the run's directory (the daemon's root goes under it)
  std::string ckptd;  // ckptd binary
  std::string shm_prefix;  // for this daemon's arenas
  int copy_threads = 0;
  int saves = 3;  // samples of each figure (restores alternate with GETs)
  // The store's process when it runs on this machine (a loopback server):
  // its CPU time is sampled beside ours. 0: not sampled.
  int store_pid = 0;
};

// tensors: the benchmark's state (contiguous from tensors[0].data);
// scratch: a buffer of at least the state's bytes holding a copy of it
// (the reference a restore is compared with; raw PUT/GET use it too).
[[nodiscard]] absl::Status MeasureObjectTier(const ObjectTierConfig& config,
                                             std::span<const Tensor> tensors,
                                             char* scratch, ObjectFigures* out);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_OBJECT_TIER_BENCH_H_
