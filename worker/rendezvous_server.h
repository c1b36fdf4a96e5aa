// The server of ckpt-worker's rendezvous store (rendezvous.proto): the keys
// of every generation in memory, served over gRPC. Served by rank 0's
// worker when the launcher serves none, or by ckptrun itself for the whole
// life of the job (--rendezvous worker): a store that no process of any
// generation holds, so ranks kept by an in-process restart never wait on
// rank 0's replacement to re-form. Its callers prefix every key with the
// generation, so generations never mix. What a client sends is bounded
// (key and value sizes, the number of keys): InvalidArgument or
// ResourceExhausted naming the key. Thread-safe.
#ifndef CKPT_WORKER_RENDEZVOUS_SERVER_H_
#define CKPT_WORKER_RENDEZVOUS_SERVER_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::worker {

// "host:port", with brackets around an IPv6 literal.
std::string HostPort(const std::string& host, int port);

class StoreServer {
 public:
  // Bounds of what a client may store (a gloo rendezvous stores a few
  // hundred bytes per rank and generation).
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxKeys = 1 << 20;

  // Listens on host:port (the port must be free: no SO_REUSEPORT sharing).
  // Unavailable naming the address when it cannot.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StoreServer>> Start(
      const std::string& host, int port);
  ~StoreServer();

  class Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_RENDEZVOUS_SERVER_H_
