// LinkShaper: recovery_bench's --link-gbit. On one machine the "network"
// between nodes is the loopback, which runs at memory speed; this makes
// the bench's own traffic cross a link of a stated rate instead, and only
// its own: an htb qdisc at lo's root, which sends unclassified traffic on
// unshaped (no default class), plus u32 filters that send packets whose
// source or destination port lies in one aligned block of 16 ports (the
// bench's listeners: the plain TCP limit and every node's replica
// listener) to one htb class at the rate. (The prio + tbf pair does the
// same where the kernel has sch_prio; this VM's has not.)
// The block lies below the kernel's ephemeral range, so no other process's
// connection matches it by chance. The qdisc is removed by the destructor
// (and at exit, and on SIGINT/SIGTERM); one left behind by a SIGKILLed
// bench is found by its handle and removed at the next start.
// Needs root (CAP_NET_ADMIN) and tc; when either is missing, or lo already
// has someone else's root qdisc, Start() says why and shapes nothing.
// Not thread-safe: one per process.
#ifndef CKPT_BENCH_LINK_SHAPER_H_
#define CKPT_BENCH_LINK_SHAPER_H_

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::bench {

// An aligned block of 16 loopback ports in [20000, 32768), each free now
// (bind succeeds); `want` > 0 asks for that block (must be aligned).
[[nodiscard]] absl::StatusOr<int> FreePortBlock(int want = 0);

class LinkShaper {
 public:
  LinkShaper() = default;
  LinkShaper(const LinkShaper&) = delete;
  LinkShaper& operator=(const LinkShaper&) = delete;
  ~LinkShaper();

  // Shapes ports [port_base, port_base + 16) on lo to `gbit` Gbit/s.
  // FailedPrecondition (with the reason) when shaping is not permitted.
  [[nodiscard]] absl::Status Start(int port_base, double gbit);
  // Removes the qdisc; idempotent.
  void Stop();
  bool active() const { return active_; }

 private:
  bool active_ = false;
};

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_LINK_SHAPER_H_
