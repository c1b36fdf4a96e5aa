#include "coordinator/etcd/election.h"

#include "absl/strings/str_cat.h"
#include "util/log.h"

namespace ckpt::coordinator::etcd {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Log(const std::string& what) { LogInfo(absl::StrCat("election: ", what)); }

}  // namespace

LeaderElection::LeaderElection(std::shared_ptr<EtcdClient> client,
                               ElectionOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}

LeaderElection::~LeaderElection() {
  Stop();
  if (keepalive_.joinable()) keepalive_.join();
  if (leading_.load() && lease_ != 0)
    (void)client_->LeaseRevoke(lease_);  // hand over at once
}

void LeaderElection::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> lock(watch_mu_);
  if (watching_) watching_->TryCancel();
}

bool LeaderElection::SleepUnlessStopped(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

bool LeaderElection::leading() const {
  return leading_.load() && NowMs() < lease_deadline_ms_.load();
}

std::string LeaderElection::leader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_;
}

absl::StatusOr<Fence> LeaderElection::Campaign() {
  std::string last_error;
  auto report = [&](const absl::Status& s) {
    std::string e(s.message());
    if (e != last_error) Log("cannot reach etcd, retrying: " + e);
    last_error = e;
  };
  bool pause = false;
  while (!pause || SleepUnlessStopped(options_.poll)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    pause = true;
    etcdserverpb::RangeRequest get;
    get.set_key(options_.key);
    absl::StatusOr<etcdserverpb::RangeResponse> seen = client_->Range(get);
    if (!seen.ok()) {
      report(seen.status());
      continue;
    }
    if (seen->kvs_size() > 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (leader_ != seen->kvs(0).value()) {
          leader_ = seen->kvs(0).value();
          LogInfo(absl::StrCat("election: standing by; leader is ", leader_));
        }
      }
      absl::StatusOr<bool> deleted = client_->WatchForDelete(
          options_.key, seen->header().revision() + 1, std::chrono::seconds(2),
          &watch_mu_, &watching_);
      if (!deleted.ok()) report(deleted.status());
      pause = !deleted.ok() || !*deleted;  // deleted: campaign at once
      continue;
    }
    const int64_t granted_at = NowMs();
    absl::StatusOr<etcdserverpb::LeaseGrantResponse> lease =
        client_->LeaseGrant(options_.ttl_s);
    if (!lease.ok()) {
      report(lease.status());
      continue;
    }
    etcdserverpb::TxnRequest txn;
    etcdserverpb::Compare* absent = txn.add_compare();
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_target(etcdserverpb::Compare::CREATE);
    absent->set_key(options_.key);
    absent->set_create_revision(0);
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(options_.key);
    put->set_value(options_.advertise);
    put->set_lease(lease->id());
    absl::StatusOr<etcdserverpb::TxnResponse> won = client_->Txn(txn);
    if (!won.ok() || !won->succeeded()) {
      if (!won.ok()) report(won.status());
      (void)client_->LeaseRevoke(lease->id());
      continue;
    }
    lease_ = lease->id();
    lease_deadline_ms_.store(granted_at + lease->ttl() * 1000);
    leading_.store(true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      leader_ = options_.advertise;
    }
    Log(absl::StrCat("leading as ", options_.advertise, " (", options_.key,
                     " created at revision ", won->header().revision(),
                     ", lease ttl ", lease->ttl(), " s)"));
    return Fence{options_.key, won->header().revision()};
  }
  return absl::CancelledError("election: stopped");
}

void LeaderElection::KeepLeading(
    std::function<void(const std::string&)> on_lost) {
  keepalive_ = std::thread(
      [this, on_lost = std::move(on_lost)] { KeepAliveLoop(on_lost); });
}

void LeaderElection::KeepAliveLoop(
    std::function<void(const std::string&)> on_lost) {
  const auto period = std::chrono::milliseconds(options_.ttl_s * 1000 / 3);
  std::string lost;
  while (lost.empty() && SleepUnlessStopped(period)) {
    if (NowMs() >= lease_deadline_ms_.load()) {
      lost = "no keepalive succeeded within the lease ttl";
      break;
    }
    const int64_t sent = NowMs();
    absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> r =
        client_->KeepAlive(lease_);
    if (!r.ok()) {
      Log("keepalive failed, retrying: " + std::string(r.status().message()));
      continue;
    }
    if (r->ttl() <= 0) {
      lost = "etcd says the lease expired";
      break;
    }
    lease_deadline_ms_.store(sent + r->ttl() * 1000);
  }
  if (lost.empty()) return;  // stopped
  leading_.store(false);
  on_lost(lost);
}

}  // namespace ckpt::coordinator::etcd
