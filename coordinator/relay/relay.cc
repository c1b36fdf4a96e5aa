#include "coordinator/relay/relay.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/auth.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "coordinator/service.h"
#include "util/log.h"

namespace ckpt::coordinator {

namespace v1 = ::ckpt::coord::v1;

// One node call, gathered: gRPC keeps the request, the response and the
// context alive until the reactor finishes.
struct Relay::Item {
  grpc::CallbackServerContext* ctx = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;
  const v1::HeartbeatRequest* heartbeat = nullptr;  // or
  v1::HeartbeatResponse* heartbeat_response = nullptr;
  const v1::ReportShardsRequest* reports = nullptr;
  v1::ReportShardsResponse* reports_response = nullptr;
  std::chrono::system_clock::time_point deadline;  // the node's
  std::chrono::steady_clock::time_point arrived;
  size_t bytes = 0;
};

namespace {

using Clock = std::chrono::steady_clock;
// A batch whose items have no deadline of their own waits this long at
// most.
constexpr std::chrono::milliseconds kMaxBatchTimeout{30000};
// Node calls wait at most this many full batches; beyond, they are
// answered at once with the relay's failure.
constexpr size_t kMaxPendingBatches = 64;

// A trailer value gRPC takes as is: printable ASCII, bounded.
bool PrintableValue(const std::string& v) {
  if (v.empty() || v.size() > 256) return false;
  for (char c : v)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

void FinishFailed(Relay::Item& item, grpc::StatusCode code,
                  const std::string& message) {
  item.ctx->AddTrailingMetadata(kRelayFailedMetadataKey, "1");
  item.reactor->Finish(grpc::Status(code, message));
}

// An item's status as the coordinator gave it (RelayedStatus), with the
// trailers the direct call would have carried. False: the code is not a
// gRPC error code (a malformed answer).
bool FinishRefused(Relay::Item& item, const v1::RelayedStatus& st) {
  if (st.code() < 1 || st.code() > 16) return false;
  if (st.retry_after_ms() > 0)
    item.ctx->AddTrailingMetadata(kRetryAfterMetadataKey,
                                  std::to_string(st.retry_after_ms()));
  if (PrintableValue(st.leader()))
    item.ctx->AddTrailingMetadata(kLeaderMetadataKey, st.leader());
  item.reactor->Finish(
      grpc::Status(static_cast<grpc::StatusCode>(st.code()), st.message()));
  return true;
}

}  // namespace

RelayMetrics::RelayMetrics()
    : items_(prometheus::BuildCounter()
                 .Name("ckpt_relay_items_total")
                 .Help("Node calls the relay gathered, by kind (heartbeat, "
                       "report)")
                 .Register(*registry_)),
      batches_(prometheus::BuildCounter()
                   .Name("ckpt_relay_batches_total")
                   .Help("RelayBatch calls sent to the coordinator")
                   .Register(*registry_)
                   .Add({})),
      failures_(prometheus::BuildCounter()
                    .Name("ckpt_relay_failures_total")
                    .Help("Node calls answered with the relay's own failure "
                          "(ckpt-relay-failed), by reason")
                    .Register(*registry_)),
      denied_(prometheus::BuildCounter()
                  .Name("ckpt_relay_denied_total")
                  .Help("Node calls refused by the relay's authorization "
                        "(a node speaking for another)")
                  .Register(*registry_)
                  .Add({})) {}

class Relay::Service final : public v1::Coordinator::CallbackService {
 public:
  Service(Relay* relay, AuthPolicy auth)
      : relay_(relay), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    auto item = std::make_unique<Item>();
    item->heartbeat = req;
    item->heartbeat_response = resp;
    return Take(ctx, "Heartbeat", *req, std::move(item));
  }
  grpc::ServerUnaryReactor* ReportShards(
      grpc::CallbackServerContext* ctx, const v1::ReportShardsRequest* req,
      v1::ReportShardsResponse* resp) override {
    auto item = std::make_unique<Item>();
    item->reports = req;
    item->reports_response = resp;
    return Take(ctx, "ReportShards", *req, std::move(item));
  }

 private:
  // Authorized as the coordinator would (a node speaks for itself), then
  // gathered; answered by a sender.
  grpc::ServerUnaryReactor* Take(grpc::CallbackServerContext* ctx,
                                 const char* method,
                                 const google::protobuf::Message& req,
                                 std::unique_ptr<Item> item) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (grpc::Status s = Authorize(*ctx, method, req, auth_); !s.ok()) {
      if (relay_->metrics_) relay_->metrics_->Denied();
      reactor->Finish(s);
      return reactor;
    }
    item->ctx = ctx;
    item->reactor = reactor;
    item->deadline = ctx->deadline();
    item->arrived = Clock::now();
    item->bytes = req.ByteSizeLong();
    if (relay_->metrics_)
      relay_->metrics_->Item(item->heartbeat ? "heartbeat" : "report");
    relay_->Push(std::move(item));
    return reactor;
  }

  Relay* const relay_;
  const AuthPolicy auth_;
};

absl::StatusOr<std::unique_ptr<Relay>> Relay::Start(
    const RelayOptions& options, std::shared_ptr<RelayMetrics> metrics) {
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      CoordinatorClient::Create(options.coordinator, options.tls);
  if (!client.ok()) return client.status();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      LoadServerCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<Relay> r(new Relay);
  r->options_ = options;
  r->metrics_ = std::move(metrics);
  r->client_ = std::move(*client);
  // Create parsed the list already.
  absl::StatusOr<std::vector<std::string>> replicas =
      ParseAddressList(options.coordinator, "--coordinator");
  r->longest_send_ =
      options.gather +
      kMaxBatchTimeout * static_cast<int>(replicas.ok() ? replicas->size() : 1);
  AuthPolicy auth;
  auth.mtls = options.tls.enabled();
  r->service_ = std::make_unique<Service>(r.get(), std::move(auth));
  grpc::ServerBuilder builder;
  // A node's ReportShards batch carries each rank's layout index.
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.AddListeningPort(options.listen, *creds, &r->port_);
  builder.RegisterService(r->service_.get());
  r->server_ = builder.BuildAndStart();
  if (!r->server_ || r->port_ == 0)
    return absl::UnavailableError("--listen: cannot listen on " +
                                  options.listen);
  for (int i = 0; i < options.max_in_flight; ++i)
    r->senders_.emplace_back([p = r.get()] { p->SenderLoop(); });
  return r;
}

Relay::~Relay() { Shutdown(); }

void Relay::Shutdown() {
  std::lock_guard<std::mutex> once(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // The senders answer what was gathered (sent while the coordinator
  // answers), so the server's shutdown does not wait for them long.
  if (server_)
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  for (std::thread& t : senders_) t.join();
  senders_.clear();
}

void Relay::Wait() {
  if (server_) server_->Wait();
}

Relay::Progress Relay::progress() const {
  Progress p;
  // answered_ first: it never passes gathered_.
  p.answered = answered_.load();
  p.gathered = gathered_.load();
  return p;
}

void Relay::Push(std::unique_ptr<Item> item) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) {
    lock.unlock();
    FinishFailed(*item, grpc::StatusCode::UNAVAILABLE,
                 "relay " + options_.relay_id + ": stopping");
    return;
  }
  // The coordinator answers slower than the nodes call: beyond a bound
  // the relay carries no more (its nodes go directly, and are heard).
  if (pending_.size() >= kMaxPendingBatches * options_.max_batch) {
    lock.unlock();
    if (metrics_) metrics_->Failed("overflow", 1);
    FinishFailed(*item, grpc::StatusCode::RESOURCE_EXHAUSTED,
                 absl::StrCat("relay ", options_.relay_id, ": ",
                              kMaxPendingBatches, " batches wait already"));
    return;
  }
  pending_.push_back(std::move(item));
  gathered_.fetch_add(1);
  const size_t n = pending_.size();
  lock.unlock();
  // The first item starts a gathering; a full batch goes at once.
  if (n == 1 || n >= options_.max_batch) cv_.notify_all();
}

void Relay::SenderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, nothing left
    const Clock::time_point due = pending_.front()->arrived + options_.gather;
    while (!stopping_ && !pending_.empty() &&
           pending_.size() < options_.max_batch && Clock::now() < due)
      cv_.wait_until(lock, due);
    if (pending_.empty()) continue;  // another sender took them
    std::vector<std::unique_ptr<Item>> batch;
    size_t bytes = 0;
    while (!pending_.empty() && batch.size() < options_.max_batch) {
      const size_t b = pending_.front()->bytes;
      // The coordinator takes kMaxRequestBytes; one node's batch of
      // reports is below kMaxReportBatchBytes, so it always fits alone.
      if (!batch.empty() &&
          bytes + b > static_cast<size_t>(kMaxReportBatchBytes))
        break;
      bytes += b;
      batch.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
    if (!pending_.empty()) cv_.notify_one();  // the rest: another sender
    lock.unlock();
    Send(std::move(batch));
    lock.lock();
  }
}

void Relay::Send(std::vector<std::unique_ptr<Item>> items) {
  const auto now = std::chrono::system_clock::now();
  v1::RelayBatchRequest req;
  req.set_relay_id(options_.relay_id);
  std::vector<Item*> heartbeats, reports;
  auto deadline = now;
  size_t expired = 0;
  for (std::unique_ptr<Item>& it : items) {
    // The node gave up on it (its deadline passed, or it cancelled): not
    // sent, so the coordinator never applies what the node retries
    // elsewhere.
    if (it->deadline <= now || it->ctx->IsCancelled()) {
      answered_.fetch_add(1);
      FinishFailed(*it, grpc::StatusCode::DEADLINE_EXCEEDED,
                   "relay " + options_.relay_id +
                       ": the call's deadline passed before it was sent");
      ++expired;
      continue;
    }
    deadline = std::max(deadline, it->deadline);
    if (it->heartbeat != nullptr) {
      *req.add_heartbeats() = *it->heartbeat;
      heartbeats.push_back(it.get());
    } else {
      *req.add_reports() = *it->reports;
      reports.push_back(it.get());
    }
  }
  if (expired > 0 && metrics_) metrics_->Failed("expired", expired);
  if (heartbeats.empty() && reports.empty()) return;
  const auto timeout = std::clamp(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
      std::chrono::milliseconds(1), kMaxBatchTimeout);
  v1::RelayBatchResponse resp;
  std::multimap<std::string, std::string> trailers;
  const grpc::Status s = client_->Call(&v1::Coordinator::Stub::RelayBatch, req,
                                       &resp, timeout, &trailers);
  if (metrics_) metrics_->Batch();
  const size_t calls = heartbeats.size() + reports.size();
  // The batch came back (the watchdog's progress), counted before any of
  // its calls is finished: a node that has its answer sees it counted.
  answered_.fetch_add(calls);
  auto all = [&](auto&& f) {
    for (Item* it : heartbeats) f(*it);
    for (Item* it : reports) f(*it);
  };
  if (!s.ok()) {
    // The whole batch refused. Load shedding and "not leader" are the
    // coordinator's answers, passed on as they are; anything else is a
    // failure of this relay's (its identity refused included: the nodes
    // may still call the coordinator themselves).
    const auto code = s.error_code();
    auto trailer = [&](const char* key) {
      auto it = trailers.find(key);
      return it == trailers.end() ? std::string() : it->second;
    };
    std::string leader = trailer(kLeaderMetadataKey);
    if (leader.empty()) leader = LeaderHint(s);
    const std::string after = trailer(kRetryAfterMetadataKey);
    const bool answered =
        code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
        (code == grpc::StatusCode::UNAVAILABLE &&
         (!leader.empty() ||
          s.error_message().find("not leader") != std::string::npos));
    const char* reason =
        code == grpc::StatusCode::DEADLINE_EXCEEDED ? "deadline"
        : code == grpc::StatusCode::UNIMPLEMENTED   ? "unimplemented"
        : code == grpc::StatusCode::UNAVAILABLE     ? "unreachable"
                                                    : "refused";
    const std::string message =
        answered
            ? s.error_message()
            : absl::StrCat(
                  "relay ", options_.relay_id, ": RelayBatch to ",
                  client_->current(), ": ",
                  absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
                  s.error_message().empty() ? "" : ": ", s.error_message());
    all([&](Item& it) {
      if (PrintableValue(after))
        it.ctx->AddTrailingMetadata(kRetryAfterMetadataKey, after);
      if (PrintableValue(leader))
        it.ctx->AddTrailingMetadata(kLeaderMetadataKey, leader);
      if (answered)
        it.reactor->Finish(grpc::Status(code, message));
      else
        FinishFailed(it, code, message);
    });
    if (!answered) {
      if (metrics_) metrics_->Failed(reason, calls);
      if (coordinator_ok_.exchange(false))
        LogWarning(absl::StrCat(message,
                                "; its nodes go to the coordinator directly"));
    }
    return;
  }
  if (static_cast<size_t>(resp.heartbeats_size()) != heartbeats.size() ||
      static_cast<size_t>(resp.reports_size()) != reports.size()) {
    const std::string message = absl::StrCat(
        "relay ", options_.relay_id, ": the coordinator answered ",
        resp.heartbeats_size(), " heartbeats and ", resp.reports_size(),
        " report calls for ", heartbeats.size(), " and ", reports.size());
    all([&](Item& it) {
      FinishFailed(it, grpc::StatusCode::INTERNAL, message);
    });
    if (metrics_) metrics_->Failed("malformed", calls);
    LogWarning(message);
    return;
  }
  if (!coordinator_ok_.exchange(true))
    LogInfo(absl::StrCat("relay ", options_.relay_id, ": coordinator ",
                         client_->current(), " answers batches again"));
  size_t malformed = 0;
  auto bad_code = [&](Item& it, int32_t code) {
    ++malformed;
    FinishFailed(it, grpc::StatusCode::INTERNAL,
                 absl::StrCat("relay ", options_.relay_id,
                              ": the coordinator answered status code ", code));
  };
  for (size_t i = 0; i < heartbeats.size(); ++i) {
    v1::RelayedHeartbeat* h = resp.mutable_heartbeats(static_cast<int>(i));
    Item& it = *heartbeats[i];
    if (h->status().code() == 0) {
      it.heartbeat_response->Swap(h->mutable_response());
      it.reactor->Finish(grpc::Status::OK);
    } else if (!FinishRefused(it, h->status())) {
      bad_code(it, h->status().code());
    }
  }
  for (size_t i = 0; i < reports.size(); ++i) {
    v1::RelayedReports* r = resp.mutable_reports(static_cast<int>(i));
    Item& it = *reports[i];
    if (r->status().code() == 0) {
      it.reports_response->Swap(r->mutable_response());
      it.reactor->Finish(grpc::Status::OK);
    } else if (!FinishRefused(it, r->status())) {
      bad_code(it, r->status().code());
    }
  }
  if (malformed > 0 && metrics_) metrics_->Failed("malformed", malformed);
}

}  // namespace ckpt::coordinator
