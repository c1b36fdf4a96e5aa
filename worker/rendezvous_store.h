// The rendezvous store of a data-parallel ckpt-worker job, served over gRPC.
// StoreServer (rendezvous_server.h: ckptrun, or rank 0 when the launcher
// serves none) holds the keys in memory and serves them at
// MASTER_ADDR:MASTER_PORT; GrpcStore is every rank's gloo::rendezvous::Store
// view of it. gloo calls the store and expects failures as exceptions, so
// GrpcStore throws gloo::IoException naming the key and the address; the
// DataParallel wrapper turns those into a Status. Both are thread-safe. A
// Get that finds no server (an older generation's went away) waits for one
// until its deadline.
#ifndef CKPT_WORKER_RENDEZVOUS_STORE_H_
#define CKPT_WORKER_RENDEZVOUS_STORE_H_

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/rendezvous_server.h"

namespace ckpt::worker {

class GrpcStore : public gloo::rendezvous::Store {
 public:
  // Connects to the server at host:port, retrying until `connect_timeout`
  // passes (rank 0 may start after the others). DeadlineExceeded naming
  // MASTER_ADDR and MASTER_PORT when it never answers. Later gets and waits
  // give up after `timeout`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GrpcStore>> Connect(
      const std::string& host, int port,
      std::chrono::milliseconds connect_timeout,
      std::chrono::milliseconds timeout);
  // Connect in two parts, so that another thread can Abort the wait: a
  // store not yet connected, then the wait for its server.
  [[nodiscard]] static std::unique_ptr<GrpcStore> Create(
      const std::string& host, int port, std::chrono::milliseconds timeout);
  [[nodiscard]] absl::Status WaitConnected(
      std::chrono::milliseconds connect_timeout);
  ~GrpcStore() override;

  // Thread-safe: cancels the calls in flight and fails every later one
  // (IoException naming `why`); WaitConnected returns Aborted.
  void Abort(const std::string& why);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  class Impl;

 private:
  explicit GrpcStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_RENDEZVOUS_STORE_H_
