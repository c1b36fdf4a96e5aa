#include "coordinator/watch_service.h"

#include <functional>
#include <optional>
#include <vector>

#include "coordinator/client/leader_channel.h"
#include "util/validate.h"

namespace ckpt::coordinator {

// A stream of `View`s; `compute` gives the current one.
template <typename View>
class WatchService::Watcher final : public grpc::ServerWriteReactor<View>,
                                    public WatchService::Stream {
 public:
  // `node`: a node agent's WatchNode stream, counted as its connection
  // (Coordinator::NodeWatchOpened) while it is open.
  Watcher(WatchService* service, grpc::CallbackServerContext* ctx,
          std::function<View(Coordinator*)> compute, std::string node = "")
      : service_(service),
        ctx_(ctx),
        compute_(std::move(compute)),
        node_(std::move(node)) {}

  const std::string& node() const { return node_; }
  // Before gRPC has the reactor (no callback can run yet).
  void CountedBy(Coordinator* c) { counted_ = c; }

  void Refresh(Coordinator* c) override { Push(compute_(c)); }

  // Sends `v` unless it is what the reader has already; keeps only the
  // newest while a write is in flight.
  void Push(View v) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    std::string bytes = v.SerializeAsString();
    if (last_ && bytes == *last_) return;  // (an empty view is sent once)
    last_ = std::move(bytes);
    if (writing_) {
      pending_ = std::move(v);
      return;
    }
    writing_ = true;
    current_ = std::move(v);
    this->StartWrite(&current_);
  }
  void End(const grpc::Status& s, const std::string& leader) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    if (!leader.empty()) ctx_->AddTrailingMetadata(kLeaderMetadataKey, leader);
    this->Finish(s);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      if (!finished_) {
        finished_ = true;
        this->Finish(
            grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broken"));
      }
      return;
    }
    if (pending_ && !finished_) {
      current_ = std::move(*pending_);
      pending_.reset();
      this->StartWrite(&current_);
    } else {
      writing_ = false;
    }
  }
  void OnCancel() override { End(grpc::Status::CANCELLED, ""); }
  void OnDone() override {
    if (counted_ != nullptr) counted_->NodeWatchEnded(node_);
    service_->Remove(this);
    delete this;
  }

 private:
  WatchService* const service_;
  grpc::CallbackServerContext* const ctx_;  // the call's; lives until OnDone
  const std::function<View(Coordinator*)> compute_;
  const std::string node_;
  Coordinator* counted_ = nullptr;
  std::mutex mu_;
  bool writing_ = false;
  bool finished_ = false;
  std::optional<std::string> last_;
  View current_;
  std::optional<View> pending_;
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
  for (Stream* w : watchers_)
    w->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator stopping"),
           "");
}

template <typename View>
grpc::ServerWriteReactor<View>* WatchService::Open(
    grpc::CallbackServerContext* ctx, const char* method,
    const google::protobuf::Message& req, const absl::Status& checked,
    Watcher<View>* w) {
  grpc::Status refusal =
      checked.ok() ? grpc::Status::OK
                   : grpc::Status(static_cast<grpc::StatusCode>(checked.code()),
                                  std::string(checked.message()));
  if (refusal.ok() && admit_) refusal = admit_(ctx, method, req);
  if (refusal.ok() && stopping_)
    refusal =
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator stopping");
  Coordinator* c = c_.load(std::memory_order_acquire);
  if (refusal.ok() && c == nullptr)
    refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "not leader; no leader elected yet");
  if (!refusal.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      watchers_.insert(w);  // OnDone removes it
    }
    w->End(refusal, "");
    return w;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!w->node().empty()) {
    c->NodeWatchOpened(w->node());
    w->CountedBy(c);
  }
  watchers_.insert(w);
  w->Refresh(c);
  return w;
}

grpc::ServerWriteReactor<v1::JobView>* WatchService::WatchJob(
    grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* req) {
  absl::Status s = ValidateJobName(req->job(), "job");
  if (s.ok()) s = ValidateNodeId(req->node_id());
  auto* w = new Watcher<v1::JobView>(
      this, ctx, [job = req->job(), node = req->node_id()](Coordinator* c) {
        return c->View(job, node);
      });
  return Open(ctx, "WatchJob", *req, s, w);
}

grpc::ServerWriteReactor<v1::NodeView>* WatchService::WatchNode(
    grpc::CallbackServerContext* ctx, const v1::WatchNodeRequest* req) {
  absl::Status s = ValidateNodeId(req->node_id());
  auto* w = new Watcher<v1::NodeView>(
      this, ctx,
      [node = req->node_id()](Coordinator* c) { return c->NodeOrders(node); },
      s.ok() ? req->node_id() : std::string());
  return Open(ctx, "WatchNode", *req, s, w);
}

void WatchService::Remove(Stream* w) {
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
        for (Stream* w : watchers_) w->End(lead, leader);
        continue;
      }
    }
    if (now == seen) continue;
    seen = now;
    // Views are computed under mu_ so no watcher is deleted meanwhile
    // (OnDone waits for mu_); each View takes the state mutex briefly.
    std::lock_guard<std::mutex> lock(mu_);
    for (Stream* w : watchers_) w->Refresh(c);
  }
}

}  // namespace ckpt::coordinator
