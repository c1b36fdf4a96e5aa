#include "coordinator/service.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>

#include "coordinator.grpc.pb.h"
#include "coordinator/client/leader_channel.h"
#include "coordinator/watch_service.h"
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

// A request that does not parse is INVALID_ARGUMENT naming the field (see
// RpcService); the Coordinator validates every field it is given.
class Service final : public rpc::RpcService {
 public:
  Service(AuthPolicy auth, Leadership leadership,
          std::atomic<int>* max_inflight)
      : RpcService(
            google::protobuf::DescriptorPool::generated_pool()
                ->FindServiceByName(v1::Coordinator::service_full_name())),
        auth_(std::move(auth)),
        leadership_(std::move(leadership)),
        max_inflight_(max_inflight) {
    AddUnary("RegisterNode", this, &Service::RegisterNode);
    AddUnary("Heartbeat", this, &Service::Heartbeat);
    AddUnary("RegisterJob", this, &Service::RegisterJob);
    AddUnary("ReportShard", this, &Service::ReportShard);
    AddUnary("ReportTrainerExit", this, &Service::ReportTrainerExit);
    AddUnary("GetCluster", this, &Service::GetCluster);
    AddUnary("Rollback", this, &Service::Rollback);
    AddUnary("Events", this, &Service::Events);
    AddUnary("ReportShards", this, &Service::ReportShards);
    AddUnary("ReportFallback", this, &Service::ReportFallback);
    AddUnary("ReportStacks", this, &Service::ReportStacks);
    AddUnary("GetStacks", this, &Service::GetStacks);
    AddUnary("Cordon", this, &Service::Cordon);
    AddUnary("Uncordon", this, &Service::Uncordon);
    AddUnary("CheckHealth", this, &Service::CheckHealth);
    AddUnary("ReportNodeCheck", this, &Service::ReportNodeCheck);
  }

  grpc::Status RegisterNode(grpc::ServerContext*,
                            const v1::RegisterNodeRequest* req,
                            v1::RegisterNodeResponse* resp) {
    // A registration waits for a disk write too: thousands at once (a job
    // starting) must not take the threads heartbeats need.
    Admission a(this);
    if (!a.ok()) return a.Refusal();
    return Answer(c_->RegisterNode(*req), resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) {
    return Answer(c_->Heartbeat(*req), resp);
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
  grpc::Status ReportShards(grpc::ServerContext*,
                            const v1::ReportShardsRequest* req,
                            v1::ReportShardsResponse* resp) {
    Admission a(this);
    if (!a.ok()) return a.Refusal();
    return Answer(c_->ReportShards(*req), resp);
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
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      LoadServerCredentials(security.tls);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer);
  s->max_inflight_reports_ = limits.max_inflight_reports;
  AuthPolicy auth;
  auth.mtls = security.tls.enabled();
  auth.admin_identities = security.admin_identities;
  auto service = std::make_unique<Service>(
      std::move(auth), std::move(leadership), &s->max_inflight_reports_);
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
}

void CoordinatorServer::TickLoop() {
  const auto period = tick_period();
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    absl::Status s = coordinator_->Tick();
    if (!s.ok())
      std::fprintf(stderr, "ckpt-coordinator: tick: %s\n",
                   std::string(s.message()).c_str());
    ticks_.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
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
      std::fprintf(stderr, "ckpt-coordinator: checking global manifests: %s\n",
                   said.c_str());
    last = said;
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
  if (watch_)
    watch_->Stop();  // ends the open streams, or Shutdown waits for them
  if (server_)
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
}

}  // namespace ckpt::coordinator
