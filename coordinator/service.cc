#include "coordinator/service.h"

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/admission.h"
#include "coordinator/client/leader_channel.h"
#include "coordinator/watch_service.h"
#include "util/log.h"
#include "util/rpc_service.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

template <typename Resp>
grpc::Status Answer(absl::StatusOr<Resp> r, Resp* out) {
  if (!r.ok()) return ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}

// A relay batch and the arena it is parsed on: the arena's first block
// holds a typical batch, and the blocks grow to 256 KiB for the largest.
struct ArenaBatch {
  static google::protobuf::ArenaOptions Options() {
    google::protobuf::ArenaOptions o;
    o.start_block_size = 32 << 10;
    o.max_block_size = 256 << 10;
    return o;
  }
  google::protobuf::Arena arena{Options()};
  v1::RelayBatchRequest* req =
      google::protobuf::Arena::CreateMessage<v1::RelayBatchRequest>(&arena);
};

// As RpcService::ParseRequest: INVALID_ARGUMENT naming the field.
grpc::Status ParseBytes(const grpc::ByteBuffer& in,
                        google::protobuf::Message* req) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (in.Valid() && in.Dump(&slices).ok())
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (req->ParseFromString(bytes)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      rpc::DescribeParseFailure(*req->GetDescriptor(), bytes));
}

void SerializeTo(const google::protobuf::Message& resp, grpc::ByteBuffer* out) {
  std::string bytes = resp.SerializeAsString();
  grpc::Slice slice(std::move(bytes));
  *out = grpc::ByteBuffer(&slice, 1);
}

// Relay refusals in the log, with the relay's id: at most one line a
// second (a misconfigured relay would log at its batch rate), the lines
// left out counted in the next.
class RelayRefusalLog {
 public:
  void Note(const std::string& relay_id, const std::string& what) {
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = last_ms_.load();
    if (now - last < 1000 || !last_ms_.compare_exchange_strong(last, now)) {
      left_out_.fetch_add(1);
      return;
    }
    const uint64_t more = left_out_.exchange(0);
    LogWarning(absl::StrCat(
        "relay ", QuotePrefix(relay_id), ": ", what,
        more ? absl::StrCat(" (and ", more, " more relay refusals since)")
             : ""));
  }

 private:
  std::atomic<int64_t> last_ms_{INT64_MIN / 2};
  std::atomic<uint64_t> left_out_{0};
};

// The first refused item of an applied batch, and how many were refused;
// empty when none.
std::string RefusedItems(const v1::RelayBatchResponse& resp) {
  int refused = 0;
  std::string first;
  auto note = [&](const v1::RelayedStatus& st, const char* list, int i) {
    if (st.code() == 0) return;
    if (refused++ == 0)
      first = absl::StrCat(
          list, "[", i, "]: ",
          absl::StatusCodeToString(static_cast<absl::StatusCode>(st.code())),
          ": ", st.message());
  };
  for (int i = 0; i < resp.heartbeats_size(); ++i)
    note(resp.heartbeats(i).status(), "heartbeats", i);
  for (int i = 0; i < resp.reports_size(); ++i)
    note(resp.reports(i).status(), "reports", i);
  if (refused == 0) return "";
  return absl::StrCat(refused, " of ",
                      resp.heartbeats_size() + resp.reports_size(),
                      " items refused, the first ", first);
}

// A request that does not parse is INVALID_ARGUMENT naming the field (see
// RpcService); the Coordinator validates every field it is given.
// Heartbeats, ReportShards and RegisterNode (what every node sends, and
// what a storm is made of) are served on gRPC's callback API through a
// KindQueue each (admission.h): no gRPC thread waits for the state lock or
// a durable write for them, and gRPC never refuses them for want of a
// thread. The rest (admin and rare calls) stay on the synchronous pool.
class Service final : public rpc::RpcService {
 public:
  Service(AuthPolicy auth, Leadership leadership,
          std::atomic<int>* max_inflight, const ServerLimits& limits)
      : RpcService(
            google::protobuf::DescriptorPool::generated_pool()
                ->FindServiceByName(v1::Coordinator::service_full_name())),
        auth_(std::move(auth)),
        leadership_(std::move(leadership)),
        max_inflight_(max_inflight),
        // Heartbeats: the state lock for a moment, no durable wait.
        heartbeats_("heartbeat", 2, limits.max_queued_heartbeats, 200),
        // Reports and registrations wait for the group commit: enough
        // workers that a group holds many of them. Reports are applied in
        // groups of up to 64 calls (Coordinator::ApplyReportGroup), one
        // worker each while it waits; the herd beyond waits queued.
        reports_(
            "report", 64,
            std::max(limits.max_inflight_reports, limits.max_queued_reports),
            100),
        queued_reports_(
            std::max(limits.max_inflight_reports, limits.max_queued_reports)),
        registrations_("registration", 8, limits.max_inflight_reports, 500),
        // A relay's batch: its heartbeats in one hold of the state lock,
        // its reports in groups of 64 calls (Coordinator::ApplyRelayBatch);
        // the workers hold the lock in turn and never wait for a durable
        // write (one thread, relay_answers_, waits for the group commits
        // in order and answers), so a few are enough: 4 keep one applying
        // while others parse, build and hand over. The bound counts a
        // batch until it is answered: ckpt-relay's --max-in-flight (4)
        // per relay at 16,384 nodes in relays of 64 (256 relays).
        relays_("relay batch", 4, limits.max_queued_relay_batches, 100),
        relay_answers_("relay answer", 1, std::numeric_limits<int>::max(), 0),
        relay_capacity_(limits.max_queued_relay_batches) {
    // First: their indices among the methods are 0, 1 and 2.
    AddQueued<v1::HeartbeatRequest>(
        0, "Heartbeat", &heartbeats_,
        [this](const v1::HeartbeatRequest& r) { return c_->Heartbeat(r); },
        [this](const v1::HeartbeatRequest& r) {
          // Heard before admission: a shed heartbeat still shows life.
          c_->Heard(r.node_id(), r.epoch());
          c_->options().metrics->DirectCall(
              CoordinatorMetrics::DirectKind::kHeartbeat);
        },
        [this](const v1::HeartbeatRequest& r) {
          // The refusal is its answer: the node comes back after it.
          c_->hearing().NoteShed();
          c_->HeartbeatAnswered(r.node_id(), r.epoch());
        },
        [this](grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest& r,
               grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out) {
          return FastHeartbeat(ctx, r, reactor, out);
        });
    AddQueued<v1::ReportShardsRequest>(
        1, "ReportShards", &reports_,
        [this](const v1::ReportShardsRequest& r) {
          return c_->ReportShards(r);
        },
        [this](const v1::ReportShardsRequest&) {
          c_->options().metrics->DirectCall(
              CoordinatorMetrics::DirectKind::kReport);
        });
    AddQueued<v1::RegisterNodeRequest>(
        2, "RegisterNode", &registrations_,
        [this](const v1::RegisterNodeRequest& r) {
          return c_->RegisterNode(r);
        });
    AddRelayBatch(3);
    AddUnary("RegisterJob", this, &Service::RegisterJob);
    AddUnary("ReportShard", this, &Service::ReportShard);
    AddUnary("ReportTrainerExit", this, &Service::ReportTrainerExit);
    AddUnary("GetCluster", this, &Service::GetCluster);
    AddUnary("Rollback", this, &Service::Rollback);
    AddUnary("Resume", this, &Service::Resume);
    AddUnary("Events", this, &Service::Events);
    AddUnary("ReportFallback", this, &Service::ReportFallback);
    AddUnary("ReportStacks", this, &Service::ReportStacks);
    AddUnary("GetStacks", this, &Service::GetStacks);
    AddUnary("Cordon", this, &Service::Cordon);
    AddUnary("Uncordon", this, &Service::Uncordon);
    AddUnary("CheckHealth", this, &Service::CheckHealth);
    AddUnary("ReportNodeCheck", this, &Service::ReportNodeCheck);
    AddUnary("ShardSources", this, &Service::ShardSources);
    AddUnary("StepIndex", this, &Service::StepIndex);
  }
  ~Service() override { StopQueues(); }

  // Answers what was admitted, then stops the workers (after the server
  // stopped taking calls).
  void StopQueues() {
    heartbeats_.Stop();
    reports_.Stop();
    registrations_.Stop();
    relays_.Stop();
    relay_answers_.Stop();
  }
  // 0 sheds every report call and registration (tests, an operator);
  // else n registrations, and the queued bound of reports.
  void SetReportCapacity(int n) {
    reports_.SetCapacity(n <= 0 ? 0 : std::max(n, queued_reports_));
    registrations_.SetCapacity(n);
  }
  void SetHeartbeatCapacity(int n) { heartbeats_.SetCapacity(n); }
  void SetRelayCapacity(int n) {
    relay_capacity_.store(std::max(n, 0));
    relays_.SetCapacity(n);
  }
  grpc::Status RegisterJob(grpc::ServerContext*,
                           const v1::RegisterJobRequest* req,
                           v1::RegisterJobResponse* resp) {
    return Answer(c_->RegisterJob(*req), resp);
  }
  grpc::Status ReportShard(grpc::ServerContext*,
                           const v1::ReportShardRequest* req,
                           v1::ReportShardResponse* resp) {
    Admission a(this);
    if (!a.ok()) return a.Refusal();
    return Answer(c_->ReportShard(*req), resp);
  }
  grpc::Status ReportFallback(grpc::ServerContext*,
                              const v1::ReportFallbackRequest* req,
                              v1::ReportFallbackResponse* resp) {
    Admission a(this);
    if (!a.ok()) return a.Refusal();
    return Answer(c_->ReportFallback(*req), resp);
  }
  grpc::Status ReportStacks(grpc::ServerContext*,
                            const v1::ReportStacksRequest* req,
                            v1::ReportStacksResponse* resp) {
    Admission a(this);
    if (!a.ok()) return a.Refusal();
    return Answer(c_->ReportStacks(*req), resp);
  }
  grpc::Status GetStacks(grpc::ServerContext*, const v1::GetStacksRequest* req,
                         v1::GetStacksResponse* resp) {
    return Answer(c_->GetStacks(*req), resp);
  }
  grpc::Status Cordon(grpc::ServerContext*, const v1::CordonRequest* req,
                      v1::CordonResponse* resp) {
    return Answer(c_->Cordon(*req), resp);
  }
  grpc::Status Uncordon(grpc::ServerContext*, const v1::UncordonRequest* req,
                        v1::UncordonResponse* resp) {
    return Answer(c_->Uncordon(*req), resp);
  }
  grpc::Status CheckHealth(grpc::ServerContext*,
                           const v1::CheckHealthRequest* req,
                           v1::CheckHealthResponse* resp) {
    return Answer(c_->CheckHealth(*req), resp);
  }
  grpc::Status ReportNodeCheck(grpc::ServerContext*,
                               const v1::ReportNodeCheckRequest* req,
                               v1::ReportNodeCheckResponse* resp) {
    return Answer(c_->ReportNodeCheck(*req), resp);
  }
  grpc::Status ShardSources(grpc::ServerContext*,
                            const v1::ShardSourcesRequest* req,
                            v1::ShardSourcesResponse* resp) {
    Admission a(this);
    if (!a.ok()) return a.Refusal();
    return Answer(c_->ShardSources(*req), resp);
  }
  grpc::Status StepIndex(grpc::ServerContext*, const v1::StepIndexRequest* req,
                         v1::StepIndexResponse* resp) {
    Admission a(this);
    if (!a.ok()) return a.Refusal();
    return Answer(c_->StepIndex(*req), resp);
  }
  grpc::Status ReportTrainerExit(grpc::ServerContext*,
                                 const v1::ReportTrainerExitRequest* req,
                                 v1::ReportTrainerExitResponse* resp) {
    return Answer(c_->ReportTrainerExit(*req), resp);
  }
  grpc::Status GetCluster(grpc::ServerContext*, const v1::GetClusterRequest*,
                          v1::GetClusterResponse* resp) {
    *resp = c_->GetCluster();
    return grpc::Status::OK;
  }
  grpc::Status Rollback(grpc::ServerContext*, const v1::RollbackRequest* req,
                        v1::RollbackResponse* resp) {
    return Answer(c_->Rollback(*req), resp);
  }
  grpc::Status Resume(grpc::ServerContext*, const v1::ResumeRequest* req,
                      v1::ResumeResponse* resp) {
    return Answer(c_->Resume(*req), resp);
  }
  grpc::Status Events(grpc::ServerContext*, const v1::EventsRequest* req,
                      v1::EventsResponse* resp) {
    if (!req->job().empty())
      if (absl::Status s = ValidateJobName(req->job(), "job"); !s.ok())
        return ToGrpc(s);
    *resp = c_->Events(*req);
    return grpc::Status::OK;
  }

  // Written once, before serving_ turns true; read only by admitted calls.
  void Serve(Coordinator* c) {
    c_ = c;
    serving_.store(true, std::memory_order_release);
  }

  // OK while this server leads (serves a Coordinator and, under HA, still
  // holds the leadership); else UNAVAILABLE "not leader; ...", and
  // *leader the address clients should go to ("" when none is elected):
  // the caller puts it in the kLeaderMetadataKey trailer. The message names
  // it too, for people and for clients older than the trailer.
  grpc::Status LeaderCheck(std::string* leader) const {
    leader->clear();
    if (serving_.load(std::memory_order_acquire) &&
        (!leadership_.leading || leadership_.leading()))
      return grpc::Status::OK;
    if (leadership_.leader) *leader = leadership_.leader();
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        leader->empty() ? "not leader; no leader elected yet"
                                        : "not leader; leader is " + *leader);
  }

  // Leadership, then who may call what (auth.h); for the watch service too.
  grpc::Status AdmitCall(grpc::ServerContextBase* ctx,
                         const std::string& method,
                         const google::protobuf::Message& request) {
    std::string leader;
    if (grpc::Status s = LeaderCheck(&leader); !s.ok()) {
      if (!leader.empty()) ctx->AddTrailingMetadata(kLeaderMetadataKey, leader);
      return s;
    }
    return Authorize(*ctx, method, request, auth_);
  }

 private:
  // A heartbeat on the gRPC thread that received it when the state lock
  // is free at once (Coordinator::TryHeartbeat: it never waits for the
  // lock nor for a durable write), within the heartbeats' admission bound
  // (KindQueue::TryRunHere): no switch to a heartbeat worker and back
  // (the kernel's context switches were over a quarter of the
  // coordinator's CPU at 2,048 nodes). False, having done nothing but
  // hear it, when the lock is busy or the bound full: the caller queues
  // it or sheds it. A refusal that must wait for a durable write is
  // answered by a heartbeat worker after the wait (or shed).
  bool FastHeartbeat(grpc::CallbackServerContext* ctx,
                     const v1::HeartbeatRequest& req,
                     grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out) {
    return heartbeats_.TryRunHere(
        [&] { return HeartbeatHere(ctx, req, reactor, out); });
  }
  bool HeartbeatHere(grpc::CallbackServerContext* ctx,
                     const v1::HeartbeatRequest& req,
                     grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out) {
    uint64_t durable_seq = 0;
    std::optional<absl::StatusOr<v1::HeartbeatResponse>> r =
        c_->TryHeartbeat(req, &durable_seq);
    if (!r.has_value()) return false;
    if (durable_seq == 0) {
      if (r->ok()) SerializeTo(**r, out);
      reactor->Finish(ToGrpc(r->status()));
      return true;
    }
    const absl::Status refusal = r->status();
    if (heartbeats_.TryRun([this, reactor, durable_seq, refusal] {
          const absl::Status w = c_->WaitDurable(durable_seq);
          reactor->Finish(ToGrpc(w.ok() ? refusal : w));
        }))
      return true;
    c_->hearing().NoteShed();
    const int after = heartbeats_.RetryAfterMs();
    ctx->AddTrailingMetadata(kRetryAfterMetadataKey, std::to_string(after));
    reactor->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("coordinator busy: too many heartbeat calls; retry "
                     "after ",
                     after, " ms")));
    return true;
  }

  // Registers method `name` (index `index` among those registered) on the
  // callback API: parsed and admitted (leadership, authorisation) on the
  // gRPC thread, `heard` run there too, then `fast` (if any) may answer it
  // there and then; else run by `queue`'s workers, or refused
  // RESOURCE_EXHAUSTED with kRetryAfterMetadataKey when the queue is full
  // (`shed` runs then).
  template <class Req, class Run>
  void AddQueued(
      int index, const char* name, KindQueue* queue, Run run,
      std::function<void(const Req&)> heard = nullptr,
      std::function<void(const Req&)> shed = nullptr,
      std::function<bool(grpc::CallbackServerContext*, const Req&,
                         grpc::ServerUnaryReactor*, grpc::ByteBuffer*)>
          fast = nullptr) {
    paths_.push_back(
        absl::StrCat("/", v1::Coordinator::service_full_name(), "/", name));
    AddMethod(new grpc::internal::RpcServiceMethod(
        paths_.back().c_str(), grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
    MarkMethodRawCallback(
        index,
        new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer,
                                                 grpc::ByteBuffer>(
            [this, name, queue, run, heard, shed, fast](
                grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                grpc::ByteBuffer* out) {
              grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
              auto req = std::make_shared<Req>();
              grpc::Status s = ParseBytes(*in, req.get());
              if (s.ok()) s = AdmitCall(ctx, name, *req);
              if (s.ok()) s = ToGrpc(ValidateNodeId(req->node_id()));
              if (!s.ok()) {
                reactor->Finish(s);
                return reactor;
              }
              if (heard) heard(*req);
              if (fast && fast(ctx, *req, reactor, out)) return reactor;
              if (queue->TryRun([reactor, req, out, run] {
                    auto r = run(*req);
                    if (r.ok()) SerializeTo(*r, out);
                    reactor->Finish(ToGrpc(r.status()));
                  }))
                return reactor;
              if (shed) shed(*req);
              const int after = queue->RetryAfterMs();
              ctx->AddTrailingMetadata(kRetryAfterMetadataKey,
                                       std::to_string(after));
              reactor->Finish(grpc::Status(
                  grpc::StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat("coordinator busy: too many ", queue->kind(),
                               " calls; retry after ", after, " ms")));
              return reactor;
            }));
  }

  // RelayBatch (index `index` among the methods) on the callback API:
  // parsed, admitted (leadership, a relay identity under mTLS) and its
  // own fields checked on the gRPC thread, which then hears every
  // heartbeat item (a shed batch's nodes stay alive) and hands the batch
  // to relays_, whose workers apply it (Coordinator::ApplyRelayBatch:
  // the state lock) and hand what waits for the group commit to
  // relay_answers_, which answers. A refusal of the whole batch hears and
  // applies nothing of it; a shed one (the bound counts a batch until it
  // is answered) still heard its heartbeats.
  void AddRelayBatch(int index) {
    paths_.push_back(
        absl::StrCat("/", v1::Coordinator::service_full_name(), "/RelayBatch"));
    AddMethod(new grpc::internal::RpcServiceMethod(
        paths_.back().c_str(), grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
    MarkMethodRawCallback(
        index, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer,
                                                        grpc::ByteBuffer>(
                   [this](grpc::CallbackServerContext* ctx,
                          const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
                     return ServeRelayBatch(ctx, in, out);
                   }));
  }

  grpc::ServerUnaryReactor* ServeRelayBatch(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    // Parsed on an arena: a batch of 40 nodes' items is ~1,000
    // strings and messages, a malloc and a free each otherwise
    // (malloc was a fifth of the coordinator's CPU behind relays).
    auto batch = std::make_shared<ArenaBatch>();
    std::shared_ptr<v1::RelayBatchRequest> req(batch, batch->req);
    grpc::Status s = ParseBytes(*in, req.get());
    if (s.ok()) s = AdmitCall(ctx, "RelayBatch", *req);
    if (s.ok()) s = ToGrpc(Coordinator::ValidateRelayBatch(*req));
    if (!s.ok()) {
      if (serving_.load(std::memory_order_acquire))
        c_->options().metrics->RelayBatch("refused", 0, 0);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE)
        relay_log_.Note(req->relay_id(),
                        absl::StrCat("batch refused: ", s.error_message()));
      reactor->Finish(s);
      return reactor;
    }
    c_->HearRelayBatch(*req);
    // Counted until answered, its durable wait included.
    if (relay_pending_.fetch_add(1) < relay_capacity_.load() &&
        relays_.TryRun([this, reactor, req, out] {
          bool waits = false;
          auto finish =
              std::make_shared<std::function<void(v1::RelayBatchResponse*)>>(
                  c_->ApplyRelayBatch(*req, &waits));
          auto answer = [this, reactor, req, out, finish] {
            v1::RelayBatchResponse resp;
            (*finish)(&resp);
            SerializeTo(resp, out);
            reactor->Finish(grpc::Status::OK);
            relay_pending_.fetch_sub(1);
            c_->options().metrics->RelayBatch("applied", req->heartbeats_size(),
                                              req->reports_size());
            if (std::string refused = RefusedItems(resp); !refused.empty())
              relay_log_.Note(req->relay_id(), refused);
          };
          if (!waits || !relay_answers_.TryRun(answer)) answer();
        }))
      return reactor;
    relay_pending_.fetch_sub(1);
    c_->RelayBatchShed(*req);
    c_->options().metrics->RelayBatch("shed", req->heartbeats_size(),
                                      req->reports_size());
    const int after = relays_.RetryAfterMs();
    ctx->AddTrailingMetadata(kRetryAfterMetadataKey, std::to_string(after));
    relay_log_.Note(req->relay_id(), absl::StrCat("batch shed: too many relay "
                                                  "batches; retry after ",
                                                  after, " ms"));
    reactor->Finish(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat("coordinator busy: too many relay batch "
                                  "calls; retry after ",
                                  after, " ms")));
    return reactor;
  }

  grpc::Status Admit(grpc::ServerContext* ctx, const std::string& method,
                     const google::protobuf::Message& request) override {
    return AdmitCall(ctx, method, request);
  }

  // Counts a report call in flight while it lives; refused beyond the limit.
  class Admission {
   public:
    explicit Admission(Service* s) : s_(s) {
      ok_ = s_->inflight_.fetch_add(1) < s_->max_inflight_->load();
    }
    ~Admission() { s_->inflight_.fetch_sub(1); }
    bool ok() const { return ok_; }
    grpc::Status Refusal() const {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "coordinator busy: too many report or registration "
                          "calls in flight; retry with backoff");
    }

   private:
    Service* const s_;
    bool ok_ = false;
  };

  const AuthPolicy auth_;
  const Leadership leadership_;
  std::atomic<bool> serving_{false};
  Coordinator* c_ = nullptr;
  std::atomic<int>* const max_inflight_;
  std::atomic<int> inflight_{0};
  std::deque<std::string> paths_;  // gRPC keeps pointers to them
  KindQueue heartbeats_;
  KindQueue reports_;
  const int queued_reports_;  // reports_'s bound when not shedding
  KindQueue registrations_;
  KindQueue relays_;
  // Waits for applied batches' group commits, in order, and answers them.
  KindQueue relay_answers_;
  std::atomic<int> relay_capacity_;  // batches admitted until answered
  std::atomic<int> relay_pending_{0};
  RelayRefusalLog relay_log_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    std::unique_ptr<Coordinator> coordinator, const std::string& listen,
    ServerLimits limits) {
  return Start(std::move(coordinator), listen, ServerSecurity{}, limits);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    std::unique_ptr<Coordinator> coordinator, const std::string& listen,
    const ServerSecurity& security, ServerLimits limits) {
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> s =
      Listen(listen, security, Leadership{}, limits);
  if (s.ok()) (*s)->Promote(std::move(coordinator));
  return s;
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>>
CoordinatorServer::StartStandby(const std::string& listen,
                                const ServerSecurity& security,
                                Leadership leadership, ServerLimits limits) {
  return Listen(listen, security, std::move(leadership), limits);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Listen(
    const std::string& listen, const ServerSecurity& security,
    Leadership leadership, ServerLimits limits) {
  if (limits.max_threads < 4)
    return absl::InvalidArgumentError("max_threads: must be at least 4");
  if (limits.max_inflight_reports < 0)
    return absl::InvalidArgumentError("max_inflight_reports: negative");
  if (limits.max_queued_heartbeats < 0)
    return absl::InvalidArgumentError("max_queued_heartbeats: negative");
  if (limits.max_queued_reports < 0)
    return absl::InvalidArgumentError("max_queued_reports: negative");
  if (limits.max_queued_relay_batches < 0)
    return absl::InvalidArgumentError("max_queued_relay_batches: negative");
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      LoadServerCredentials(security.tls);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer);
  s->max_inflight_reports_ = limits.max_inflight_reports;
  AuthPolicy auth;
  auth.mtls = security.tls.enabled();
  auth.admin_identities = security.admin_identities;
  auth.relay_identities = security.relay_identities;
  auto service =
      std::make_unique<Service>(std::move(auth), std::move(leadership),
                                &s->max_inflight_reports_, limits);
  Service* svc = service.get();
  s->service_ = std::move(service);
  s->watch_ = std::make_unique<WatchService>(
      [svc](grpc::ServerContextBase* ctx, const std::string& method,
            const google::protobuf::Message& req) {
        return svc->AdmitCall(ctx, method, req);
      },
      [svc](std::string* leader) { return svc->LeaderCheck(leader); });
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("ckpt-coordinator");
  quota.SetMaxThreads(limits.max_threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS,
                              2);
  builder.SetSyncServerOption(
      grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  // A node's batch of reports carries each rank's layout index (at most
  // 16 MiB each; the agent caps a batch's bytes below this).
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.AddListeningPort(listen, *creds, &s->port_);
  builder.RegisterService(s->service_.get());
  builder.RegisterService(s->watch_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0)
    return absl::UnavailableError("--listen: cannot listen on " + listen);
  return s;
}

void CoordinatorServer::Promote(std::unique_ptr<Coordinator> coordinator) {
  coordinator_ = std::move(coordinator);
  // Nodes could not reach anyone while the state loaded (a failover): their
  // heartbeat windows start now, or a slow takeover would declare them dead.
  coordinator_->StartServing();
  static_cast<Service*>(service_.get())->Serve(coordinator_.get());
  watch_->Serve(coordinator_.get());
  promoted_.store(true, std::memory_order_release);
  ticker_ = std::thread([this] { TickLoop(); });
  auditor_ = std::thread([this] { AuditLoop(); });
  ear_ = std::thread([this] { EarLoop(); });
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

std::chrono::milliseconds CoordinatorServer::tick_period() const {
  if (!coordinator_)
    return std::chrono::milliseconds(20);  // a standby: the most it will be
  auto period = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(
                             coordinator_->options().heartbeat_timeout / 4),
                         std::chrono::milliseconds(20));
  return std::max(period, std::chrono::milliseconds(1));
}

void CoordinatorServer::SetMaxInflightReports(int n) {
  max_inflight_reports_ = std::max(n, 0);
  static_cast<Service*>(service_.get())->SetReportCapacity(n);
}

void CoordinatorServer::SetMaxQueuedHeartbeats(int n) {
  static_cast<Service*>(service_.get())->SetHeartbeatCapacity(n);
}

void CoordinatorServer::SetMaxQueuedRelayBatches(int n) {
  static_cast<Service*>(service_.get())->SetRelayCapacity(n);
}

void CoordinatorServer::TickLoop() {
  using Clock = std::chrono::steady_clock;
  const auto period = tick_period();
  // Woken this much later than due, the process could not run (starved of
  // CPU, stopped): it could not hear the nodes either (hearing.h).
  const int64_t late_limit_ms = std::max<int64_t>(
      coordinator_->options().heartbeat_timeout.count() / 4, 100);
  std::unique_lock<std::mutex> lock(mu_);
  auto due = Clock::now() + period;
  while (!cv_.wait_until(lock, due, [this] { return stopping_; })) {
    lock.unlock();
    const int64_t late_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                              due)
            .count();
    if (coordinator_->hearing().NoteWake(late_ms, late_limit_ms))
      LogWarning(absl::StrCat("the failure detector woke ", late_ms,
                              " ms late; every heartbeat window restarts now"));
    absl::Status s = coordinator_->Tick();
    if (!s.ok()) LogWarning(absl::StrCat("tick: ", s.message()));
    ticks_.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
    due = Clock::now() + period;
  }
}

void CoordinatorServer::AuditLoop() {
  // Often enough that a deposed leader's late write does not stand for
  // long; each round is one small read per job.
  const auto period = std::clamp(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          coordinator_->options().heartbeat_timeout),
      std::chrono::milliseconds(200), std::chrono::milliseconds(5000));
  std::string last;
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    absl::Status s = coordinator_->AuditManifests();
    std::string said = s.ok() ? "" : std::string(s.message());
    if (said != last && !said.empty())
      LogWarning(absl::StrCat("checking global manifests: ", said));
    last = said;
    lock.lock();
  }
}

void CoordinatorServer::EarLoop() {
  // A heartbeat of no node, through this server's own call path (in
  // process: no TLS, no network): refused at once by the handler, so its
  // round trip is how long a heartbeat waits before the server reads it.
  // Longer than max(timeout/4, 100 ms): the nodes' heartbeats waited as
  // long, unread; the coordinator could not hear them (hearing.h).
  using Clock = std::chrono::steady_clock;
  const int64_t limit_ms = std::max<int64_t>(
      coordinator_->options().heartbeat_timeout.count() / 4, 100);
  const auto period = std::chrono::milliseconds(100);
  auto stub = v1::Coordinator::NewStub(
      server_->InProcessChannel(grpc::ChannelArguments()));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(4 * limit_ms));
    v1::HeartbeatRequest req;  // no node_id: INVALID_ARGUMENT
    v1::HeartbeatResponse resp;
    const auto sent = Clock::now();
    grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
    const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           Clock::now() - sent)
                           .count();
    if (ms > limit_ms) {
      coordinator_->hearing().RestartWindows(absl::StrCat(
          "a heartbeat took ", ms, " ms to be read (", s.error_message(), ")"));
      LogWarning(absl::StrCat("heartbeats wait ", ms,
                              " ms to be read; every heartbeat window "
                              "restarts now"));
    }
    lock.lock();
  }
}

void CoordinatorServer::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stopping_; });
}

void CoordinatorServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !ticker_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  if (auditor_.joinable()) auditor_.join();
  if (ear_.joinable()) ear_.join();
  if (watch_)
    watch_->Stop();  // ends the open streams, or Shutdown waits for them
  if (server_)
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  if (service_) static_cast<Service*>(service_.get())->StopQueues();
}

}  // namespace ckpt::coordinator
