// The holder's side of the bulk path (doc/replicas.md "Transport"): the
// one-time tokens its replica listener hands out for a Put or Get offer
// (the gRPC channel, mutually authenticated, is the control channel), and
// the plain TCP listener whose connections present them and carry the
// image's bytes straight into the reservation (put) or out of the held
// copy or staged slot (get), with no protobuf copies (replica_bulk_wire.h).
//
// A token is 128 random bits (getrandom), good for one connection until it
// expires; it pins its transfer's memory (a put's reservation, a get's
// copy) until it is used or expires. A header naming an unknown, expired
// or used token, the other kind, an offset other than 0 or a length other
// than the offer's is refused with a reply naming the field; an unknown
// token changes nothing, a known one is spent by its first presentation.
//
// Thread-safety: BulkTokens is thread-safe; BulkListener runs an accept
// thread and one thread per connection (at most max_connections), and
// Shutdown waits for them.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_BULK_H_
#define CKPT_DAEMON_REPLICA_REPLICA_BULK_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/replica/replica_bulk_wire.h"

namespace ckpt::daemon {

// What one token allows.
struct BulkTransfer {
  BulkKind kind = BulkKind::kPut;
  uint64_t bytes = 0;
  char* dst = nullptr;        // put: where the bytes go
  const char* src = nullptr;  // get: where they come from
  // Keeps dst or src mapped (and a put's reservation counted) while the
  // token lives and the transfer runs.
  std::shared_ptr<void> pin;
  // Run once every byte went: put, verify and keep the copy (its digest);
  // get, whether the source stayed unchanged while it was sent.
  std::function<absl::StatusOr<uint64_t>()> finish;
  std::string what;  // "replica of job 'j' step s rank r", for messages
};

class BulkTokens {
 public:
  explicit BulkTokens(std::chrono::milliseconds ttl) : ttl_(ttl) {}
  std::chrono::milliseconds ttl() const { return ttl_; }
  // A fresh token for `t`.
  [[nodiscard]] absl::StatusOr<std::string> Issue(BulkTransfer t);
  // The transfer `h` names, spent. InvalidArgument naming token, kind,
  // offset or length (an unknown token leaves everything as it was).
  [[nodiscard]] absl::StatusOr<BulkTransfer> Take(const BulkHeader& h);
  // Forgets expired tokens (their pins let go outside the lock).
  void Sweep();
  size_t pending() const;

 private:
  struct Entry {
    BulkTransfer transfer;
    std::chrono::steady_clock::time_point expiry;
  };
  const std::chrono::milliseconds ttl_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> pending_;
  // Spent or expired tokens, remembered for 4 ttl to say which they were.
  std::map<std::string, std::pair<bool, std::chrono::steady_clock::time_point>>
      gone_;  // token -> (expired, when forgotten)
};

struct BulkListenerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: any free port
  // How long a connection may take to present its header.
  std::chrono::milliseconds header_timeout{5000};
  // A transfer's bytes stop for this long: the connection is dropped.
  std::chrono::milliseconds stall_timeout{30000};
  int max_connections = 32;
};

struct BulkListenerStats {
  uint64_t served = 0;   // transfers whose bytes all went
  uint64_t refused = 0;  // headers refused
  uint64_t failed = 0;   // transfers cut off, or whose finish failed
};

class BulkListener {
 public:
  // `tokens` must outlive the listener.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BulkListener>> Listen(
      const BulkListenerOptions& options, BulkTokens* tokens);
  ~BulkListener();  // Shutdown
  int port() const { return port_; }
  // Stops accepting, cuts off running transfers and waits for them.
  void Shutdown();
  BulkListenerStats Stats() const;

 private:
  BulkListener(int listen_fd, int wake_fd, int port,
               BulkListenerOptions options, BulkTokens* tokens)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        port_(port),
        options_(std::move(options)),
        tokens_(tokens) {}
  void AcceptLoop();
  void Serve(int fd);
  absl::Status Transfer(int fd, BulkTransfer& t, uint64_t* digest);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to stop the loop
  const int port_;
  const BulkListenerOptions options_;
  BulkTokens* const tokens_;
  std::thread accept_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::set<int> open_;  // connections being served
  bool stopping_ = false;
  BulkListenerStats stats_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_BULK_H_
