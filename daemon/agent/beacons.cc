#include "daemon/agent/beacons.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {
namespace {

namespace cv1 = ::ckpt::coord::v1;

uint64_t MsBetween(BeaconMonitor::Clock::time_point from,
                   BeaconMonitor::Clock::time_point to) {
  if (to <= from) return 0;
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count());
}

uint32_t Clamp32(double v) {
  if (!(v > 0)) return 0;
  return v >= 4e9 ? 4'000'000'000u : static_cast<uint32_t>(std::lround(v));
}

// The q-quantile (nearest rank) of `sorted`.
double Quantile(const std::vector<double>& sorted, double q) {
  size_t i = static_cast<size_t>(std::ceil(q * sorted.size()));
  return sorted[std::clamp<size_t>(i, 1, sorted.size()) - 1];
}

}  // namespace

BeaconMonitor::BeaconMonitor(BeaconMonitorOptions options)
    : options_(std::move(options)) {}

BeaconMonitor::~BeaconMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BeaconMonitor::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void BeaconMonitor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    PollOnce(Clock::now());
    lock.lock();
    cv_.wait_for(lock, options_.poll, [&] { return stopping_; });
  }
}

void BeaconMonitor::SetHosted(
    const std::map<std::string, std::vector<uint32_t>>& hosted) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::pair<std::string, uint32_t>, Rank> next;
  for (const auto& [job, ranks] : hosted)
    for (uint32_t r : ranks) {
      auto key = std::make_pair(job, r);
      auto it = ranks_.find(key);
      next[key] = it != ranks_.end() ? std::move(it->second) : Rank{};
    }
  ranks_ = std::move(next);
}

void BeaconMonitor::PollOnce(Clock::time_point now) {
  // Opening (and checking that a mapping is still the named segment) are
  // system calls: done without the lock, which Snapshot needs.
  std::vector<std::pair<std::pair<std::string, uint32_t>,
                        std::shared_ptr<shm::BeaconView>>>
      due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, rank] : ranks_)
      if (now >= rank.next_open) {
        due.emplace_back(key, rank.view);
        rank.next_open = now + options_.reopen;
      }
  }
  for (auto& [key, view] : due) {
    if (view && view->IsCurrent()) continue;
    const std::string name = absl::StrCat("/", options_.shm_prefix, ".",
                                          key.first, ".r", key.second);
    // The arena is on hugetlbfs or, its fallback, in /dev/shm.
    auto opened =
        shm::BeaconView::Open(options_.huge_dir + name, key.first, key.second);
    if (!options_.huge_dir.empty() && absl::IsNotFound(opened.status()))
      opened = shm::BeaconView::Open(name, key.first, key.second);
    view = opened.ok() ? std::shared_ptr<shm::BeaconView>(std::move(*opened))
                       : nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, view] : due) {
    auto it = ranks_.find(key);
    if (it != ranks_.end()) it->second.view = view;
  }
  for (auto& [key, rank] : ranks_) PollRank(rank, now);
}

void BeaconMonitor::Advance(Rank& rank, Clock::time_point now, bool timed) {
  // The sample is the time between two advances the poll saw, however
  // many steps they span: what a hang deadline must cover (a trainer that
  // reports every tenth step, or only saves, advances that seldom).
  if (rank.advanced && timed) {
    rank.step_ms.push_back(
        std::chrono::duration<double, std::milli>(now - *rank.advanced)
            .count());
    while (rank.step_ms.size() > std::max<size_t>(options_.window, 1))
      rank.step_ms.pop_front();
  }
  rank.advanced = now;
  rank.pause.reset();  // a declared pause covers one step
}

void BeaconMonitor::PollRank(Rank& rank, Clock::time_point now) {
  if (!rank.view) return;
  std::optional<uint64_t> slot = rank.view->NewestSlotStep();
  std::optional<shm::BeaconSnapshot> beacon = rank.view->Read();
  if (beacon) {
    if (!rank.beacon_step) {
      // First sight: the step is known, its time is not.
      rank.advanced = now;
    } else if (beacon->step != *rank.beacon_step) {
      // Backwards: a restart restored an older step; no step time.
      const bool forward = beacon->step > *rank.beacon_step;
      if (!forward) rank.step_ms.clear();
      Advance(rank, now, forward);
    }
    rank.beacon_step = beacon->step;
    rank.compute_ns = beacon->compute_ns;
    if (rank.pause_seen && beacon->pause_count != rank.pause_count &&
        !rank.pause && beacon->pause_ms > 0)
      rank.pause = Rank::Pause{now, beacon->pause_ms, beacon->pause_reason};
    rank.pause_count = beacon->pause_count;
    rank.pause_seen = true;
  }
  if (slot && slot != rank.slot_step) {
    // A save is progress; with a beacon its step counts only as time.
    if (!rank.beacon_step) {
      if (!rank.slot_step)
        rank.advanced = now;
      else
        Advance(rank, now, *slot > *rank.slot_step);
    } else if (rank.slot_step && *slot > *rank.slot_step) {
      rank.advanced = now;
    }
    rank.slot_step = slot;
  }
}

std::vector<cv1::RankProgress> BeaconMonitor::Snapshot(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<cv1::RankProgress> out;
  for (const auto& [key, rank] : ranks_) {
    cv1::RankProgress p;
    p.set_job(key.first);
    p.set_rank(key.second);
    if (rank.beacon_step || rank.slot_step) {
      p.set_has_step(true);
      p.set_step(rank.beacon_step ? static_cast<uint64_t>(*rank.beacon_step)
                                  : *rank.slot_step);
    }
    if (rank.advanced) p.set_ms_since_advance(MsBetween(*rank.advanced, now));
    if (!rank.step_ms.empty()) {
      std::vector<double> sorted(rank.step_ms.begin(), rank.step_ms.end());
      std::sort(sorted.begin(), sorted.end());
      p.set_step_ms_p50(Clamp32(Quantile(sorted, 0.5)));
      p.set_step_ms_p99(Clamp32(Quantile(sorted, 0.99)));
      p.set_step_samples(static_cast<uint32_t>(sorted.size()));
    }
    p.set_compute_ms(Clamp32(static_cast<double>(rank.compute_ns) / 1e6));
    if (rank.pause) {
      p.set_has_pause(true);
      p.set_pause_ms(rank.pause->ms);
      p.set_ms_since_pause(MsBetween(rank.pause->at, now));
      p.set_pause_reason(rank.pause->reason);
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace ckpt::daemon
