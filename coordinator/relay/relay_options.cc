// ckpt-relay's command line (relay.h ParseRelayOptions).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>

#include "absl/strings/str_cat.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "coordinator/client/tls.h"
#include "coordinator/relay/relay.h"
#include "util/cli_parse.h"
#include "util/metrics_server.h"

namespace ckpt::coordinator {
namespace {

constexpr int64_t kMaxGatherMs = 1000;
// The coordinator takes at most 4,096 heartbeats and 4,096 report calls a
// batch (Coordinator::kMaxRelayHeartbeats, kMaxRelayReports).
constexpr int64_t kMaxBatchItems = 4096;
constexpr int64_t kMaxInFlight = 64;
constexpr size_t kMaxRelayIdBytes = 128;

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

absl::Status InRange(int64_t v, int64_t lo, int64_t hi, const char* flag) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": ", v, " is not in [", lo, ", ", hi, "]"));
}

}  // namespace

absl::StatusOr<RelayOptions> ParseRelayOptions(int argc, char** argv,
                                               std::string* help) {
  RelayOptions o;
  int64_t gather_ms = o.gather.count();
  int64_t max_batch = static_cast<int64_t>(o.max_batch);
  int64_t in_flight = o.max_in_flight;
  CLI::App app{
      "ckpt-relay: carries its nodes' heartbeats and shard reports to "
      "ckpt-coordinator in batches (one per rack)"};
  app.add_option("--listen", o.listen,
                 "HOST:PORT the nodes call (ckptd --coordinator-relay; port "
                 "0: any free port)");
  app.add_option("--coordinator", o.coordinator,
                 "HOST:PORT[,HOST:PORT...] of ckpt-coordinator (replicas: the "
                 "leader is followed)");
  app.add_option("--tls-cert", o.tls.cert,
                 "the relay's certificate (PEM): its server certificate for "
                 "the nodes and its client certificate for the coordinator, "
                 "whose --relay-identities must name it");
  app.add_option("--tls-key", o.tls.key, "its private key (PEM)");
  app.add_option(
      "--tls-ca", o.tls.ca,
      "the CA that signs the nodes' and the coordinator's certificates "
      "(PEM)");
  app.add_flag("--insecure", o.tls.insecure,
               "plaintext, no identities (trusted networks and tests)");
  app.add_option("--relay-id", o.relay_id,
                 "this relay's name in the coordinator's logs and metrics "
                 "(default: the host name)");
  app.add_option("--gather-ms", gather_ms,
                 "gather node calls this long before a batch goes (default "
                 "5; 0: at once)");
  app.add_option("--max-batch", max_batch,
                 "a batch goes as soon as it holds this many node calls "
                 "(default 512)");
  app.add_option("--max-in-flight", in_flight,
                 "batches sent at once (default 4)");
  app.add_option(
      "--metrics-listen", o.metrics_listen,
      "serve Prometheus metrics at http://HOST:PORT/metrics (default: off)");
  if (absl::Status s = ParseCli(app, help, argc, argv); !s.ok()) return s;
  if (o.listen.empty()) return absl::InvalidArgumentError("--listen: required");
  if (absl::Status s = ValidateHostPort(o.listen, "--listen", /*min_port=*/0);
      !s.ok())
    return s;
  if (o.coordinator.empty())
    return absl::InvalidArgumentError("--coordinator: required");
  if (absl::Status s =
          ParseAddressList(o.coordinator, "--coordinator").status();
      !s.ok())
    return s;
  if (absl::Status s = ValidateTlsFlags(o.tls, /*require_choice=*/true);
      !s.ok())
    return s;
  // Read now, so a bad file stops the relay before it serves.
  if (absl::Status s = LoadClientCredentials(o.tls).status(); !s.ok()) return s;
  if (o.relay_id.empty() && app.count("--relay-id") == 0)
    o.relay_id = HostName();
  if (o.relay_id.empty() || o.relay_id.size() > kMaxRelayIdBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "--relay-id: \"", o.relay_id.substr(0, 64), "\" is not 1 to ",
        kMaxRelayIdBytes, " printable characters"));
  for (char c : o.relay_id)
    if (c <= 0x20 || c > 0x7e)
      return absl::InvalidArgumentError(
          absl::StrCat("--relay-id: \"", o.relay_id.substr(0, 64),
                       "\" has a character that is not printable ASCII "
                       "(or a space)"));
  if (absl::Status s = InRange(gather_ms, 0, kMaxGatherMs, "--gather-ms");
      !s.ok())
    return s;
  if (absl::Status s = InRange(max_batch, 1, kMaxBatchItems, "--max-batch");
      !s.ok())
    return s;
  if (absl::Status s = InRange(in_flight, 1, kMaxInFlight, "--max-in-flight");
      !s.ok())
    return s;
  if (!o.metrics_listen.empty())
    if (absl::Status s =
            ValidateMetricsListen(o.metrics_listen, "--metrics-listen");
        !s.ok())
      return s;
  o.gather = std::chrono::milliseconds(gather_ms);
  o.max_batch = static_cast<size_t>(max_batch);
  o.max_in_flight = static_cast<int>(in_flight);
  return o;
}

}  // namespace ckpt::coordinator
