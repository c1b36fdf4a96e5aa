#include "coordinator/options.h"

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/tls.h"
#include "coordinator/etcd/etcd_state.h"
#include "storage/object_config.h"
#include "util/cli_parse.h"
#include "util/config_file.h"
#include "util/metrics_server.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

// The bounds of --plan-ack-timeout-ms (0: no deadline) and --max-soft-steps.
constexpr int64_t kMinPlanAckTimeoutMs = 1000;
constexpr int64_t kMaxPlanAckTimeoutMs = int64_t{7} * 24 * 3600 * 1000;
constexpr int64_t kMaxSoftSteps = 1 << 16;

// One check for both sources; `name` is the flag or "config: <key>".
absl::Status ValidatePlanAckTimeout(int64_t ms, std::string_view name) {
  if (ms == 0 || (ms >= kMinPlanAckTimeoutMs && ms <= kMaxPlanAckTimeoutMs))
    return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(name), ": ", ms, " is neither 0 (no deadline) nor in [",
      kMinPlanAckTimeoutMs, ", ", kMaxPlanAckTimeoutMs, "] ms"));
}
// --max-failed-plans: 0 (no limit) to this.
constexpr int64_t kMaxFailedPlans = 1000000;
absl::Status ValidateMaxFailedPlans(int64_t n, std::string_view name) {
  if (n >= 0 && n <= kMaxFailedPlans) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(name), ": ", n, " is neither 0 (no limit) nor in [1, ",
      kMaxFailedPlans, "]"));
}
absl::Status ValidateMaxSoftSteps(int64_t n, std::string_view name) {
  if (n >= 1 && n <= kMaxSoftSteps) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(name), ": ", n, " is not in [1, ", kMaxSoftSteps, "]"));
}

// A certificate identity (CN or subjectAltName value) as a list flag
// gives it: 1 to 255 printable characters, no space.
absl::Status ValidateIdentity(std::string_view id, std::string_view name) {
  if (absl::Status s = ValidatePrintable(id, name, 255); !s.ok()) return s;
  if (id.find(' ') != std::string_view::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(name), ": ", QuotePrefix(id),
        " is not a certificate identity (it has a space; the list is "
        "comma-separated)"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CoordinatorServerOptions> ParseCoordinatorOptions(
    int argc, char** argv, std::string* help) {
  CoordinatorServerOptions o;
  std::string config;
  uint32_t timeout_ms = 3000;
  int64_t plan_ack_timeout_ms = o.coordinator.plan_ack_timeout.count();
  uint32_t peer_probe_timeout_ms =
      static_cast<uint32_t>(o.coordinator.peer_probe_timeout.count());
  int64_t max_soft_steps = static_cast<int64_t>(o.coordinator.max_soft_steps);
  int64_t max_failed_plans = o.coordinator.max_failed_plans;
  CLI::App app{"ckpt-coordinator: coordinator of multi-node checkpointed jobs"};
  // --listen and --state are required, from the command line or the config
  // file (checked below).
  app.add_option("--listen", o.listen,
                 "HOST:PORT to serve gRPC on (port 0: any free port)");
  std::string state;
  std::string admins = "ckpt-admin";
  app.add_option("--state", state,
                 "directory of the coordinator's RocksDB state, or "
                 "etcd://HOST:PORT[,HOST:PORT...]/PREFIX "
                 "(HA: replicas elect a leader through etcd)");
  app.add_option("--advertise-addr", o.advertise,
                 "HA: HOST:PORT standbys send clients to (default: --listen)");
  app.add_option(
         "--lease-ttl-s", o.lease_ttl_s,
         "HA: leader lease in seconds (default: heartbeat timeout, >= 2)")
      ->check(CLI::Range(int64_t{2}, int64_t{3600}));
  app.add_option("--tls-cert", o.security.tls.cert,
                 "this coordinator's TLS certificate (PEM)");
  app.add_option("--tls-key", o.security.tls.key, "its private key (PEM)");
  app.add_option("--tls-ca", o.security.tls.ca,
                 "CA certificate every client certificate must chain to (PEM)");
  app.add_flag("--insecure", o.security.tls.insecure,
               "plaintext, no client identity (trusted networks and tests)");
  app.add_option("--admin-identities", admins,
                 "comma-separated certificate identities (CN or "
                 "subjectAltName) allowed to roll back jobs");
  std::string relays;
  app.add_option("--relay-identities", relays,
                 "comma-separated certificate identities (CN or "
                 "subjectAltName) allowed to call RelayBatch: relays "
                 "carrying many nodes' heartbeats and reports (mTLS only; "
                 "default none)");
  app.add_option(
      "--shared-root", o.coordinator.shared_root,
      "shared storage root for global manifests (default: <state>/shared)");
  app.add_option("--heartbeat-timeout-ms", timeout_ms,
                 "declare a node dead after this long without a heartbeat")
      ->check(CLI::Range(10u, 3600000u));
  app.add_option("--heartbeat-interval-nodes",
                 o.coordinator.heartbeat_interval_nodes,
                 "nodes up to which each heartbeats every timeout/5; a "
                 "larger cluster heartbeats less often, in proportion, at "
                 "most every timeout/3 (default 2048; 0: always timeout/5)")
      ->check(CLI::Range(0u, 1u << 24));
  app.add_option("--peer-probe-timeout-ms", peer_probe_timeout_ms,
                 "a node that a trainer's exit suspects (its peers there "
                 "were lost) is probed; no heartbeat within this long: it "
                 "is dead, and one plan covers it and the exit (default "
                 "300)")
      ->check(CLI::Range(10u, 60000u));
  app.add_option("--plan-ack-timeout-ms", plan_ack_timeout_ms,
                 "a recovery plan whose orders are not all acknowledged this "
                 "long after it was made fails the "
                 "nodes that did not acknowledge and plans again; 0: no "
                 "deadline (default 600000, else "
                 ">= 1000)");
  app.add_option("--max-soft-steps", max_soft_steps,
                 "per job, the most uncommitted steps newer than the last good "
                 "one whose per-rank reports are "
                 "kept in memory; the oldest are dropped past it (default 64, "
                 "1 to 65536)");
  app.add_option("--max-failed-plans", max_failed_plans,
                 "a job makes at most this many recovery plans without a "
                 "commit; a failure that would make one more holds it "
                 "(PLAN_HELD, event JOB_HELD: trainers stopped) until "
                 "ckptctl resume (default 10; 0: no limit)");
  HangPolicy& hang = o.coordinator.hang;
  app.add_option("--hang-timeout-min-s", hang.min_s,
                 "hang detection: the shortest time without progress that is "
                 "a hang (default 120)")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--hang-factor", hang.factor,
                 "hang detection: a rank is hung after this many times its "
                 "p99 step time without progress, if longer than "
                 "--hang-timeout-min-s (default 10)")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--first-step-timeout-s", hang.first_step_s,
                 "hang detection: the allowance of the first step after a "
                 "(re)start: process start, collective init, restore "
                 "(default 900)")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--straggler-factor", hang.straggler_factor,
                 "stragglers: a rank whose compute (else step) time is above "
                 "this many times the job's median (default 1.5)")
      ->check(CLI::Range(1.01, 1000.0));
  app.add_option("--straggler-windows", hang.straggler_windows,
                 "stragglers: ... in this many consecutive windows of "
                 "--straggler-window-s (default 3)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--straggler-window-s", hang.straggler_window_s,
                 "stragglers: the window's length in seconds: a window holds "
                 "enough steps of every rank to compare them (default 10)")
      ->check(CLI::Range(1.0, 3600.0));
  CordonPolicy& cordon = o.coordinator.cordon;
  app.add_option("--cordon-after", cordon.after,
                 "cordon a node (its ranks move to a spare) after this many "
                 "hangs or trainer crashes on it within --cordon-window-s; "
                 "0: never (default 3)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--cordon-window-s", cordon.window_s,
                 "the window of --cordon-after in seconds (default 1800)")
      ->check(CLI::Range(1.0, 30.0 * 86400));
  SuspectPolicy& suspect = o.coordinator.suspect;
  app.add_option("--suspect-after-claims", suspect.after,
                 "a node is unhealthy (check restore_claims; its ranks move "
                 "to a spare) after this many copies its restores claimed "
                 "bad were verified good by the node within "
                 "--suspect-claims-window-s; 0: never (default 3)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--suspect-claims-window-s", suspect.window_s,
                 "the window of --suspect-after-claims in seconds (default "
                 "1800)")
      ->check(CLI::Range(1.0, 30.0 * 86400));
  app.add_flag("--evict-stragglers", o.coordinator.evict_stragglers,
               "replace a straggler's node by a spare (cordoned, reason "
               "straggler); never without a healthy spare with room");
  bool wait_for_prefetch = false;
  app.add_flag("--wait-for-prefetch", wait_for_prefetch,
               "start a plan's trainers only once every PREFETCH is "
               "acknowledged (default: once every node acknowledged its "
               "RESTART, while the fetches run)");
  app.add_option("--health-min-ratio", o.coordinator.health_min_ratio,
                 "a node whose memcpy or CUDA bandwidth is below this "
                 "fraction of the cluster's median is unhealthy (0: never)")
      ->check(CLI::Range(0.0, 1.0));
  double spare_check_max_age_s = 600;
  app.add_option("--spare-check-max-age-s", spare_check_max_age_s,
                 "a spare whose newest health report is older than this is "
                 "checked again before it takes ranks (0: never; ckptd "
                 "re-checks an idle node every --health-recheck-s, 300)")
      ->check(CLI::Range(0.0, 30.0 * 86400));
  uint32_t min_world_size = 0;
  uint32_t world_size_multiple = 1;
  double spare_wait_s = 0;
  app.add_option("--min-world-size", min_world_size,
                 "elastic continuation: a job that lost a node no spare "
                 "replaces shrinks, to no fewer ranks than this (0: jobs "
                 "wait for a node; ckptrun --min-world-size per job)")
      ->check(CLI::Range(0u, 1u << 20));
  app.add_option("--world-size-multiple", world_size_multiple,
                 "elastic continuation: a shrunk job's world size is a "
                 "multiple of this (default 1)")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--spare-wait-s", spare_wait_s,
                 "elastic continuation: how long lost ranks wait for a "
                 "healthy spare before the job shrinks (default 0: at once "
                 "when no spare exists)")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--config", config,
                 "TOML file: each flag --foo-bar is key foo_bar, and the "
                 "object_* keys (flags win)");
  app.add_option("--etcd-tls-cert", o.etcd_tls.cert,
                 "HA: client certificate for etcd (PEM)");
  app.add_option("--etcd-tls-key", o.etcd_tls.key, "HA: its private key (PEM)");
  app.add_option("--etcd-tls-ca", o.etcd_tls.ca,
                 "HA: CA that signed etcd's server certificate (PEM)");
  app.add_option(
      "--metrics-listen", o.metrics_listen,
      "serve Prometheus metrics at http://HOST:PORT/metrics (default: off)");
  bool print_keys = false;
  app.add_flag("--print-config-keys", print_keys,
               "print the config file's keys, one \"key --flag\" a line, "
               "and exit");
  // The exceptions to "flag --foo-bar is key foo_bar" (config_file.h).
  const ConfigKeyRules keys{
      .command_line_only = {"--config", "--print-config-keys"},
      .aliases = {},
      .other_keys = storage::ObjectStoreConfigKeys()};
  if (absl::Status s = ParseCli(app, help, argc, argv); !s.ok()) return s;
  if (print_keys) {
    *help = ConfigKeyList(app, keys);
    return absl::CancelledError("config keys");
  }
  if (!config.empty()) {
    auto parsed = ParseConfigFile(config);
    if (!parsed.ok()) return parsed.status();
    if (absl::Status s = ApplyConfigFile(app, *parsed, config, keys); !s.ok())
      return s;
    if (absl::Status s = storage::ReadObjectStoreConfig(
            *parsed, &o.coordinator.object_config);
        !s.ok())
      return s;
  }
  // Named as the operator gave them: the flag, else the file's key.
  auto name = [&](const char* flag, const char* key) {
    return app.count(flag) ? std::string(flag)
                           : absl::StrCat("config ", config, ": ", key);
  };
  if (o.listen.empty())
    return absl::InvalidArgumentError(
        "--listen: required (or listen in --config)");
  if (state.empty())
    return absl::InvalidArgumentError(
        "--state: required (or state in --config)");
  o.coordinator.spare_check_max_age_ms =
      static_cast<int64_t>(spare_check_max_age_s * 1000);
  o.coordinator.peer_probe_timeout =
      std::chrono::milliseconds(peer_probe_timeout_ms);
  if (absl::Status s = ValidatePlanAckTimeout(
          plan_ack_timeout_ms,
          name("--plan-ack-timeout-ms", "plan_ack_timeout_ms"));
      !s.ok())
    return s;
  if (absl::Status s = ValidateMaxSoftSteps(
          max_soft_steps, name("--max-soft-steps", "max_soft_steps"));
      !s.ok())
    return s;
  if (absl::Status s = ValidateMaxFailedPlans(
          max_failed_plans, name("--max-failed-plans", "max_failed_plans"));
      !s.ok())
    return s;
  o.coordinator.max_failed_plans = static_cast<uint32_t>(max_failed_plans);
  if (min_world_size % world_size_multiple != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        name("--min-world-size", "min_world_size"), ": ", min_world_size,
        " is not a multiple of --world-size-multiple ", world_size_multiple));
  o.coordinator.min_world_size = min_world_size;
  o.coordinator.world_size_multiple = world_size_multiple;
  o.coordinator.spare_wait_ms = static_cast<int64_t>(spare_wait_s * 1000);
  if (o.listen.rfind(':') == std::string::npos)
    return absl::InvalidArgumentError("--listen: \"" + o.listen +
                                      "\" is not HOST:PORT");
  if (!o.metrics_listen.empty())
    if (absl::Status s = ValidateMetricsListen(
            o.metrics_listen, name("--metrics-listen", "metrics_listen"));
        !s.ok())
      return s;
  if (absl::Status s =
          ValidateTlsFlags(o.security.tls, /*require_choice=*/true);
      !s.ok())
    return s;
  o.security.admin_identities.clear();
  for (absl::string_view id : absl::StrSplit(admins, ',', absl::SkipEmpty()))
    o.security.admin_identities.emplace_back(id);
  for (absl::string_view id : absl::StrSplit(relays, ',', absl::SkipEmpty())) {
    if (absl::Status v =
            ValidateIdentity(std::string_view(id.data(), id.size()),
                             name("--relay-identities", "relay_identities"));
        !v.ok())
      return v;
    o.security.relay_identities.emplace_back(id.data(), id.size());
  }
  if (!o.security.relay_identities.empty() && !o.security.tls.enabled())
    return absl::InvalidArgumentError(absl::StrCat(
        name("--relay-identities", "relay_identities"),
        ": only with --tls-cert/--tls-key/--tls-ca (without mTLS any caller "
        "may relay, and no identity is checked)"));
  if (o.etcd_tls.enabled() && !etcd::IsEtcdState(state))
    return absl::InvalidArgumentError(
        "--etcd-tls-cert/--etcd-tls-key/--etcd-tls-ca: only with --state "
        "etcd://");
  if (absl::Status s =
          ValidateTlsFlags(o.etcd_tls, /*require_choice=*/false, "--etcd-tls");
      !s.ok())
    return s;
  // Read now, so a bad file stops the coordinator before it serves.
  auto etcd_credentials = LoadClientCredentials(o.etcd_tls, "--etcd-tls");
  if (!etcd_credentials.ok()) return etcd_credentials.status();
  o.etcd_credentials = std::move(*etcd_credentials);
  if (etcd::IsEtcdState(state)) {
    if (auto parsed = etcd::ParseEtcdState(state, "--state"); !parsed.ok())
      return parsed.status();
    o.etcd_state = state;
    if (o.coordinator.shared_root.empty())
      return absl::InvalidArgumentError(
          "--shared-root: required with --state etcd:// (every replica needs "
          "it)");
    if (!o.advertise.empty())
      if (absl::Status s = ValidateHostPort(o.advertise, "--advertise-addr");
          !s.ok())
        return s;
    if (o.lease_ttl_s == 0)
      o.lease_ttl_s = std::max<int64_t>(2, (timeout_ms + 999) / 1000);
  } else {
    o.coordinator.state_dir = state;
  }
  if (o.coordinator.shared_root.empty())
    o.coordinator.shared_root = o.coordinator.state_dir + "/shared";
  o.coordinator.heartbeat_timeout = std::chrono::milliseconds(timeout_ms);
  o.coordinator.plan_ack_timeout =
      std::chrono::milliseconds(plan_ack_timeout_ms);
  o.coordinator.max_soft_steps = static_cast<size_t>(max_soft_steps);
  o.coordinator.start_trainers_with_prefetch = !wait_for_prefetch;
  return o;
}

}  // namespace ckpt::coordinator
