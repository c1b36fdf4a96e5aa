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

#include <memory>
#include <mutex>
#include <string>

namespace ckpt::worker {

class MeshContext : public gloo::Context {
 public:
  MeshContext(int rank, int size) : gloo::Context(rank, size) {}

  // gloo::rendezvous::Context::connectFullMesh with every key under
  // `prefix`; the pairs are reachable by Abort as soon as they exist.
  // Throws gloo's exceptions (IoException once aborted).
  void ConnectFullMesh(gloo::rendezvous::Store& store,
                       std::shared_ptr<gloo::transport::Device> device,
                       const std::string& prefix);

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
