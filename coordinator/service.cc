#include "coordinator/service.h"

#include <cstdio>

#include <grpcpp/grpcpp.h>

#include "coordinator.grpc.pb.h"
#include "util/rpc_service.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
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
  explicit Service(Coordinator* c)
      : RpcService(google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            v1::Coordinator::service_full_name())),
        c_(c) {
    AddUnary("RegisterNode", this, &Service::RegisterNode);
    AddUnary("Heartbeat", this, &Service::Heartbeat);
    AddUnary("RegisterJob", this, &Service::RegisterJob);
    AddUnary("ReportShard", this, &Service::ReportShard);
    AddUnary("ReportTrainerExit", this, &Service::ReportTrainerExit);
    AddUnary("GetCluster", this, &Service::GetCluster);
    AddUnary("Rollback", this, &Service::Rollback);
    AddUnary("Events", this, &Service::Events);
  }

  grpc::Status RegisterNode(grpc::ServerContext*, const v1::RegisterNodeRequest* req,
                            v1::RegisterNodeResponse* resp) {
    return Answer(c_->RegisterNode(*req), resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) {
    return Answer(c_->Heartbeat(*req), resp);
  }
  grpc::Status RegisterJob(grpc::ServerContext*, const v1::RegisterJobRequest* req,
                           v1::RegisterJobResponse* resp) {
    return Answer(c_->RegisterJob(*req), resp);
  }
  grpc::Status ReportShard(grpc::ServerContext*, const v1::ReportShardRequest* req,
                           v1::ReportShardResponse* resp) {
    return Answer(c_->ReportShard(*req), resp);
  }
  grpc::Status ReportTrainerExit(grpc::ServerContext*, const v1::ReportTrainerExitRequest* req,
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
      if (absl::Status s = ValidateJobName(req->job(), "job"); !s.ok()) return ToGrpc(s);
    *resp = c_->Events(*req);
    return grpc::Status::OK;
  }

 private:
  Coordinator* const c_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    std::unique_ptr<Coordinator> coordinator, const std::string& listen) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer);
  s->coordinator_ = std::move(coordinator);
  s->service_ = std::make_unique<Service>(s->coordinator_.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0)
    return absl::UnavailableError("--listen: cannot listen on " + listen);
  s->ticker_ = std::thread([p = s.get()] { p->TickLoop(); });
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::TickLoop() {
  auto period = std::max(coordinator_->options().heartbeat_timeout / 4, std::chrono::milliseconds(10));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    absl::Status s = coordinator_->Tick();
    if (!s.ok()) std::fprintf(stderr, "ckpt-coordinator: tick: %s\n", std::string(s.message()).c_str());
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
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace ckpt::coordinator
