// The coordinator's judgement of node health: which
// node may take ranks, from the health reports nodes send with their
// registration (daemon/health/health.h runs the checks).
//
// A node is unhealthy when its own report has a failed check, or when one
// of its bandwidth figures (memcpy, cuda, and network: the pairwise check
// of net_check.h) is below min_ratio x the median
// of that figure over the alive nodes that reported it (at least two: one
// node has nothing to be compared with). Storage probe figures are not
// compared: one fsync's latency says too little about a disk. A node that
// reported nothing is healthy (a ckptd that predates health checks).
// Functions only; thread-safe.
#ifndef CKPT_COORDINATOR_HEALTH_STATE_H_
#define CKPT_COORDINATOR_HEALTH_STATE_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "coordinator.pb.h"

namespace ckpt::coordinator {

namespace v1 = ::ckpt::coord::v1;

// What a report may hold: at most kMaxHealthChecks checks, names and units
// printable (at most 64 bytes), reasons printable (at most 512), figures
// and seconds finite and not negative. A refusal names the field.
inline constexpr int kMaxHealthChecks = 32;
[[nodiscard]] absl::Status ValidateHealthReport(
    const v1::NodeHealthReport& report, std::string_view field);
// One check of it (`field` names it, e.g. "check").
[[nodiscard]] absl::Status ValidateHealthCheck(const v1::HealthCheck& check,
                                               std::string_view field);

// The checks whose figures are compared against the cluster's median.
bool ComparedAgainstMedian(std::string_view check);

// Per compared check, the median of its figure over `reports` (the passed,
// not skipped checks with a figure above 0); checks reported by fewer than
// two nodes have none.
std::map<std::string, double> MedianFigures(
    const std::vector<const v1::NodeHealthReport*>& reports);

// The cluster's medians (MedianFigures over the alive nodes' reports),
// kept between judgements. A registration used to take them again and
// re-judge every node: O(N) per registration, O(N^2) for a storm of N
// (a coordinator failover, a partition healed, a cluster's start). They
// are exact while the cluster is small (at most kExactNodes reports: any
// change takes them again); beyond, one node moves a median of thousands
// by at most one place, so they are taken again (and every node judged
// again) once the changes reach 1/kDrift of the reports they were taken
// from: O(log N) amortised per change.
class ClusterMedians {
 public:
  static constexpr size_t kExactNodes = 64;
  static constexpr size_t kDrift = 16;

  // An alive node's report changed, or a node joined or died.
  void Changed() { ++changes_; }
  // Whether the medians must be taken again before a judgement.
  bool Stale() const {
    return changes_ > 0 &&
           (basis_ <= kExactNodes || changes_ * kDrift >= basis_);
  }
  void Take(const std::vector<const v1::NodeHealthReport*>& reports) {
    medians_ = MedianFigures(reports);
    basis_ = reports.size();
    changes_ = 0;
  }
  const std::map<std::string, double>& medians() const { return medians_; }

 private:
  std::map<std::string, double> medians_;
  size_t basis_ = 0;    // reports the medians were taken from
  size_t changes_ = 1;  // since; none taken yet: stale
};

struct HealthVerdict {
  bool healthy = true;
  std::string check;   // the first check that made it unhealthy
  std::string reason;  // why, with the figures
};
HealthVerdict JudgeHealth(const v1::NodeHealthReport& report,
                          const std::map<std::string, double>& medians,
                          double min_ratio);

// Whether `check` of `report` is a figure the node measured itself (memcpy,
// CUDA: not the coordinator's network round) that passed on its own, so a
// verdict against it rests on that one low figure.
bool LowOwnFigure(const v1::NodeHealthReport& report, std::string_view check);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_HEALTH_STATE_H_
