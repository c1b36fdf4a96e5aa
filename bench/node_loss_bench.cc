#include "bench/node_loss_bench.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cluster_events.h"
#include "bench/huge_buffer.h"
#include "bench/object_raw.h"
#include "bench/raw_io.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "tests/cluster_harness.h"
#include "tests/harness.h"
#include "util/status.h"

namespace ckpt::bench {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using ckpt::testing::Cluster;
using ckpt::testing::ClusterOptions;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct Restart {
  long long start_ms = 0;
  long long restored_ms = 0;
  double restore_s = 0;
  double process_s = 0;
  double connect_s = 0;  // before the restore call: Client::Connect
  double alloc_s = 0;    // and the trainer's own state, allocated and zeroed
  uint64_t step = 0;
};

// The rank's first trainer start after `after_ms` and its restore.
std::optional<Restart> RestartAfter(const Cluster& c, uint32_t rank,
                                    long long after_ms) {
  Restart r;
  bool started = false;
  for (const auto& l : c.TrainerLog(rank)) {
    if (l.kind == "start" && !started &&
        std::stoll(l.fields.at("mono_ms")) >= after_ms) {
      started = true;
      r.start_ms = std::stoll(l.fields.at("mono_ms"));
    } else if (l.kind == "restored" && started) {
      r.restored_ms = std::stoll(l.fields.at("mono_ms"));
      r.restore_s = std::stod(l.fields.at("seconds"));
      r.process_s = std::stod(l.fields.at("process_start_to_restored"));
      if (l.fields.count("connect"))
        r.connect_s = std::stod(l.fields.at("connect"));
      if (l.fields.count("alloc")) r.alloc_s = std::stod(l.fields.at("alloc"));
      r.step = std::stoull(l.fields.at("step"));
      return r;
    }
  }
  return std::nullopt;
}

// The newest step the rank logged as saved (staged), over its whole log.
uint64_t NewestSaved(const Cluster& c, uint32_t rank) {
  uint64_t newest = 0;
  for (const auto& l : c.TrainerLog(rank))
    if (l.kind == "saved")
      newest = std::max<uint64_t>(newest, std::stoull(l.fields.at("step")));
  return newest;
}

// Whether the rank's log, after its last start, says it saved `step` (or
// finished at it: a restore of the last step saves nothing more).
bool StagedSinceStart(const Cluster& c, uint32_t rank, uint64_t step) {
  bool staged = false;
  for (const auto& l : c.TrainerLog(rank)) {
    if (l.kind == "start") staged = false;
    if ((l.kind == "saved" || l.kind == "done") &&
        std::stoull(l.fields.at("step")) >= step)
      staged = true;
  }
  return staged;
}

// Waits until every rank staged `step` (since its last start) and the
// job's good step is at least `good`.
absl::Status WaitStaged(const Cluster& c, uint32_t world, uint64_t step,
                        uint64_t good, const char* what) {
  auto last_good = [&]() -> uint64_t {
    auto j = c.Job();
    return j && j->has_last_good() ? j->last_good_step() : 0;
  };
  if (Cluster::WaitUntil(
          [&] {
            for (uint32_t r = 0; r < world; ++r)
              if (!StagedSinceStart(c, r, step)) return false;
            return last_good() >= good;
          },
          seconds(300)))
    return absl::OkStatus();
  return Failed(absl::StrCat(what, ": the job never staged step ", step,
                             " everywhere with step ", good, " good"),
                c);
}

// Bytes of rank r's shard written by node b: the restore step's file, or
// (a step only in memory) the newest older one of the same tensors.
absl::StatusOr<std::string> LostShardFile(storage::Backend& shared,
                                          const std::string& job, uint64_t step,
                                          uint32_t rank) {
  for (uint64_t s = step; s >= 1; --s) {
    auto path = shared.LocalPath(storage::ShardKey(job, s, rank, "b"));
    std::error_code ec;
    if (path && std::filesystem::exists(*path, ec)) return *path;
  }
  return absl::NotFoundError(
      absl::StrCat("no shard file of rank ", rank, " from node b"));
}

absl::Status MeasureLimit(const NodeLossOptions& o, const Cluster& c,
                          NodeLossFigures& f) {
  if (!o.object_url.empty()) {
    auto so = storage::ResolveObjectStoreOptions(o.object_url, {});
    if (!so.ok()) return so.status();
    auto store = storage::NewObjectBackend(*so);
    if (!store.ok()) return store.status();
    for (uint32_t r : {2u, 3u}) {
      std::string key = storage::ShardKey("job", f.restore_step, r, "b");
      auto size = (*store)->ObjectSize(key);
      if (!size.ok()) return size.status();
      CKPT_ASSIGN_OR_RETURN(HugeBuffer buf, HugeBuffer::Make(*size, 1));
      f.lost_bytes = *size;
      if (o.replicas) {
        CKPT_ASSIGN_OR_RETURN(HugeBuffer sink, HugeBuffer::Make(*size, 1));
        auto t =
            RawTcpTransfer(buf.data(), buf.size(), sink.data(), o.port_base);
        if (!t.ok()) return t.status();
        f.limit_s += *t;
        continue;
      }
      auto t = RawObjectGet(*so, key, buf.data(), buf.size());
      if (!t.ok()) return t.status();
      f.limit_s += *t;
    }
    return absl::OkStatus();
  }
  storage::LocalBackendOptions shared_opts;
  shared_opts.root = o.object_url.empty() ? c.shared_root() : o.dir + "/unused";
  shared_opts.remove_tmp_files = false;  // only paths are looked up
  auto shared = storage::NewLocalBackend(shared_opts);
  if (!shared.ok()) return shared.status();
  std::vector<std::string> files;
  uint64_t bytes = 0;
  for (uint32_t r : {2u, 3u}) {
    auto path = LostShardFile(**shared, "job", f.restore_step, r);
    if (!path.ok()) return path.status();
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(*path, ec);
    if (ec) return absl::InternalError(*path + ": " + ec.message());
    files.push_back(*path);
    bytes = std::max(bytes, size);
  }
  bytes &= ~uint64_t{4095};
  f.lost_bytes = bytes;
  // 2 MiB-aligned, so 4096-aligned for O_DIRECT too.
  CKPT_ASSIGN_OR_RETURN(HugeBuffer buf, HugeBuffer::Make(bytes));
  if (o.replicas) {
    CKPT_ASSIGN_OR_RETURN(HugeBuffer sink, HugeBuffer::Make(bytes, 1));
    for (size_t i = 0; i < files.size(); ++i) {
      auto t = RawTcpTransfer(buf.data(), bytes, sink.data(), o.port_base);
      if (!t.ok()) return t.status();
      f.limit_s += *t;
    }
    return absl::OkStatus();
  }
  for (const auto& file : files) {
    // A cache that cannot be dropped only makes the limit faster.
    (void)DropFileCache(file);
    auto t = RawRead(file, buf.data(), bytes, {});
    if (!t.ok()) return t.status();
    f.limit_s += *t;
  }
  return absl::OkStatus();
}

absl::StatusOr<CrashFigures> MeasureCrash(const NodeLossOptions& o,
                                          Cluster& c) {
  CrashFigures f;
  // One interval after the job staged its last step again, and with the
  // heartbeats of the recovery settled.
  CKPT_RETURN_IF_ERROR(WaitStaged(c, 4, o.last_step, 0, "before the crash"));
  std::this_thread::sleep_for(milliseconds(std::max(o.step_ms, 2000)));
  for (uint32_t r = 0; r < 4; ++r)
    f.reached_step = std::max(f.reached_step, NewestSaved(c, r));
  f.reached_step = std::max(f.reached_step, o.last_step);
  const long long crash_ms = MonoMs();
  const pid_t victim = c.TrainerPid(0);
  if (victim <= 0 || kill(victim, SIGKILL) != 0)
    return Failed("cannot kill rank 0's trainer", c);
  std::optional<Restart> crash;
  if (!Cluster::WaitUntil(
          [&] { return (crash = RestartAfter(c, 0, crash_ms)).has_value(); },
          seconds(120)))
    return Failed("rank 0 did not restore after its crash", c);
  f.restore_s = crash->restore_s;
  f.process_s = crash->process_s;
  f.restore_step = crash->step;
  f.steps_lost = f.reached_step - std::min(f.reached_step, crash->step);
  auto state = testing::MakeState(o.bytes_per_rank, 8, 1);
  absl::StatusOr<HugeBuffer> dst = HugeBuffer::Make(state.bytes(), 1);
  if (!dst.ok()) return dst.status();
  f.memcpy_s = 1e9;
  for (int i = 0; i < 3; ++i)
    f.memcpy_s =
        std::min(f.memcpy_s, ParallelMemcpy(dst->data(), state.tensors, 2));
  // Every rank restarts after a crash (they roll back together), and on
  // this one machine the four share its cores: the limit for that is four
  // rank-sized memcpys at once.
  std::vector<HugeBuffer> dsts;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<HugeBuffer> d = HugeBuffer::Make(state.bytes(), 1);
    if (!d.ok()) return d.status();
    dsts.push_back(std::move(*d));
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> copiers;
  for (auto& d : dsts)
    copiers.emplace_back(
        [&, p = d.data()] { ParallelMemcpy(p, state.tensors, 2); });
  for (auto& t : copiers) t.join();
  f.memcpy_all_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  Cluster::WaitUntil(
      [&] {
        for (uint32_t r = 0; r < 4; ++r)
          if (!RestartAfter(c, r, crash_ms)) return false;
        return true;
      },
      seconds(60));
  for (uint32_t r = 0; r < 4; ++r)
    if (auto rs = RestartAfter(c, r, crash_ms))
      f.all_restore_s = std::max(f.all_restore_s, rs->restore_s);
  return f;
}

}  // namespace

absl::StatusOr<NodeLossFigures> RunNodeLossRound(const NodeLossOptions& o) {
  if (o.last_step < 2)
    return absl::InvalidArgumentError("last_step: at least 2");
  NodeLossFigures f;
  f.replicas = o.replicas;
  ClusterOptions co;
  co.dir = o.dir;
  co.world_size = 4;
  co.bytes_per_rank = o.bytes_per_rank;
  co.last_step = o.last_step;
  co.hold = true;
  co.step_ms = o.step_ms;
  co.heartbeat_timeout_ms = 2000;
  co.ckptd_args = {"--slots", "2"};
  co.shared_root_url = o.object_url;
  // Both paths run the same listeners; the storage path sends no copies.
  // The spare shares node b's failure domain, so b's replicas live on a
  // and the spare fetches them across the link (a spare that happened to
  // hold them would restore without any transfer). Every replica port is
  // in the bench's block, which --link-gbit shapes (ReplicaNodeArgs).
  int i = 1;
  for (const char* id : {"a", "b", "c"})
    co.node_ckptd_args[id] =
        ReplicaNodeArgs(std::string("rack-") + (id[0] == 'c' ? "b" : id),
                        o.port_base, i++, o.replicas);
  Cluster c(co);
  c.StartCoordinator();
  c.StartNode("a");
  c.StartNode("b");
  c.StartNode("c", /*spare=*/true);
  CKPT_RETURN_IF_ERROR(
      WaitStaged(c, 4, o.last_step, o.last_step - 1, "before the node loss"));
  // With replicas: the last step's copies verified on their holders and
  // known to the coordinator (as the storage path waits for a durable
  // step), else a kill that lands while b's copies are on the wire loses a
  // step and measures the race, not the recovery.
  if (o.replicas && !Cluster::WaitUntil(
                        [&] {
                          auto cluster = c.GetCluster();
                          if (!cluster) return false;
                          for (const auto& m : cluster->memory())
                            if (m.job() == "job" && m.has_replicated_step() &&
                                m.replicated_step() >= o.last_step)
                              return true;
                          return false;
                        },
                        seconds(120)))
    return Failed(absl::StrCat("step ", o.last_step,
                               " was never replicated for every rank"),
                  c);
  std::this_thread::sleep_for(milliseconds(o.step_ms));
  for (uint32_t r = 0; r < 4; ++r)
    f.reached_step = std::max(f.reached_step, NewestSaved(c, r));

  const long long kill_ms = MonoMs();
  c.KillNode("b");
  if (!Cluster::WaitUntil(
          [&] {
            for (uint32_t r = 0; r < 4; ++r)
              if (!RestartAfter(c, r, kill_ms)) return false;
            return true;
          },
          seconds(120)))
    return Failed("ranks did not restore after the node loss", c);
  // Events() gives up after 2 s, which a loaded machine can take: ask
  // again until the recovery's events are all there.
  std::vector<cv1::Event> events;
  std::optional<cv1::Event> detected, planned, acked;
  Cluster::WaitUntil(
      [&] {
        events = c.Events();
        detected = FirstEvent(events, cv1::FAILURE_DETECTED, kill_ms - 10, "b");
        if (!detected) return false;
        planned = FirstEvent(events, cv1::PLAN_MADE, detected->time_ms());
        acked = FirstEvent(events, cv1::PLAN_ACKED, detected->time_ms());
        return planned && acked;
      },
      seconds(60));
  if (!detected) return Failed("no FAILURE_DETECTED event for node b", c);
  if (!planned || !acked)
    return Failed("no PLAN_MADE / PLAN_ACKED after the failure", c);
  long long first_start = INT64_MAX, all_restored = 0;
  const long long t0 = detected->time_ms();
  f.timeline =
      absl::StrFormat("  %+7.3f s FAILURE_DETECTED b (kill at %+.3f)\n", 0.0,
                      (kill_ms - t0) / 1e3);
  for (const auto& e : events)
    if (e.time_ms() >= t0 && e.kind() != cv1::FAILURE_DETECTED)
      absl::StrAppend(
          &f.timeline,
          absl::StrFormat("  %+7.3f s %s %s %s\n", (e.time_ms() - t0) / 1e3,
                          cv1::EventKind_Name(e.kind()), e.node_id(),
                          e.detail().substr(0, 100)));
  for (uint32_t r = 0; r < 4; ++r) {
    auto rs = RestartAfter(c, r, kill_ms);
    first_start = std::min(first_start, rs->start_ms);
    all_restored = std::max(all_restored, rs->restored_ms);
    double& side = r < 2 ? f.survivors_s : f.lost_ranks_s;
    side = std::max(side, (rs->restored_ms - detected->time_ms()) / 1e3);
    f.restore_step = rs->step;
    absl::StrAppend(
        &f.timeline,
        absl::StrFormat("  %+7.3f s rank %u trainer start; restored %+.3f s "
                        "(restore call %.3f s, process start -> restored "
                        "%.3f s; before the call: connect %.3f s, its own "
                        "state allocated %.3f s)\n",
                        (rs->start_ms - t0) / 1e3, r,
                        (rs->restored_ms - t0) / 1e3, rs->restore_s,
                        rs->process_s, rs->connect_s, rs->alloc_s));
  }
  f.detect_s = (t0 - kill_ms) / 1e3;
  f.plan_s = (planned->time_ms() - t0) / 1e3;
  f.prefetch_s = (acked->time_ms() - planned->time_ms()) / 1e3;
  f.restart_s = (first_start - acked->time_ms()) / 1e3;
  f.restore_s = (all_restored - first_start) / 1e3;
  f.recovery_s = (all_restored - t0) / 1e3;
  f.steps_lost = f.reached_step - std::min(f.reached_step, f.restore_step);
  if (auto where = FirstEvent(events, cv1::RESTORE_SOURCES, t0)) {
    f.coordinator_steps_lost = where->restore().steps_lost();
    for (const auto& r : where->restore().ranks())
      if (r.rank() >= 2)  // the lost ranks
        f.restore_from = f.restore_from.empty() || f.restore_from == r.copy()
                             ? r.copy()
                             : "mixed";
  }
  // The limit on a quiet job: the restored ranks staged and persisted the
  // last step again and (peer) every rank's replica is on a live holder,
  // so no persist or re-replication shares the disk or the link with it.
  CKPT_RETURN_IF_ERROR(
      WaitStaged(c, 4, o.last_step, o.last_step, "before the limit"));
  if (o.replicas)
    Cluster::WaitUntil(
        [&] {
          auto cluster = c.GetCluster();
          if (!cluster) return false;
          for (const auto& m : cluster->memory())
            if (m.replicated_ranks() >= 4) return true;
          return false;
        },
        seconds(120));
  CKPT_RETURN_IF_ERROR(MeasureLimit(o, c, f));
  if (o.crash) {
    auto crash = MeasureCrash(o, c);
    if (!crash.ok()) return crash.status();
    f.crash = *crash;
  }
  return f;
}

}  // namespace ckpt::bench
