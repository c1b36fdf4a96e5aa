// DataParallel: the collectives of a data-parallel ckpt-worker job, over gloo
// (TCP transport). Connect performs the rendezvous: rank 0 (or the launcher,
// store_served) serves the store (rendezvous_store.h) at
// MASTER_ADDR:MASTER_PORT, every rank publishes the
// address of its gloo device (bound to the interface that reaches
// MASTER_ADDR) and connects to every peer. A world of one needs no peers and
// opens no socket. Collectives are gloo's ring algorithms: for a given world
// size the result is bitwise the same on every rank and on every rerun. Each
// collective gives up after the collective timeout, so a rank whose peer died
// fails with Unavailable instead of hanging. gloo's exceptions stop here.
// Not thread-safe: one thread issues the collectives, in the same order on
// every rank -- except Abort, which another thread calls to break the
// connection (in-process restart: a new generation's plan arrived) without
// waiting on any peer.
#ifndef CKPT_WORKER_DATA_PARALLEL_H_
#define CKPT_WORKER_DATA_PARALLEL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gloo {
class Context;
}

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace ckpt::worker {

struct DataParallelOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";  // $MASTER_ADDR
  int master_port = 29500;                // $MASTER_PORT
  std::string iface;  // bind gloo here instead (e.g. "eth0")
  // How long ranks wait for each other to join (rank 0 may start last).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // How long one collective may wait for a peer.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(30)};
  // The job generation this connection serves: its rendezvous keys are
  // its own, so a store of another generation never mixes them in.
  uint64_t generation = 0;
  // The launcher serves the store at MASTER_ADDR:MASTER_PORT for every
  // generation ($CKPT_RENDEZVOUS=launcher): rank 0 serves none.
  bool store_served = false;
};

// InvalidArgument naming the field.
[[nodiscard]] absl::Status ValidateDataParallelOptions(
    const DataParallelOptions& options);

class StoreServer;
class GrpcStore;
class MeshContext;
class LoopTurns;

class DataParallel {
 public:
  // Create, then Rendezvous.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DataParallel>> Connect(
      const DataParallelOptions& options);
  // A connection not yet made: Abort can reach it before Rendezvous
  // starts waiting for the peers.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DataParallel>> Create(
      const DataParallelOptions& options);
  // Serves the store (rank 0, unless store_served), joins the peers. Call
  // once.
  [[nodiscard]] absl::Status Rendezvous();
  // Closes the pairs and the store client without waiting on any peer
  // or on gloo's loop timer (see the .cc); rank 0's store server stops
  // with the object.
  ~DataParallel();

  // Thread-safe, idempotent: breaks the connection. A rendezvous or
  // collective in progress fails at once (Aborted naming `why`), and so
  // does every later one. Not a lost peer: no peer-lost note is written.
  void Abort(const std::string& why);
  // A collective failed (a peer lost or stalled, or Abort).
  bool broken() const { return broken_.load(); }

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }

  // Replaces every value by its mean over the ranks (ring sum, then / W).
  [[nodiscard]] absl::Status AllReduceMean(std::span<float> values);
  // Every rank's `value`, in rank order.
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> AllGather(uint64_t value);
  // Every rank's slice, in rank order, into `all`: rank r contributes
  // counts[r] elements (`mine` on this rank), which land at the sum of the
  // counts before r. `all` holds the sum of every count (ZeRO-1: the
  // ranks' updated weights). InvalidArgument when the sizes disagree.
  [[nodiscard]] absl::Status AllGatherV(std::span<const uint16_t> mine,
                                        std::span<uint16_t> all,
                                        const std::vector<size_t>& counts);
  [[nodiscard]] absl::Status AllGatherV(std::span<const float> mine,
                                        std::span<float> all,
                                        const std::vector<size_t>& counts);

 private:
  explicit DataParallel(const DataParallelOptions& options);
  // A failed collective's status; writes the peer-lost note unless aborted.
  absl::Status CollectiveFailed(const absl::Status& s);
  absl::Status GatherBytes(const void* mine, size_t mine_count, void* all,
                           size_t all_count, size_t elem_size,
                           const std::vector<size_t>& counts);

  const DataParallelOptions options_;
  std::unique_ptr<StoreServer> server_;  // rank 0 only
  // Set once, before Rendezvous waits on anything, under abort_mu_.
  std::unique_ptr<GrpcStore> store_;
  std::shared_ptr<MeshContext> context_;
  // The context's TCP device (its event loop), kept for the destructor.
  std::shared_ptr<gloo::transport::Device> device_;
  // Prompt loop turns for the pairs' connects, Abort and the teardown;
  // set under abort_mu_.
  std::unique_ptr<LoopTurns> turns_;
  std::mutex abort_mu_;  // store_, context_ and turns_ as Abort sees them
  std::string aborted_;  // Abort's reason; empty: not aborted
  std::atomic<bool> broken_{false};
  uint32_t next_tag_ = 0;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_DATA_PARALLEL_H_
