// RendezvousKeeper: the store every generation's process group meets at,
// served by ckptrun itself for its whole life (--rendezvous worker|torch),
// never by a trainer. Ranks kept by an in-process restart re-form without
// waiting for rank 0's replacement (its imports) or a restarting rank 0,
// and losing rank 0's node is like losing any other: every ckptrun of the
// job serves from its start, and the plan's MASTER_ADDR is the host of
// rank 0's node in the new generation, a node alive when the plan was
// made. Keys are prefixed by the generation (and, in Python, the job), so
// one store serves every generation. Several ckptruns on one host (a test
// cluster) share it: the first to bind the port serves; the others retry
// binding at each poll, so one of them takes over when it goes.
//   worker: ckpt-worker's gRPC store (worker/rendezvous_server.h), in this
//           process.
//   torch:  `python3 -m ckpt.torch.store_server`, a child kept up (started
//           again if it exits), torch's TCPStore wire protocol; it retries
//           a port in use itself.
// Not thread-safe: the launcher's thread only.
#ifndef CKPT_TOOLS_CKPTRUN_RENDEZVOUS_H_
#define CKPT_TOOLS_CKPTRUN_RENDEZVOUS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::worker {
class StoreServer;
}

namespace ckpt::tools {

enum class RendezvousKind { kTrainer, kWorker, kTorch };

// "trainer", "worker", "torch"; "auto": worker when `program` (resolved)
// is ckpt-worker, trainer otherwise. InvalidArgument naming --rendezvous.
[[nodiscard]] absl::StatusOr<RendezvousKind> ParseRendezvous(
    const std::string& value, const std::string& program);
const char* RendezvousName(RendezvousKind kind);

class RendezvousKeeper {
 public:
  // `python`: the interpreter of kind torch (resolved). `log` prefixes
  // every line ("ckptrun[node]: ").
  RendezvousKeeper(RendezvousKind kind, uint32_t port, std::string python,
                   std::string log);
  ~RendezvousKeeper();
  RendezvousKeeper(const RendezvousKeeper&) = delete;
  RendezvousKeeper& operator=(const RendezvousKeeper&) = delete;

  // Trainers are told to be clients only ($CKPT_RENDEZVOUS=launcher).
  bool serves() const { return kind_ != RendezvousKind::kTrainer; }
  // Starts the server, or again when it is gone or could not bind; at
  // most once per `retry`. Cheap when it is up.
  void Tend(std::chrono::milliseconds retry);

 private:
  void TendWorker();
  void TendTorch();
  // Whether the torch child still runs (its pidfd; it may have been
  // reaped by TrainerSet::Reap, which waits for any child).
  bool ChildAlive() const;
  void Log(const std::string& line) const;

  const RendezvousKind kind_;
  const uint32_t port_;
  const std::string python_;
  const std::string log_;
  std::unique_ptr<worker::StoreServer> server_;
  pid_t child_ = 0;
  int child_fd_ = -1;  // pidfd of child_
  std::chrono::steady_clock::time_point next_try_{};
  std::string last_error_;  // logged once until it changes
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CKPTRUN_RENDEZVOUS_H_
