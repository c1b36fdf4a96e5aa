// WatchService: the CoordinatorWatch gRPC service (coordinator.proto) on
// gRPC's callback API, so an open stream costs no thread: thousands of
// launchers (ckptrun, WatchJob) and node agents (ckptd, WatchNode) can each
// hold one. A watcher gets its view at once, then again after each durable
// change of the state that changes it (one notifier thread recomputes the
// views; a slow reader gets only the newest view when its previous write
// completes).
// Every call goes through `admit` first (leadership and authorisation, the
// Coordinator service's rules: service.h, auth.h); a refusal ends the
// stream with its status. Until Serve() hands it the Coordinator (a
// standby) it serves nothing; when `leading` stops answering OK (a deposed
// leader) every open stream ends with that status (UNAVAILABLE "not
// leader; ...", the leader's address in the "ckpt-leader" trailer) within
// ~200 ms, so a client reopens it at the leader.
// Thread-safe; Stop() before the server shuts down ends every stream.
#ifndef CKPT_COORDINATOR_WATCH_SERVICE_H_
#define CKPT_COORDINATOR_WATCH_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "coordinator.grpc.pb.h"
#include "coordinator/coordinator.h"

namespace ckpt::coordinator {

class WatchService final : public v1::CoordinatorWatch::CallbackService {
 public:
  using AdmitFn = std::function<grpc::Status(
      grpc::ServerContextBase*, const std::string& method,
      const google::protobuf::Message& request)>;
  // Not OK when this server no longer leads; *leader then names the leader
  // ("" when none), put in the kLeaderMetadataKey trailer of the streams
  // it ends.
  using LeadingFn = std::function<grpc::Status(std::string* leader)>;
  WatchService(AdmitFn admit, LeadingFn leading);
  ~WatchService() override;
  // Starts serving `c` (once); it outlives this service's streams.
  void Serve(Coordinator* c);
  void Stop();

  grpc::ServerWriteReactor<v1::JobView>* WatchJob(
      grpc::CallbackServerContext* ctx,
      const v1::WatchJobRequest* req) override;
  grpc::ServerWriteReactor<v1::NodeView>* WatchNode(
      grpc::CallbackServerContext* ctx,
      const v1::WatchNodeRequest* req) override;

  // One open stream, whatever it watches.
  class Stream {
   public:
    virtual ~Stream() = default;
    // Sends the stream's view of `c` unless the reader has it already.
    virtual void Refresh(Coordinator* c) = 0;
    // `leader`, when not empty, goes in the kLeaderMetadataKey trailer.
    virtual void End(const grpc::Status& s, const std::string& leader) = 0;
  };
  void Remove(Stream* w);

 private:
  template <typename View>
  class Watcher;
  // Admits `req` (already checked: `checked`), registers `w` and sends its
  // first view, or ends it with the refusal.
  template <typename View>
  grpc::ServerWriteReactor<View>* Open(grpc::CallbackServerContext* ctx,
                                       const char* method,
                                       const google::protobuf::Message& req,
                                       const absl::Status& checked,
                                       Watcher<View>* w);
  void NotifyLoop();

  const AdmitFn admit_;
  const LeadingFn leading_;
  std::atomic<Coordinator*> c_{nullptr};
  std::mutex mu_;
  std::set<Stream*> watchers_;
  std::atomic<bool> stopping_{false};
  std::thread notifier_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_WATCH_SERVICE_H_
