// MeshContext: the gloo context of one generation of a data-parallel
// ckpt-worker job, connected as a full mesh through a rendezvous store, that
// another thread can break at any time without waiting on a peer. Abort
// fails every pair (gloo's own error path: the pair's pending operations
// are signalled and its socket closed), so a collective blocked on a pair
// throws at once, and a rendezvous still connecting gives up; a peer of a
// broken pair sees its link close. The store keys carry a prefix, so the
// keys of one generation never meet another's on a store that outlived
// it. Abort is thread-safe; the rest is driven by one thread.
#ifndef CKPT_WORKER_MESH_CONTEXT_H_
#define CKPT_WORKER_MESH_CONTEXT_H_

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ckpt::worker {

// Prompt turns of a gloo TCP device's event loop, while armed. gloo's loop
// (gloo/transport/tcp/loop.cc, the 2022 gloo that Debian ships) waits in
// epoll_wait with a 10 ms timeout, and a thread that unregisters a
// descriptor waits for the loop's next turn; with nothing to read, the loop
// turns only when its timer runs out. Closing a pair, ending the device and
// a connecting pair's connect (it first drops its listening socket) each
// wait so: 10 ms per pair on an in-process restart's critical path
// (measured on 4 ranks: 7-10 ms for each pair a rank connected, one after
// another). An eventfd registered (edge-triggered) with the loop for the
// device's life is written every 500 us while armed: each write is a turn,
// so no such wait takes longer, and the loop sleeps as gloo has it
// otherwise (a readable descriptor would make it spin, taking a core from
// the very peers it waits for). Inert for another transport. Arm and
// Disarm nest and are thread-safe.
class LoopTurns {
 public:
  explicit LoopTurns(const std::shared_ptr<gloo::transport::Device>& device);
  // Leaves the loop if the device still lives, and closes the eventfd.
  ~LoopTurns();
  LoopTurns(const LoopTurns&) = delete;
  LoopTurns& operator=(const LoopTurns&) = delete;

  void Arm();
  void Disarm();

 private:
  struct Waker;  // the loop's handler of the eventfd: does nothing
  void Kick();   // the kicker thread
  std::weak_ptr<gloo::transport::Device> device_;
  std::unique_ptr<Waker> waker_;
  int fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  int armed_ = 0;
  bool stopping_ = false;
  std::thread kicker_;  // started at the first Arm
};

class MeshContext : public gloo::Context {
 public:
  MeshContext(int rank, int size) : gloo::Context(rank, size) {}

  // gloo::rendezvous::Context::connectFullMesh with every key under
  // `prefix`; the pairs are reachable by Abort as soon as they exist. Each
  // pair's connect runs with `turns` armed (when given), never a wait for
  // a peer's key. Throws gloo's exceptions (IoException once aborted).
  void ConnectFullMesh(gloo::rendezvous::Store& store,
                       std::shared_ptr<gloo::transport::Device> device,
                       const std::string& prefix, LoopTurns* turns = nullptr);

  // Fails every pair with `why`, now and for any later use. Never blocks on
  // a peer.
  void Abort(const std::string& why);

 private:
  void ThrowIfAborted();

  std::mutex mu_;
  bool aborted_ = false;
  std::string why_;
  // The pairs while they connect (then also transportContext_).
  std::shared_ptr<gloo::transport::Context> pairs_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_MESH_CONTEXT_H_
