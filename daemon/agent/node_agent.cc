// NodeAgent (node_agent.h): its life cycle, and the heartbeat thread that
// registers the node, sends the beacons, and takes the placement and the
// orders the coordinator answers with.
#include "daemon/agent/node_agent.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/tls.h"
#include "daemon/agent/node_agent_rpc.h"
#include "daemon/core/engine_util.h"
#include "util/retry.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;

NodeAgent::Rpc::Rpc(const NodeAgentOptions& options)
    : options_(options),
      client_(coordinator::CoordinatorClient::Create(options.coordinator,
                                                     options.tls)
                  .value()) {
  if (options.relay.empty()) return;
  // The TLS files were read once already (daemon/options.cc).
  std::shared_ptr<grpc::ChannelCredentials> creds =
      coordinator::LoadClientCredentials(options.tls).value();
  relay_ = coordinator::NewCoordinatorStub(options.relay, creds,
                                           options.tls.enabled());
}

bool NodeAgent::Rpc::RelayDue() {
  std::lock_guard<std::mutex> lock(relay_mu_);
  return std::chrono::steady_clock::now() >= direct_until_;
}

bool NodeAgent::Rpc::RelayFailed(const grpc::Status& s,
                                 const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  const bool marked = trailers.find("ckpt-relay-failed") != trailers.end();
  const bool unreached =
      s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      s.error_code() == grpc::StatusCode::UNIMPLEMENTED;
  if (s.ok() || (!marked && !unreached)) return false;
  if (options_.on_relay_fallback) options_.on_relay_fallback();
  std::lock_guard<std::mutex> lock(relay_mu_);
  const auto now = std::chrono::steady_clock::now();
  // Calls that were out together fail together: one backoff step for them.
  if (now < direct_until_) return true;
  relay_backoff_ =
      std::clamp(relay_backoff_ * 2, std::chrono::milliseconds(2000),
                 std::chrono::milliseconds(30000));
  const auto wait =
      JitterMs(relay_backoff_.count(), relay_backoff_.count() * 5 / 4);
  direct_until_ = now + wait;
  if (on_relay_) {
    on_relay_ = false;
    LogWarning(absl::StrCat(
        "relay ", options_.relay, ": ", s.error_message(),
        marked ? " (the relay could not carry it)" : "",
        "; heartbeats and reports go to the coordinator ", options_.coordinator,
        " directly, the relay is tried again in ", wait.count(), " ms"));
  }
  return true;
}

void NodeAgent::Rpc::RelayAnswered() {
  std::lock_guard<std::mutex> lock(relay_mu_);
  relay_backoff_ = std::chrono::milliseconds(0);
  if (!on_relay_) {
    on_relay_ = true;
    LogInfo("relay " + options_.relay +
            " carries heartbeats and reports again");
  }
}

NodeAgent::NodeAgent(NodeAgentOptions options)
    : options_(std::move(options)), rpc_(std::make_unique<Rpc>(options_)) {}

NodeAgent::~NodeAgent() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (order_watch_ctx_) order_watch_ctx_->TryCancel();
  }
  cv_.notify_all();
  if (order_watch_.joinable()) order_watch_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (reporter_.joinable()) reporter_.join();
  if (applier_.joinable()) applier_.join();
  for (auto& [id, t] : prefetchers_) t.join();
  for (auto& [token, t] : net_probers_) t.join();
}

void NodeAgent::Start(Engine* engine) {
  engine_ = engine;
  health_report_ = options_.health_report;
  health_last_run_ = std::chrono::steady_clock::now();
  StartNetProbeServer();
  if (!options_.shm_prefix.empty()) {
    BeaconMonitorOptions bo;
    bo.shm_prefix = options_.shm_prefix;
    bo.huge_dir = options_.huge_dir;
    beacons_ = std::make_unique<BeaconMonitor>(bo);
    beacons_->Start();
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  order_watch_ = std::thread([this] { OrderWatchLoop(); });
  reporter_ = std::thread([this] { ReportLoop(); });
  applier_ = std::thread([this] { ApplyLoop(); });
}

bool NodeAgent::WaitFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [&] { return stopping_ || kick_; });
  kick_ = false;
  return !stopping_;
}

void NodeAgent::OrderWatchLoop() {
  coordinator::CoordinatorClient& client = rpc_->client();
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    grpc::ClientContext ctx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      order_watch_ctx_ = &ctx;
    }
    cv1::WatchNodeRequest req;
    req.set_node_id(options_.node_id);
    size_t idx = 0;
    const std::string addr = client.current();
    std::unique_ptr<grpc::ClientReader<cv1::NodeView>> reader =
        client.watch_stub(&idx)->WatchNode(&ctx, req);
    cv1::NodeView view;
    while (reader->Read(&view)) {
      backoff = std::chrono::milliseconds(100);
      std::lock_guard<std::mutex> lock(mu_);
      for (uint64_t id : view.order_ids())
        if (!handled_.count(id)) kick_ = true;  // not taken yet: go get it
      if (view.probe() != 0 && view.probe() != probe_seen_) {
        probe_seen_ = view.probe();
        kick_ = true;  // a peer suspects this node: answer at once
      }
      if (kick_) cv_.notify_all();
    }
    grpc::Status ended = reader->Finish();
    const bool moved =
        !ended.ok() && !coordinator::LeaderHint(ended, ctx).empty();
    client.StreamEnded(ended, idx, &ctx);
    std::unique_lock<std::mutex> lock(mu_);
    order_watch_ctx_ = nullptr;
    if (stopping_) return;
    // Any other end (unreachable, an older coordinator without WatchNode):
    // heartbeats still carry the orders; try again after the backoff.
    if (moved && client.current() != addr) continue;  // to the named leader
    cv_.wait_for(lock, backoff, [&] { return stopping_; });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

namespace {

// The epoch kept in `path` by the previous life of this node's ckptd; 0
// when there is none or it does not parse (then the node waits for that
// life to time out, as without it).
uint64_t ReadEpochFile(const std::string& path) {
  if (path.empty()) return 0;
  std::ifstream in(path);
  uint64_t epoch = 0;
  if (!(in >> epoch)) return 0;
  return epoch;
}

// Replaces `path` with `epoch` (written to a temporary file, synced, then
// renamed over it, so a crash leaves the old epoch or the new, never a
// torn one). A failure is logged: the next restart then waits for the
// timeout.
void WriteEpochFile(const std::string& path, uint64_t epoch) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  const std::string text = absl::StrCat(epoch, "\n");
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0 &&
            write(fd, text.data(), text.size()) ==
                static_cast<ssize_t>(text.size()) &&
            fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) close(fd);
  ok = ok && rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok)
    LogWarning(absl::StrCat("epoch_file: writing ", path, ": ",
                            std::strerror(errno != 0 ? errno : err),
                            "; a restart will wait for this epoch to time "
                            "out"));
}

}  // namespace

absl::StatusOr<std::chrono::milliseconds> TakeHeartbeatInterval(
    uint32_t told_ms, uint32_t timeout_ms) {
  const uint32_t lo = 20;
  if (told_ms == 0)
    return std::chrono::milliseconds(std::max(timeout_ms / 5, lo));
  const uint32_t hi = std::max(timeout_ms / 3, lo);
  if (told_ms < lo || told_ms > hi)
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_interval_ms: ", told_ms, " ms not in [", lo, ", ", hi,
        "] (heartbeat_timeout_ms ", timeout_ms, " / 3)"));
  return std::chrono::milliseconds(told_ms);
}

void NodeAgent::HeartbeatLoop() {
  // This node's previous life's epoch: the first registration names it.
  uint64_t previous_epoch = ReadEpochFile(options_.epoch_file);
  std::chrono::milliseconds interval(250);
  uint32_t timeout_ms = 0;       // the coordinator's, from registration
  uint32_t refused_told_ms = 0;  // the last bad interval logged
  // What the coordinator tells, when valid; a bad value is logged once.
  auto take_interval = [&](uint32_t told_ms) {
    absl::StatusOr<std::chrono::milliseconds> i =
        TakeHeartbeatInterval(told_ms, timeout_ms);
    if (i.ok()) {
      interval = *i;
    } else if (refused_told_ms != told_ms) {
      refused_told_ms = told_ms;
      LogWarning(absl::StrCat("coordinator ", options_.coordinator, ": ",
                              i.status().message(), "; heartbeating every ",
                              interval.count(), " ms"));
    }
    heartbeat_interval_ms_ = interval.count();
  };
  // Until the next attempt: the interval, or what a refusal asked for.
  std::chrono::milliseconds wait = interval;
  std::chrono::milliseconds register_backoff(0);
  bool reachable = true;
  auto note = [&](const grpc::Status& s) {
    if (s.ok() && !reachable)
      LogInfo("coordinator " + options_.coordinator + " reachable again");
    if (!s.ok() && IsUnreachable(s) && reachable)
      LogWarning("coordinator " + options_.coordinator +
                 " unreachable: " + s.error_message() + "; retrying");
    if (s.ok() || IsUnreachable(s)) reachable = s.ok();
  };
  do {
    wait = interval;
    if (epoch_.load() == 0) {
      cv1::RegisterNodeRequest req;
      req.set_node_id(options_.node_id);
      req.set_address(options_.address);
      req.set_capacity(options_.capacity);
      req.set_spare(options_.spare);
      *req.mutable_health_report() = health_report_;
      if (net_server_)
        req.set_net_probe_port(static_cast<uint32_t>(net_server_->port()));
      req.set_domain(options_.domain);
      req.set_replica_port(options_.replica_port);
      req.set_previous_epoch(previous_epoch);
      cv1::RegisterNodeResponse resp;
      grpc::Status s = rpc_->Invoke(&cv1::Coordinator::Stub::RegisterNode, req,
                                    &resp, options_.rpc_timeout);
      note(s);
      if (IsTransient(s)) {
        // A busy coordinator (a registration storm): when it says, else
        // exponential backoff with jitter, so the herd spreads out.
        register_backoff = std::min(std::max(register_backoff * 2, interval),
                                    std::chrono::milliseconds(5000));
        const int after = RetryAfterMs(s);
        wait = after >= 0 ? std::chrono::milliseconds(after)
                          : JitterMs(register_backoff.count() / 2,
                                     register_backoff.count());
      } else {
        register_backoff = std::chrono::milliseconds(0);
      }
      if (!s.ok()) {
        // ALREADY_EXISTS: our previous incarnation has not timed out yet.
        if (!IsUnreachable(s))
          LogWarning(absl::StrCat("register node ", options_.node_id, ": ",
                                  s.error_message()));
        continue;
      }
      timeout_ms = resp.heartbeat_timeout_ms();
      interval =
          std::chrono::milliseconds(std::max<uint32_t>(timeout_ms / 5, 20));
      take_interval(resp.heartbeat_interval_ms());
      {
        std::lock_guard<std::mutex> lock(mu_);
        acked_.clear();
        handled_.clear();
        dropped_logged_ =
            reports_dropped_.load();  // the next drop is worth a line again
        epoch_ = resp.epoch();
        NoteIncarnationLocked(resp.incarnation());
      }
      previous_epoch = resp.epoch();
      WriteEpochFile(options_.epoch_file, resp.epoch());
      LogInfo(absl::StrCat("node ", options_.node_id, " registered with ",
                           options_.coordinator, " at epoch ", resp.epoch(),
                           options_.spare ? " (spare)" : ""));
      // What the engine recovered at start was reported, if at all, under
      // an epoch of the previous life: once, under this one (without mu_:
      // the engine reports through Report, under its own lock).
      if (engine_ != nullptr && !recovered_reported_) {
        recovered_reported_ = true;
        engine_->ReportRecovered();
      }
    }
    cv1::HeartbeatRequest req;
    req.set_node_id(options_.node_id);
    req.set_epoch(epoch_.load());
    {
      std::lock_guard<std::mutex> lock(mu_);
      *req.mutable_acked_order_ids() = {acked_.begin(), acked_.end()};
    }
    if (beacons_)
      for (auto& p : beacons_->Snapshot(BeaconMonitor::Clock::now()))
        *req.add_progress() = std::move(p);
    AddNetResults(&req);
    AddHealthReport(&req);
    if (options_.replicas != nullptr)
      if (std::optional<HolderRefusal> r = options_.replicas->Refused()) {
        // The coordinator takes 1024 printable characters.
        std::string reason = r->reason.substr(0, 1000);
        for (char& c : reason)
          if (c < 0x20 || c > 0x7e) c = '?';
        req.mutable_replica_refused()->set_holder_node_id(r->holder);
        req.mutable_replica_refused()->set_reason(std::move(reason));
      }
    cv1::HeartbeatResponse resp;
    // Through a relay, at most one interval: a dead relay costs one
    // interval of silence before the call goes directly.
    const std::chrono::milliseconds timeout =
        std::min(options_.rpc_timeout, interval * 4);
    bool relayed = false;
    grpc::Status s =
        rpc_->InvokeRelayed(&cv1::Coordinator::Stub::Heartbeat, req, &resp,
                            timeout, std::min(timeout, interval), &relayed);
    if (s.ok() && options_.on_heartbeat) options_.on_heartbeat(relayed);
    note(s);
    if (!s.ok()) {
      if (Fenced(s)) {
        LogWarning(absl::StrCat("node ", options_.node_id, " fenced at epoch ",
                                req.epoch(), ": ", s.error_message(),
                                "; registering again"));
        std::lock_guard<std::mutex> lock(mu_);
        epoch_ = 0;
        // Nothing committed under the fenced epoch may count.
        std::erase_if(reports_,
                      [&](const Queued& q) { return q.epoch == req.epoch(); });
        std::erase_if(soft_, [&](const auto& kv) {
          return kv.second.staged.epoch == req.epoch();
        });
      }
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Acknowledged ones are gone from the coordinator's queue now.
      std::erase_if(acked_, [&](uint64_t id) {
        for (uint64_t a : req.acked_order_ids())
          if (a == id) return true;
        return false;
      });
    }
    // The cluster grew or shrank: the coordinator's interval from now on.
    take_interval(resp.heartbeat_interval_ms());
    wait = interval;
    {
      std::lock_guard<std::mutex> lock(mu_);
      NoteIncarnationLocked(resp.incarnation());
      for (const cv1::Assignment& a : resp.assignments()) {
        // Committed steps need no re-sending after a coordinator restart.
        if (a.has_last_good())
          std::erase_if(soft_, [&](const auto& kv) {
            return std::get<0>(kv.first) == a.job() &&
                   std::get<1>(kv.first) <= a.last_good_step();
          });
        // The oldest step the job may still restore; 0 keeps everything.
        uint64_t keep = a.has_last_good() ? a.last_good_step() : 0;
        if (a.has_restore_step()) keep = std::min(keep, a.restore_step());
        Hosting h{{a.ranks().begin(), a.ranks().end()}, keep};
        Hosting& cur = hosting_[a.job()];
        if (cur.ranks != h.ranks || cur.keep_from != h.keep_from) {
          cur = std::move(h);
          hosting_changed_ = true;
          cv_.notify_all();
        }
      }
    }
    if (beacons_) {
      std::map<std::string, std::vector<uint32_t>> hosted;
      for (const cv1::Assignment& a : resp.assignments())
        hosted[a.job()].assign(a.ranks().begin(), a.ranks().end());
      beacons_->SetHosted(hosted);
    }
    if (options_.replicas != nullptr) {
      std::optional<ReplicaPeer> target;
      if (resp.has_replica_target() && resp.replica_target().port() != 0 &&
          resp.replica_target().port() <= 65535 &&
          !resp.replica_target().host().empty())
        target = ReplicaPeer{resp.replica_target().node_id(),
                             resp.replica_target().host(),
                             resp.replica_target().port()};
      options_.replicas->SetTarget(std::move(target));
    }
    NetResultsSent(req);
    TakeHealthOrder(req, resp);
    TakeOrders(resp);
    TakeNetProbes(resp);
    ReapOrders();
  } while (WaitFor(wait));
}

}  // namespace ckpt::daemon
