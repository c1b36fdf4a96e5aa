#include "coordinator/watch_service.h"

#include <optional>
#include <vector>

#include "coordinator/client/leader_channel.h"
#include "util/validate.h"

namespace ckpt::coordinator {

class WatchService::Watcher final
    : public grpc::ServerWriteReactor<v1::JobView> {
 public:
  Watcher(WatchService* service, grpc::CallbackServerContext* ctx,
          std::string job, std::string node)
      : service_(service),
        ctx_(ctx),
        job_(std::move(job)),
        node_(std::move(node)) {}
  const std::string& job() const { return job_; }
  const std::string& node() const { return node_; }

  // Sends `v` unless it is what the reader has already; keeps only the
  // newest while a write is in flight.
  void Push(v1::JobView v) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    std::string bytes = v.SerializeAsString();
    if (bytes == last_) return;
    last_ = std::move(bytes);
    if (writing_) {
      pending_ = std::move(v);
      return;
    }
    writing_ = true;
    current_ = std::move(v);
    StartWrite(&current_);
  }
  // `leader`, when not empty, goes in the kLeaderMetadataKey trailer.
  void End(const grpc::Status& s, const std::string& leader = "") {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    if (!leader.empty()) ctx_->AddTrailingMetadata(kLeaderMetadataKey, leader);
    Finish(s);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      if (!finished_) {
        finished_ = true;
        Finish(
            grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broken"));
      }
      return;
    }
    if (pending_ && !finished_) {
      current_ = std::move(*pending_);
      pending_.reset();
      StartWrite(&current_);
    } else {
      writing_ = false;
    }
  }
  void OnCancel() override { End(grpc::Status::CANCELLED); }
  void OnDone() override {
    service_->Remove(this);
    delete this;
  }

 private:
  WatchService* const service_;
  grpc::CallbackServerContext* const ctx_;  // the call's; lives until OnDone
  const std::string job_;
  const std::string node_;
  std::mutex mu_;
  bool writing_ = false;
  bool finished_ = false;
  std::string last_;
  v1::JobView current_;
  std::optional<v1::JobView> pending_;
};

WatchService::WatchService(AdmitFn admit, LeadingFn leading)
    : admit_(std::move(admit)), leading_(std::move(leading)) {}

void WatchService::Serve(Coordinator* c) {
  std::lock_guard<std::mutex> lock(mu_);
  c_.store(c, std::memory_order_release);
  if (!stopping_) notifier_ = std::thread([this] { NotifyLoop(); });
}

WatchService::~WatchService() { Stop(); }

void WatchService::Stop() {
  std::thread notifier;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.exchange(true)) return;
    notifier = std::move(notifier_);
  }
  if (notifier.joinable()) notifier.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (Watcher* w : watchers_)
    w->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator stopping"));
}

grpc::ServerWriteReactor<v1::JobView>* WatchService::WatchJob(
    grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* req) {
  absl::Status s = ValidateJobName(req->job(), "job");
  if (s.ok()) s = ValidateJobName(req->node_id(), "node_id");
  grpc::Status refusal =
      s.ok() ? grpc::Status::OK
             : grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                            std::string(s.message()));
  if (refusal.ok() && admit_) refusal = admit_(ctx, "WatchJob", *req);
  if (refusal.ok() && stopping_)
    refusal =
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator stopping");
  Coordinator* c = c_.load(std::memory_order_acquire);
  if (refusal.ok() && c == nullptr)
    refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "not leader; no leader elected yet");
  auto* w = new Watcher(this, ctx, req->job(), req->node_id());
  if (!refusal.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      watchers_.insert(w);  // OnDone removes it
    }
    w->End(refusal);
    return w;
  }
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.insert(w);
  w->Push(c->View(w->job(), w->node()));
  return w;
}

void WatchService::Remove(Watcher* w) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(w);
}

void WatchService::NotifyLoop() {
  Coordinator* const c = c_.load(std::memory_order_acquire);
  uint64_t seen = 0;
  while (!stopping_) {
    uint64_t now = c->WaitForChange(seen, std::chrono::steady_clock::now() +
                                              std::chrono::milliseconds(200));
    if (leading_) {
      // A deposed leader ends its streams, so clients reopen them at the
      // new leader.
      std::string leader;
      if (grpc::Status lead = leading_(&leader); !lead.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        for (Watcher* w : watchers_) w->End(lead, leader);
        continue;
      }
    }
    if (now == seen) continue;
    seen = now;
    // Views are computed under mu_ so no watcher is deleted meanwhile
    // (OnDone waits for mu_); each View takes the state mutex briefly.
    std::lock_guard<std::mutex> lock(mu_);
    for (Watcher* w : watchers_) w->Push(c->View(w->job(), w->node()));
  }
}

}  // namespace ckpt::coordinator
