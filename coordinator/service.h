// CoordinatorServer: the gRPC Coordinator service (coordinator.proto) in
// front of a Coordinator, listening on TCP, plus the thread that calls
// Coordinator::Tick() so a silent node is declared dead within
// heartbeat_timeout + heartbeat_timeout/4. Each RPC maps the Coordinator's
// absl::Status to the gRPC status with the same code and message.
// Thread-safe; Shutdown() is idempotent and runs on destruction.
#ifndef CKPT_COORDINATOR_SERVICE_H_
#define CKPT_COORDINATOR_SERVICE_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace ckpt::coordinator {

class CoordinatorServer {
 public:
  // listen: "HOST:PORT"; port 0 picks a free port (see port()).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      std::unique_ptr<Coordinator> coordinator, const std::string& listen);
  ~CoordinatorServer();

  int port() const { return port_; }
  void Wait();      // until Shutdown()
  void Shutdown();

 private:
  CoordinatorServer() = default;
  void TickLoop();

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread ticker_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_SERVICE_H_
