// The client half of the replica transport (proto/replica.proto): send a
// copy (Put) and fetch one (Get) over a channel from ReplicaChannel
// (replica_service.h), and the rate limit a sender keeps
// (--replica-bandwidth). Functions and a small class; see each for its
// thread-safety.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_CLIENT_H_
#define CKPT_DAEMON_REPLICA_REPLICA_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/status/statusor.h"
#include "replica.pb.h"

namespace ckpt::daemon {

// A replica RPC's failure as a Status of the same code, prefixed `what`.
absl::Status FromGrpc(const grpc::Status& s, std::string_view what);

// A token bucket of `bytes_per_s` (0: unlimited) with one second of burst:
// Acquire(n) sleeps until n more bytes may go. Thread-safe.
class RateLimiter {
 public:
  explicit RateLimiter(uint64_t bytes_per_s) : rate_(bytes_per_s) {}
  void Acquire(uint64_t bytes);
  uint64_t rate() const { return rate_; }

 private:
  const uint64_t rate_;
  std::mutex mu_;
  double tokens_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

// A transfer's cancellation: Cancel() from any thread ends the transfer it
// was given with Cancelled, a gRPC call at once (TryCancel), a bulk
// transfer within one socket wakeup (250 ms). The replicator cancels its
// send in flight when its target changes or it stops, instead of waiting
// for the old target's deadline. Thread-safe.
class TransferCancel {
 public:
  void Cancel();
  void Reset();  // before the next transfer
  const std::atomic<bool>* flag() const { return &cancelled_; }

  // While a gRPC call is under way: Cancel() cancels it too.
  class Call {
   public:
    Call(TransferCancel* cancel, grpc::ClientContext* ctx);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    TransferCancel* const cancel_;
  };

 private:
  std::mutex mu_;
  std::atomic<bool> cancelled_{false};
  grpc::ClientContext* call_ = nullptr;  // under mu_
};

struct PutOptions {
  RateLimiter* limit = nullptr;      // optional
  TransferCancel* cancel = nullptr;  // optional
  std::chrono::system_clock::time_point deadline;
  // Test-only (CKPTD_TEST_FAULT=corrupt-replica-sends): flips one byte of
  // each chunk on the wire, never in the slot.
  bool corrupt = false;
};

// Streams `copy`'s image (copy.image_bytes() bytes at `image`) in chunks.
// Returns the holder's digest of the verified copy, or its refusal.
[[nodiscard]] absl::StatusOr<uint64_t> PutReplica(
    grpc::Channel& channel, const replica::v1::ShardCopy& copy,
    const char* image, const PutOptions& options);

// Fetches a copy: `dst_for` is given the copy's description (from the
// first chunk) and returns where its image_bytes go (or an error that ends
// the fetch); chunks are then written there in order, their offsets and
// sizes checked. The caller verifies the image (VerifyReplicaImage).
[[nodiscard]] absl::StatusOr<replica::v1::ShardCopy> GetReplica(
    grpc::Channel& channel, const replica::v1::GetRequest& req,
    const std::function<absl::StatusOr<char*>(const replica::v1::ShardCopy&)>&
        dst_for,
    std::chrono::system_clock::time_point deadline);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_CLIENT_H_
