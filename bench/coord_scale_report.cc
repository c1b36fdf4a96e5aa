// coord_scale_bench's presentation of a Result: one JSON object (the keys
// scripts rely on) or a few lines of text.
#include <algorithm>
#include <cstdio>
#include <string>

#include "bench/coord_scale_sim.h"

namespace ckpt::bench {

std::string ToJson(const Result& r) {
  char buf[8192];
  std::snprintf(
      buf, sizeof buf,
      "{\"nodes\": %d, \"ranks\": %d, \"interval_s\": %g, \"duration_s\": %g, "
      "\"steps_started\": %d, \"steps_committed\": %d, \"commit_p50_s\": %.4f, "
      "\"commit_p99_s\": %.4f, \"commit_max_s\": %.4f, \"detect_s\": %.3f, "
      "\"plan_s\": %.4f, "
      "\"plan_compute_s\": %.4f, \"plan_orders\": %d, \"false_deaths\": %d, "
      "\"heartbeat_p99_s\": %.4f, \"heartbeat_max_s\": %.4f, "
      "\"heartbeat_errors\": %llu, "
      "\"reports_per_s\": %.1f, \"rpcs_per_s\": %.1f, \"refused_retried\": "
      "%llu, "
      "\"report_errors\": %llu, \"coordinator_cpu_cores\": %.3f, "
      "\"coordinator_rss_bytes\": %llu, \"coordinator_rss_peak_bytes\": %llu, "
      "\"bench_cpu_cores\": %.3f, \"machine_cpus\": %d, \"loadavg_before\": "
      "%.2f, "
      "\"loadavg_after\": %.2f, \"registration_s\": %.2f, "
      "\"refused_register\": %llu, \"refused_heartbeat\": %llu, "
      "\"refused_report\": %llu, \"refused_register_job\": %llu, "
      "\"reregistrations\": %d, \"coordinator_cpu_total_s\": %.1f, "
      "\"wall_total_s\": %.1f, \"heartbeat_timed_out\": %llu, "
      "\"sim_late_sends\": %llu, \"sim_late_max_s\": %.2f, "
      "\"heartbeats_per_s\": %.1f, \"told_heartbeat_ms\": %d, "
      "\"coordinator_cpu_us_per_rpc\": %.1f, \"processes\": %d, "
      "\"sim_late_p99_s\": %.4f, \"sim_heartbeats\": %llu, "
      "\"sim_cpu_cores\": %.3f, \"quiet_s\": %.2f, "
      "\"quiet_heartbeats_per_s\": %.1f, "
      "\"coordinator_cpu_us_per_heartbeat\": %.1f, "
      "\"coordinator_cpu_us_per_report\": %.1f, "
      "\"report_calls_per_s\": %.1f, \"model_nodes\": %d, "
      "\"model_heartbeat_ms\": %d, \"model_coordinator_cores\": %.3f, "
      "\"relay_nodes\": %d, \"relay_gather_ms\": %d, "
      "\"relay_batches\": %llu, \"relay_heartbeats\": %llu, "
      "\"relay_reports\": %llu, \"relay_refused\": %llu}",
      r.nodes, r.ranks, r.interval_s, r.duration_s, r.steps_started,
      r.steps_committed, r.commit_p50, r.commit_p99, r.commit_max, r.detect_s,
      r.plan_s, r.plan_compute_s, r.plan_orders, r.false_deaths, r.hb_p99,
      r.hb_max, static_cast<unsigned long long>(r.hb_errors), r.reports_per_s,
      r.rpcs_per_s, static_cast<unsigned long long>(r.refused),
      static_cast<unsigned long long>(r.report_errors), r.cpu_cores,
      static_cast<unsigned long long>(r.rss),
      static_cast<unsigned long long>(r.rss_peak), r.bench_cpu_cores, r.cpus,
      r.load_before, r.load_after, r.registration_s,
      static_cast<unsigned long long>(r.refused_register),
      static_cast<unsigned long long>(r.refused_heartbeat),
      static_cast<unsigned long long>(r.refused),
      static_cast<unsigned long long>(r.refused_job), r.reregistrations,
      r.cpu_total_s, r.wall_total_s,
      static_cast<unsigned long long>(r.hb_timed_out),
      static_cast<unsigned long long>(r.sim_late_sends), r.sim_late_max_s,
      r.heartbeats_per_s, r.told_heartbeat_ms,
      r.rpcs_per_s > 0 ? r.cpu_cores * 1e6 / r.rpcs_per_s : -1.0, r.processes,
      r.sim_late_p99_s, static_cast<unsigned long long>(r.sim_heartbeats),
      r.sim_cpu_cores, r.quiet_s, r.quiet_heartbeats_per_s,
      r.cpu_us_per_heartbeat, r.cpu_us_per_report, r.report_calls_per_s,
      r.model_nodes, r.model_interval_ms, r.model_cores, r.relay_nodes,
      r.relay_gather_ms, static_cast<unsigned long long>(r.relay_batches),
      static_cast<unsigned long long>(r.relay_heartbeats),
      static_cast<unsigned long long>(r.relay_reports),
      static_cast<unsigned long long>(r.relay_refused));
  return buf;
}

void PrintText(const Result& r) {
  std::printf("%d nodes x %d ranks, checkpoint every %g s for %g s:\n", r.nodes,
              r.ranks / std::max(r.nodes, 1), r.interval_s, r.duration_s);
  std::printf(
      "  steps committed %d of %d; commit p50 %.3f s, p99 %.3f s, max %.3f s\n",
      r.steps_committed, r.steps_started, r.commit_p50, r.commit_p99,
      r.commit_max);
  std::printf(
      "  detection %.3f s, plan %.3f s (computed in %.3f s, %d orders), false "
      "deaths %d\n",
      r.detect_s, r.plan_s, r.plan_compute_s, r.plan_orders, r.false_deaths);
  std::printf("  heartbeat round trip p99 %.3f s, max %.3f s, %llu failed\n",
              r.hb_p99, r.hb_max, static_cast<unsigned long long>(r.hb_errors));
  std::printf(
      "  %.0f rank reports/s in %.0f RPCs/s (%llu retried after "
      "RESOURCE_EXHAUSTED/UNAVAILABLE)\n",
      r.reports_per_s, r.rpcs_per_s,
      static_cast<unsigned long long>(r.refused));
  std::printf(
      "  registration %.2f s; refused: %llu registrations, %llu heartbeats, "
      "%llu reports, %llu RegisterJob; %d re-registrations\n",
      r.registration_s, static_cast<unsigned long long>(r.refused_register),
      static_cast<unsigned long long>(r.refused_heartbeat),
      static_cast<unsigned long long>(r.refused),
      static_cast<unsigned long long>(r.refused_job), r.reregistrations);
  std::printf("  coordinator CPU %.1f s over the whole run (%.1f s)\n",
              r.cpu_total_s, r.wall_total_s);
  std::printf(
      "  %.0f heartbeats/s (interval told: %d ms); coordinator %.1f us of "
      "CPU per RPC\n",
      r.heartbeats_per_s, r.told_heartbeat_ms,
      r.rpcs_per_s > 0 ? r.cpu_cores * 1e6 / r.rpcs_per_s : -1.0);
  std::printf(
      "  coordinator %.3f cores, RSS %.1f MiB (peak %.1f MiB); %d simulator "
      "processes %.3f cores; load %.2f -> %.2f on %d CPUs\n",
      r.cpu_cores, r.rss / 1048576.0, r.rss_peak / 1048576.0, r.processes,
      r.sim_cpu_cores, r.load_before, r.load_after, r.cpus);
  std::printf(
      "  simulator lateness (%llu heartbeats sent): p99 %.4f s, max %.3f s, "
      "%llu more than timeout/2\n",
      static_cast<unsigned long long>(r.sim_heartbeats), r.sim_late_p99_s,
      r.sim_late_max_s, static_cast<unsigned long long>(r.sim_late_sends));
  if (r.relay_nodes > 0)
    std::printf(
        "  relays of %d nodes (gathering %d ms): %llu RelayBatch calls "
        "carried %llu heartbeats and %llu report calls (%.1f items a "
        "batch); %llu batches refused whole\n",
        r.relay_nodes, r.relay_gather_ms,
        static_cast<unsigned long long>(r.relay_batches),
        static_cast<unsigned long long>(r.relay_heartbeats),
        static_cast<unsigned long long>(r.relay_reports),
        r.relay_batches > 0
            ? static_cast<double>(r.relay_heartbeats + r.relay_reports) /
                  r.relay_batches
            : 0.0,
        static_cast<unsigned long long>(r.relay_refused));
  if (r.cpu_us_per_heartbeat >= 0)
    std::printf(
        "  coordinator CPU per heartbeat %.1f us (%.0f heartbeats/s, %.1f s "
        "quiet), per report call %.1f us (%.0f calls/s); model at %d nodes "
        "(heartbeat every %d ms, a step every %g s): %.2f cores\n",
        r.cpu_us_per_heartbeat, r.quiet_heartbeats_per_s, r.quiet_s,
        r.cpu_us_per_report, r.report_calls_per_s, r.model_nodes,
        r.model_interval_ms, r.interval_s, r.model_cores);
}

}  // namespace ckpt::bench
