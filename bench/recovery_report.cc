#include "bench/recovery_report.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/stats.h"

namespace ckpt::bench {
namespace {

template <typename T, typename F>
double MedianOf(const std::vector<T>& rounds, F field) {
  std::vector<double> v;
  for (const auto& r : rounds) v.push_back(static_cast<double>(field(r)));
  return Median(v);
}

template <typename T, typename F>
std::string Each(const std::vector<T>& rounds, F field, int digits) {
  std::vector<std::string> v;
  for (const auto& r : rounds)
    v.push_back(absl::StrFormat("%.*f", digits, static_cast<double>(field(r))));
  return absl::StrJoin(v, " ");
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// The medians of one path's rounds.
struct Path {
  double detect_s = 0, plan_s = 0, prefetch_s = 0, restart_s = 0, restore_s = 0,
         recovery_s = 0;
  double survivors_s = 0, lost_ranks_s = 0;
  double limit_s = 0, steps_lost = 0, restore_step = 0,
         coordinator_steps_lost = 0;
  std::string restore_from;
};

Path Summarize(const std::vector<NodeLossFigures>& r) {
  Path p;
  p.detect_s = MedianOf(r, [](auto& f) { return f.detect_s; });
  p.plan_s = MedianOf(r, [](auto& f) { return f.plan_s; });
  p.prefetch_s = MedianOf(r, [](auto& f) { return f.prefetch_s; });
  p.restart_s = MedianOf(r, [](auto& f) { return f.restart_s; });
  p.restore_s = MedianOf(r, [](auto& f) { return f.restore_s; });
  p.recovery_s = MedianOf(r, [](auto& f) { return f.recovery_s; });
  p.survivors_s = MedianOf(r, [](auto& f) { return f.survivors_s; });
  p.lost_ranks_s = MedianOf(r, [](auto& f) { return f.lost_ranks_s; });
  p.limit_s = MedianOf(r, [](auto& f) { return f.limit_s; });
  p.steps_lost = MedianOf(r, [](auto& f) { return f.steps_lost; });
  p.restore_step = MedianOf(r, [](auto& f) { return f.restore_step; });
  p.coordinator_steps_lost =
      MedianOf(r, [](auto& f) { return f.coordinator_steps_lost; });
  for (const auto& f : r)
    p.restore_from = p.restore_from.empty() || p.restore_from == f.restore_from
                         ? f.restore_from
                         : "mixed";
  return p;
}

std::vector<CrashFigures> Crashes(const RecoveryRun& run) {
  std::vector<CrashFigures> out;
  for (const auto* side : {&run.storage, &run.peer})
    for (const auto& f : *side)
      if (f.crash) out.push_back(*f.crash);
  return out;
}

}  // namespace

std::string RecoveryJson(const RecoveryRun& run) {
  const Path peer = Summarize(run.peer), storage = Summarize(run.storage);
  const Path& primary = run.primary_replicas ? peer : storage;
  const auto crashes = Crashes(run);
  auto crash = [&](auto field) { return MedianOf(crashes, field); };
  const double crash_restore_s = crash([](auto& c) { return c.restore_s; });
  const double memcpy_s = crash([](auto& c) { return c.memcpy_s; });
  const double all_s = crash([](auto& c) { return c.all_restore_s; });
  const double memcpy_all_s = crash([](auto& c) { return c.memcpy_all_s; });
  const double off = MedianOf(run.step_off, [](auto& f) { return f.step_s; });
  const double on = MedianOf(run.step_on, [](auto& f) { return f.step_s; });
  std::string j = "{";
  auto num = [&](const char* key, double v, int digits = 3) {
    absl::StrAppend(&j, j.size() > 1 ? "," : "", "\"", key,
                    "\":", absl::StrFormat("%.*f", digits, v));
  };
  auto str = [&](const char* key, const std::string& v) {
    absl::StrAppend(&j, ",\"", key, "\":\"", v, "\"");
  };
  auto boolean = [&](const char* key, bool v) {
    absl::StrAppend(&j, ",\"", key, "\":", v ? "true" : "false");
  };
  // The keys of the single-path bench first (scripts read them): the
  // breakdown is the storage path's, or the peer path's with --replicas.
  num("bytes_per_rank", static_cast<double>(run.bytes_per_rank), 0);
  num("detect_s", primary.detect_s);
  num("plan_s", primary.plan_s);
  num("prefetch_s", primary.prefetch_s);
  num("trainer_restart_s", primary.restart_s);
  num("restore_s", primary.restore_s);
  num("node_recovery_s", primary.recovery_s);
  num("raw_read_lost_shards_s", storage.limit_s);
  num("node_recovery_ratio", Ratio(primary.recovery_s, storage.limit_s));
  num("crash_restore_s", crash_restore_s, 4);
  num("crash_process_start_to_restored_s",
      crash([](auto& c) { return c.process_s; }), 4);
  num("memcpy_rank_state_s", memcpy_s, 4);
  num("crash_restore_ratio", Ratio(crash_restore_s, memcpy_s));
  num("crash_all_ranks_restore_s", all_s, 4);
  num("memcpy_all_ranks_s", memcpy_all_s, 4);
  num("crash_all_ratio", Ratio(all_s, memcpy_all_s));
  num("restore_step", primary.restore_step, 0);
  str("shared_root", run.shared_root);
  num("progress_ns", run.progress_ns, 2);
  boolean("replicas", run.primary_replicas);
  str("restore_from", primary.restore_from);
  num("raw_transfer_s", peer.limit_s);
  num("node_recovery_transfer_ratio", Ratio(primary.recovery_s, peer.limit_s));
  // Both node-loss paths, their limits, steps lost and the step overhead.
  num("node_loss_peer_s", peer.recovery_s);
  num("node_loss_peer_ratio", Ratio(peer.recovery_s, peer.limit_s));
  num("node_loss_storage_s", storage.recovery_s);
  num("raw_read_s", storage.limit_s);
  num("node_loss_storage_ratio", Ratio(storage.recovery_s, storage.limit_s));
  num("survivors_restored_peer_s", peer.survivors_s);
  num("lost_ranks_restored_peer_s", peer.lost_ranks_s);
  num("survivors_restored_storage_s", storage.survivors_s);
  num("lost_ranks_restored_storage_s", storage.lost_ranks_s);
  num("prefetch_peer_s", peer.prefetch_s);
  num("prefetch_storage_s", storage.prefetch_s);
  num("steps_lost_node_peer", peer.steps_lost, 1);
  num("steps_lost_node_storage", storage.steps_lost, 1);
  num("steps_lost_trainer_crash", crash([](auto& c) { return c.steps_lost; }),
      1);
  num("restore_step_peer", peer.restore_step, 1);
  num("restore_step_storage", storage.restore_step, 1);
  str("restore_from_peer", peer.restore_from);
  str("restore_from_storage", storage.restore_from);
  num("step_s_replication_off", off, 4);
  num("step_s_replication_on", on, 4);
  num("step_speed_on_vs_off", Ratio(off, on));  // target >= 0.97
  num("worker_state_bytes",
      MedianOf(run.step_on, [](auto& f) { return f.state_bytes; }), 0);
  num("worker_replicated_ranks_on",
      MedianOf(run.step_on, [](auto& f) { return f.replicated_ranks; }), 0);
  num("rounds", run.rounds, 0);
  num("link_gbit", run.link_gbit, 2);
  boolean("link_shaped", run.link_shaped);
  str("link_note", run.link_note);
  num("storage_gbit", run.storage_gbit, 2);
  boolean("storage_throttled", run.storage_throttled);
  str("storage_note", run.storage_note);
  str("shm_huge_pages", run.shm_huge_pages);
  absl::StrAppend(&j, ",",
                  RestartJsonFields(run.restart_warm, run.restart_cold,
                                    run.heartbeat_timeout_ms));
  // The resharding figures in an object of their own: its plan_s is the
  // load planner's, not the coordinator's plan above.
  if (run.reshard_measured)
    absl::StrAppend(&j, ",\"reshard\":{", ReshardJsonFields(run.reshard), "}");
  j += "}\n";
  return j;
}

std::string RecoveryText(const RecoveryRun& run) {
  const Path peer = Summarize(run.peer), storage = Summarize(run.storage);
  std::string t = absl::StrFormat(
      "recovery_bench: 2 nodes x 2 ranks x %.2f GiB + 1 spare, heartbeat "
      "timeout %d ms, %d rounds of each path (alternated), medians\n",
      run.bytes_per_rank / double(1 << 30), run.heartbeat_timeout_ms,
      run.rounds);
  absl::StrAppend(
      &t,
      absl::StrFormat("link: %s\n",
                      run.link_shaped
                          ? absl::StrFormat("the bench's ports [%d, %d) on lo "
                                            "shaped to %.2f Gbit/s (tc htb)",
                                            run.port_base, run.port_base + 16,
                                            run.link_gbit)
                      : run.link_gbit > 0
                          ? "NOT shaped: " + run.link_note
                          : std::string("loopback, unshaped (memory speed)")));
  absl::StrAppend(
      &t, "storage: ",
      run.storage_throttled
          ? absl::StrFormat("reads of the shared root's %s capped at %.2f "
                            "Gbit/s (block cgroup)",
                            run.storage_note, run.storage_gbit)
      : run.storage_gbit > 0 ? "NOT throttled: " + run.storage_note
                             : std::string("the local disk, uncapped"),
      "\n");
  absl::StrAppend(&t, "/dev/shm huge pages: ", run.shm_huge_pages, "\n");
  absl::StrAppend(&t, absl::StrFormat("progress beacon: %.2f ns a call "
                                      "(target <= 100 ns)\n",
                                      run.progress_ns));
  auto path = [&](const char* name, const Path& p,
                  const std::vector<NodeLossFigures>& r, const char* limit) {
    absl::StrAppend(
        &t, absl::StrFormat("node loss, %s (restored step %.0f, from %s):\n",
                            name, p.restore_step,
                            p.restore_from.empty() ? "-" : p.restore_from));
    const std::pair<const char*, double> rows[] = {
        {"detection (kill -> failure detected)", p.detect_s},
        {"plan (-> plan made)", p.plan_s},
        {"prefetch into the spare (-> plan acked)", p.prefetch_s},
        {"trainer restart (-> first start, from ack)", p.restart_s},
        {"restore (first start -> last restored)", p.restore_s},
        {"detected -> survivors (0,1) restored", p.survivors_s},
        {"detected -> lost ranks (2,3) restored", p.lost_ranks_s},
        {"detected -> all restored", p.recovery_s},
        {limit, p.limit_s}};
    for (const auto& [what, v] : rows)
      absl::StrAppend(&t, absl::StrFormat("  %-44s %8.3f s\n", what, v));
    absl::StrAppend(
        &t, absl::StrFormat(
                "  ratio %.2f (target <= 1.5): %s; rounds: %s s\n",
                Ratio(p.recovery_s, p.limit_s),
                Ratio(p.recovery_s, p.limit_s) <= 1.5 ? "met" : "NOT met",
                Each(
                    r, [](auto& f) { return f.recovery_s; }, 2)));
    std::vector<std::string> from;
    for (const auto& f : r) from.push_back(f.restore_from);
    absl::StrAppend(
        &t,
        absl::StrFormat("  steps lost %.1f (coordinator: %.1f); rounds: %s; "
                        "lost ranks from: %s\n",
                        p.steps_lost, p.coordinator_steps_lost,
                        Each(
                            r, [](auto& f) { return f.steps_lost; }, 0),
                        absl::StrJoin(from, " ")));
  };
  path("from peers' memory", peer, run.peer, "plain TCP of the lost bytes");
  path("from storage (replicas off)", storage, run.storage,
       run.shared_root == "directory" ? "raw O_DIRECT read of the lost shards"
                                      : "raw parallel GET of the lost shards");
  const auto crashes = Crashes(run);
  auto crash = [&](auto field) { return MedianOf(crashes, field); };
  const double restore_s = crash([](auto& c) { return c.restore_s; });
  const double memcpy_s = crash([](auto& c) { return c.memcpy_s; });
  const double all_s = crash([](auto& c) { return c.all_restore_s; });
  const double memcpy_all_s = crash([](auto& c) { return c.memcpy_all_s; });
  absl::StrAppend(
      &t, "trainer crash (node alive):\n",
      absl::StrFormat("  %-44s %8.4f s\n", "restore of rank 0 from memory",
                      restore_s),
      absl::StrFormat("  %-44s %8.4f s\n", "memcpy of the rank's state",
                      memcpy_s),
      absl::StrFormat("  %-44s %8.4f s\n", "process start -> restored",
                      crash([](auto& c) { return c.process_s; })),
      absl::StrFormat("  ratio %.2f (target <= 1.2, plus process start)\n",
                      Ratio(restore_s, memcpy_s)),
      absl::StrFormat("  all 4 ranks at once: slowest %.4f s vs 4 memcpys "
                      "at once %.4f s: ratio %.2f\n",
                      all_s, memcpy_all_s, Ratio(all_s, memcpy_all_s)),
      absl::StrFormat("  steps lost %.1f (target: node loss from peers the "
                      "same)\n",
                      crash([](auto& c) { return c.steps_lost; })));
  const double off = MedianOf(run.step_off, [](auto& f) { return f.step_s; });
  const double on = MedianOf(run.step_on, [](auto& f) { return f.step_s; });
  if (!run.step_off.empty())
    absl::StrAppend(
        &t,
        absl::StrFormat(
            "training step (ckpt-worker, 2 ranks, a save every step, %.1f MiB "
            "a rank):\n",
            MedianOf(run.step_on, [](auto& f) { return f.state_bytes; }) /
                double(1 << 20)),
        absl::StrFormat(
            "  replication off %8.4f s, on %8.4f s (replicated "
            "ranks at the end: %.0f)\n",
            off, on,
            MedianOf(run.step_on, [](auto& f) { return f.replicated_ranks; })),
        absl::StrFormat("  speed on/off = off/on = %.3f (target >= 0.97): %s; "
                        "rounds off: %s, on: %s\n",
                        Ratio(off, on),
                        Ratio(off, on) >= 0.97 ? "met" : "NOT met",
                        Each(
                            run.step_off, [](auto& f) { return f.step_s; }, 4),
                        Each(
                            run.step_on, [](auto& f) { return f.step_s; }, 4)));
  absl::StrAppend(&t, RestartText(run.restart_warm, run.restart_cold,
                                  run.heartbeat_timeout_ms));
  if (run.reshard_measured)
    absl::StrAppend(&t, "\nresharding (a restore into another layout):\n",
                    ReshardText(run.reshard), "\n");
  return t;
}

}  // namespace ckpt::bench
