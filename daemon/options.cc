#include "daemon/options.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "shm/huge_pages.h"
#include "storage/keys.h"
#include "storage/object_backend.h"
#include "storage/object_config.h"
#include "util/cli_parse.h"
#include "util/config_file.h"
#include "util/metrics_server.h"
#include "util/validate.h"

namespace ckpt::daemon {
namespace {

// Arena names are per daemon instance: two daemons with different roots
// on one node never share a segment.
std::string DefaultShmPrefix(const std::string& root) {
  std::error_code ec;
  std::string abs = std::filesystem::weakly_canonical(root, ec).string();
  return absl::StrFormat(
      "ckptd-%08x",
      static_cast<uint32_t>(std::hash<std::string>{}(ec ? root : abs)));
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || !name[0]) return "localhost";
  return name;
}

// Whether host (as in HOST:PORT, IPv6 in brackets) names this machine's
// loopback interface only.
bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "[::1]" || host == "::1" ||
         (host.rfind("127.", 0) == 0 &&
          host.find_first_not_of("0123456789.") == std::string::npos);
}

}  // namespace

absl::StatusOr<DaemonOptions> ParseDaemonOptions(int argc, char** argv,
                                                 std::string* help) {
  DaemonOptions o;
  std::string config, shm_prefix, huge_pages = "auto", hugetlbfs;
  uint32_t retain = 3, slots = 2, attempts = 3, drain_s = 60, queue_depth = 8;
  uint64_t io_mib = 4;
  bool no_uring = false, no_direct = false;
  uint32_t retain_object = 0, upload_threads = 4;
  std::string commit_tier;

  CLI::App app{"ckptd: node-local checkpoint daemon"};
  // Required unless --health-check (checked below).
  app.add_option("--socket", o.socket_path, "Unix socket to serve gRPC on");
  // Required, from the command line or the config file (checked below).
  app.add_option("--root", o.root,
                 "directory for shards, manifests and the catalog");
  app.add_option("--config", config,
                 "TOML file with the settings below (flags win)");
  app.add_option("--shm-prefix", shm_prefix,
                 "prefix of shared-memory names (default: from --root)");
  app.add_option("--huge-pages", huge_pages,
                 "arenas in 2 MiB pages from a hugetlbfs mount: auto (when it "
                 "has free pages, else /dev/shm), on (required), off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--hugetlbfs", hugetlbfs,
                 "hugetlbfs directory for the arenas (default: the first "
                 "hugetlbfs mount of 2 MiB pages)");
  app.add_option("--retain", retain,
                 "durable steps kept per job on local disk (0 = all)");
  app.add_option("--retain-local", retain, "the same as --retain");
  app.add_option("--object-url", o.object_url,
                 "object tier: s3://BUCKET/PREFIX (endpoint, credentials: "
                 "AWS_* environment) or a directory");
  app.add_option("--commit-tier", commit_tier,
                 "tier that makes a step durable: local (default) or object");
  app.add_option("--retain-object", retain_object,
                 "steps kept per job in the object tier (0 = all)");
  app.add_option("--upload-threads", upload_threads,
                 "object tier: shards uploaded at once")
      ->check(CLI::Range(1, 64));
  app.add_option("--slots", slots, "default slots per arena")
      ->check(CLI::Range(2, 16));
  app.add_option(
         "--persist-attempts", attempts,
         "failed persist attempts before WaitDurable reports the failure and a "
         "newer save may take the slot (retried while the bytes are in memory)")
      ->check(CLI::Range(1, 100));
  app.add_option("--drain-seconds", drain_s,
                 "on SIGTERM, wait this long for pending persists");
  app.add_option("--queue-depth", queue_depth,
                 "I/O requests in flight per shard")
      ->check(CLI::Range(1, 256));
  app.add_option("--io-mib", io_mib, "MiB per I/O request")
      ->check(CLI::Range(1, 256));
  app.add_flag("--no-io-uring", no_uring,
               "use pwrite/pread instead of io_uring");
  app.add_flag("--no-direct-io", no_direct, "do not use O_DIRECT");
  app.add_option("--shared-root", o.shared_root,
                 "directory every node can read (shards go there; the catalog "
                 "stays in --root)");
  app.add_option("--coordinator", o.agent.coordinator,
                 "HOST:PORT[,HOST:PORT...] of ckpt-coordinator (replicas: the "
                 "leader is followed) to join");
  app.add_option("--tls-cert", o.agent.tls.cert,
                 "this node's certificate for the coordinator (PEM; CN or SAN "
                 "= --node-id)");
  app.add_option("--tls-key", o.agent.tls.key, "its private key (PEM)");
  app.add_option("--tls-ca", o.agent.tls.ca,
                 "CA of the coordinator's certificate (PEM)");
  app.add_flag("--insecure", o.agent.tls.insecure,
               "plaintext to the coordinator (the default without --tls-*)");
  app.add_option("--coordinator-relay", o.agent.relay,
                 "HOST:PORT of a ckpt-relay: heartbeats and shard reports go "
                 "through it, every other call to --coordinator (directly "
                 "whenever the relay cannot carry them)");
  app.add_option("--coordinator-listen", o.coordinator_listen,
                 "serve an embedded coordinator on HOST:PORT (one-node jobs; "
                 "no --coordinator)");
  app.add_option("--node-id", o.agent.node_id,
                 "this node's id (default: the host name)");
  app.add_option(
      "--advertise-addr", o.agent.address,
      "address other nodes reach this node at (default: the host name)");
  app.add_option("--capacity", o.agent.capacity, "ranks this node can host")
      ->check(CLI::Range(1, 4096));
  app.add_flag("--spare", o.agent.spare,
               "join as a spare that hosts ranks only after a failure");
  app.add_option("--health-net-port", o.agent.net_probe_port,
                 "TCP port of the network health check's listener, the same "
                 "on every node (-1, the default: none, the node is left out "
                 "of the check; 0: any free port)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--max-connections-per-uid",
                 o.listener.max_connections_per_uid,
                 "connections one uid other than root may hold (0 = no limit)");
  app.add_option("--max-request-mib", o.max_request_mib,
                 "largest request accepted, in MiB")
      ->check(CLI::Range(1, 1024));
  app.add_option("--heartbeat-timeout-ms", o.heartbeat_timeout_ms,
                 "embedded coordinator: a node silent this long is dead")
      ->check(CLI::Range(100, 600000));
  app.add_option(
      "--metrics-listen", o.metrics_listen,
      "serve Prometheus metrics at http://HOST:PORT/metrics (default: off)");
  std::string replica_target;
  AddReplicaFlags(app, o.replicas, replica_target);
  uint32_t health_timeout_s = 10;
  uint64_t shm_mib_per_rank = 0;
  app.add_flag("--health-check", o.health_check,
               "run the node health checks, print one line per check and "
               "exit (0: healthy)");
  app.add_flag("--json", o.health_json, "with --health-check: one JSON object");
  app.add_option("--health-timeout-s", health_timeout_s,
                 "a health check not done in this many seconds fails")
      ->check(CLI::Range(1, 600));
  uint32_t health_recheck_s = 300;
  app.add_option("--health-recheck-s", health_recheck_s,
                 "while the node hosts no ranks, run the health checks again "
                 "every this many seconds and report them (a spare stays "
                 "checked); 0: only at start and when the coordinator asks")
      ->check(CLI::Range(0, 86400));
  app.add_option("--health-shm-mib-per-rank", shm_mib_per_rank,
                 "free MiB the shm check wants in /dev/shm per rank of "
                 "--capacity (default 0: only a probe)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  uint32_t health_memcpy_mib = 64;
  app.add_option("--health-memcpy-mib", health_memcpy_mib,
                 "MiB the memcpy check copies per round (its figure is the "
                 "best of at least 8 rounds and 0.2 s)")
      ->check(CLI::Range(1, 4096));
  bool print_keys = false;
  app.add_flag("--print-config-keys", print_keys,
               "print the config file's keys, one \"key --flag\" a line, "
               "and exit");
  // The exceptions to "flag --foo-bar is key foo_bar" (config_file.h).
  const ConfigKeyRules keys{
      .command_line_only = {"--config", "--print-config-keys", "--health-check",
                            "--json"},
      .aliases = {{"--retain-local", "--retain"}},
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
    if (absl::Status s =
            storage::ReadObjectStoreConfig(*parsed, &o.object_config);
        !s.ok())
      return s;
  }
  if (o.root.empty())
    return absl::InvalidArgumentError("--root: required (or root in --config)");
  if (o.socket_path.empty() && !o.health_check)
    return absl::InvalidArgumentError("--socket: required");
  if (o.health_json && !o.health_check)
    return absl::InvalidArgumentError("--json: only with --health-check");
  // A shared root in an object store is the object tier, and the tier that
  // commits: nodes share no directory.
  if (storage::IsObjectUrl(o.shared_root)) {
    if (!o.object_url.empty() && o.object_url != o.shared_root)
      return absl::InvalidArgumentError(
          "--object-url: differs from the object store --shared-root");
    if (commit_tier == "local")
      return absl::InvalidArgumentError(
          "--commit-tier: must be object with an object store --shared-root");
    o.object_url = o.shared_root;
    commit_tier = "object";
  }
  if (commit_tier.empty() || commit_tier == "local") {
    o.engine.commit_tier = EngineOptions::CommitTier::kLocal;
  } else if (commit_tier == "object") {
    if (o.object_url.empty())
      return absl::InvalidArgumentError(
          "--commit-tier: object needs --object-url (or object_url)");
    o.engine.commit_tier = EngineOptions::CommitTier::kObject;
  } else {
    return absl::InvalidArgumentError(
        "--commit-tier: " + QuotePrefix(commit_tier) +
        " is not local or object");
  }
  o.engine.retain_object = retain_object;
  o.engine.upload_threads = upload_threads;

  if (!o.metrics_listen.empty())
    if (absl::Status s = ValidateMetricsListen(
            o.metrics_listen, app.count("--metrics-listen")
                                  ? "--metrics-listen"
                                  : "config " + config + ": metrics_listen");
        !s.ok())
      return s;
  o.engine.shm_prefix =
      shm_prefix.empty() ? DefaultShmPrefix(o.root) : shm_prefix;
  for (char c : o.engine.shm_prefix)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_')
      return absl::InvalidArgumentError(
          "--shm-prefix: only [A-Za-z0-9_-] allowed");
  if (huge_pages != "off") {
    // Explicit or found: checked now, so that a wrong one stops the start.
    const std::string dir =
        hugetlbfs.empty() ? shm::FindHugetlbfsOf() : hugetlbfs;
    absl::Status s =
        dir.empty() ? absl::NotFoundError("no hugetlbfs mount of 2 MiB pages")
                    : shm::CheckHugetlbfsDir(dir);
    if (!s.ok() && (huge_pages == "on" || !hugetlbfs.empty()))
      return absl::InvalidArgumentError(absl::StrCat(
          hugetlbfs.empty() ? "--huge-pages on: " : "--hugetlbfs: ",
          s.message()));
    if (s.ok()) o.engine.huge_dir = dir;
    o.engine.huge_required = huge_pages == "on";
  }
  o.engine.retain_steps = retain;
  o.engine.default_num_slots = slots;
  o.engine.max_persist_attempts = attempts;
  o.drain_deadline = std::chrono::seconds(drain_s);
  if (!o.agent.coordinator.empty() && !o.coordinator_listen.empty())
    return absl::InvalidArgumentError(
        "--coordinator-listen: not with --coordinator (the coordinator runs "
        "elsewhere)");
  if (!o.agent.relay.empty()) {
    if (!o.coordinator_listen.empty())
      return absl::InvalidArgumentError(
          "--coordinator-relay: not with --coordinator-listen (the embedded "
          "coordinator is on this node)");
    if (o.agent.coordinator.empty())
      return absl::InvalidArgumentError(
          "--coordinator-relay: needs --coordinator (the relay carries only "
          "heartbeats and reports; the rest goes directly)");
    if (absl::Status s =
            coordinator::ValidateHostPort(o.agent.relay, "--coordinator-relay");
        !s.ok())
      return s;
  }
  o.cluster = !o.agent.coordinator.empty() || !o.coordinator_listen.empty();
  if (!o.agent.coordinator.empty()) {
    if (absl::Status s =
            coordinator::ParseAddressList(o.agent.coordinator, "--coordinator")
                .status();
        !s.ok())
      return s;
    if (absl::Status s = coordinator::ValidateTlsFlags(
            o.agent.tls, /*require_choice=*/false);
        !s.ok())
      return s;
    if (absl::Status s = coordinator::CoordinatorClient::Create(
                             o.agent.coordinator, o.agent.tls)
                             .status();
        !s.ok())
      return s;
    if (o.shared_root.empty())
      return absl::InvalidArgumentError(
          "--shared-root: required with --coordinator (spares prefetch from "
          "it)");
  }
  if (!o.coordinator_listen.empty()) {
    if (absl::Status s = coordinator::ValidateHostPort(
            o.coordinator_listen, "--coordinator-listen", /*min_port=*/0);
        !s.ok())
      return s;
    // The embedded coordinator has no TLS: whoever reaches it could report,
    // fence nodes or roll the job back, so it serves this machine only.
    if (!IsLoopbackHost(
            o.coordinator_listen.substr(0, o.coordinator_listen.rfind(':'))))
      return absl::InvalidArgumentError(
          "--coordinator-listen: " + o.coordinator_listen.substr(0, 64) +
          " is not a loopback address; the embedded coordinator has no TLS, so "
          "it listens on "
          "127.0.0.1, [::1] or localhost only (run ckpt-coordinator with "
          "--tls-* for other nodes)");
  }
  if (!o.cluster && (o.agent.spare || !o.agent.node_id.empty()))
    return absl::InvalidArgumentError(
        std::string(o.agent.spare ? "--spare" : "--node-id") +
        ": needs --coordinator or --coordinator-listen");
  if (absl::Status s =
          FinishReplicaOptions(o.replicas, replica_target, o.cluster);
      !s.ok())
    return s;
  o.agent.domain = o.replicas.domain;
  o.agent.replica_port = o.replicas.port;
  if (o.agent.node_id.empty()) o.agent.node_id = HostName();
  if (absl::Status s = storage::ValidateNodeId(o.agent.node_id, "--node-id");
      !s.ok())
    return s;
  if (o.agent.address.empty()) o.agent.address = HostName();
  if (o.cluster) o.engine.node_id = o.agent.node_id;
  const std::string& data =
      o.shared_root.empty() || storage::IsObjectUrl(o.shared_root)
          ? o.root
          : o.shared_root;
  o.storage.root = data;
  o.storage.remove_tmp_files = true;  // this daemon owns the root's leftovers
  // A shared root holds other nodes' writes in flight: only this node's
  // temp files are its leftovers.
  if (o.cluster) o.storage.tmp_tag = o.engine.node_id;
  o.storage.use_io_uring = !no_uring;
  o.storage.direct_io = !no_direct;
  o.storage.queue_depth = queue_depth;
  o.storage.io_bytes = io_mib << 20;
  o.health.root = o.root;
  o.health.shared_root = o.shared_root;
  o.health.object_config = o.object_config;
  o.health.shm_need_bytes = shm_mib_per_rank * o.agent.capacity << 20;
  o.health.timeout = std::chrono::seconds(health_timeout_s);
  o.health.memcpy_bytes = uint64_t{health_memcpy_mib} << 20;
  o.health.shm_prefix = o.engine.shm_prefix;
  o.agent.health_recheck = std::chrono::seconds(health_recheck_s);
  return o;
}

}  // namespace ckpt::daemon
