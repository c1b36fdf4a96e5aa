// LeaderElection: one leader among the ckpt-coordinator replicas that share
// an etcd prefix, through an etcd lease.
//
// Campaign: while the election key (PREFIX + "leader") exists, the replica
// stands by: it reads the key (the leader's address) and watches it for its
// deletion (an etcd Watch from the revision it read, renewed every 2 s and
// after a member fails; `poll` paces retries after errors). When the key is
// gone (the leader resigned, or its lease expired because it died or
// stalled) the replica grants itself a lease of ttl_s and
// creates the key, holding its own address, in a Txn that succeeds only if
// the key is absent; the winner's fence is the key's create revision
// (etcd_kv.h makes every write conditional on it).
// Leading: a thread keeps the lease alive every ttl/3. Leadership is lost
// when etcd says the lease expired, or when no keepalive succeeded for a
// whole TTL (by the local clock: a stalled process assumes the worst); then
// leading() turns false and on_lost runs once. Resuming leadership is not
// supported: ckpt-coordinator exits and its supervisor restarts it as a
// standby (as Kubernetes' controllers do).
// Thread-safe; the destructor stops the thread and revokes a held lease.
#ifndef CKPT_COORDINATOR_ETCD_ELECTION_H_
#define CKPT_COORDINATOR_ETCD_ELECTION_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "coordinator/etcd/etcd_client.h"
#include "coordinator/etcd/etcd_kv.h"

namespace ckpt::coordinator::etcd {

struct ElectionOptions {
  std::string key;        // full etcd key, e.g. "/ckpt/leader"
  std::string advertise;  // this replica's HOST:PORT, stored in the key
  int64_t ttl_s = 3;
  std::chrono::milliseconds poll{250};
};

class LeaderElection {
 public:
  LeaderElection(std::shared_ptr<EtcdClient> client, ElectionOptions options);
  ~LeaderElection();

  // Blocks until this replica leads (returns its fence) or Stop().
  // Errors reaching etcd are logged and retried, not returned.
  [[nodiscard]] absl::StatusOr<Fence> Campaign();
  // Starts the keepalive thread; on_lost(reason) runs once on that thread.
  void KeepLeading(std::function<void(const std::string&)> on_lost);
  void Stop();

  bool leading() const;
  // The leader's address as last seen ("" when none is known).
  std::string leader() const;

 private:
  void KeepAliveLoop(std::function<void(const std::string&)> on_lost);
  bool SleepUnlessStopped(std::chrono::milliseconds d);

  const std::shared_ptr<EtcdClient> client_;
  const ElectionOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string leader_;
  int64_t lease_ = 0;
  std::atomic<bool> leading_{false};
  std::atomic<int64_t> lease_deadline_ms_{0};  // steady clock
  std::thread keepalive_;
  grpc::ClientContext* watching_ =
      nullptr;  // under watch_mu_; Stop() cancels it
  std::mutex watch_mu_;
};

}  // namespace ckpt::coordinator::etcd

#endif  // CKPT_COORDINATOR_ETCD_ELECTION_H_
