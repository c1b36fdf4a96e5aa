#include "worker/mesh_context.h"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/pair.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt::worker {

namespace {

// gloo keeps Pair::signalExceptionExternal protected (its buffers call it
// when an operation times out), yet it is the one call that fails a pair's
// pending operations from outside the pair. A member pointer taken through
// a derived class reaches it; the class is never instantiated.
struct PairAccess : gloo::transport::tcp::Pair {
  static auto Signal() { return &PairAccess::signalExceptionExternal; }
};

}  // namespace

void MeshContext::ThrowIfAborted() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw gloo::IoException(why_);
}

void MeshContext::ConnectFullMesh(
    gloo::rendezvous::Store& store,
    std::shared_ptr<gloo::transport::Device> device,
    const std::string& prefix) {
  ThrowIfAborted();
  std::shared_ptr<gloo::transport::Context> pairs =
      device->createContext(rank, size);
  pairs->setTimeout(getTimeout());
  std::vector<char> addresses;
  {
    // Created under the lock: Abort walks them from another thread.
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) throw gloo::IoException(why_);
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      std::vector<char> bytes = pairs->createPair(i)->address().bytes();
      addresses.insert(addresses.end(), bytes.begin(), bytes.end());
    }
    pairs_ = pairs;
  }
  store.set(absl::StrCat(prefix, rank), addresses);
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    const std::string key = absl::StrCat(prefix, i);
    store.wait({key}, getTimeout());
    std::vector<char> all = store.get(key);
    // Rank i listed one address per peer, in rank order, without its own.
    const size_t each = all.size() / static_cast<size_t>(size - 1);
    const size_t at = static_cast<size_t>(rank > i ? rank - 1 : rank) * each;
    if (each == 0 || all.size() % static_cast<size_t>(size - 1) != 0) {
      throw gloo::IoException(absl::StrCat("rendezvous key '", key,
                                           "': ", all.size(), " bytes for ",
                                           size - 1, " peer addresses"));
    }
    ThrowIfAborted();
    pairs->getPair(i)->connect(
        std::vector<char>(all.begin() + at, all.begin() + at + each));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw gloo::IoException(why_);
  device_ = std::move(device);
  transportContext_ = std::move(pairs);
}

void MeshContext::Abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  why_ = why;
  if (pairs_ == nullptr) return;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    auto* pair =
        dynamic_cast<gloo::transport::tcp::Pair*>(pairs_->getPair(i).get());
    // gloo's own failure path: every pending operation of the pair is
    // signalled, then its socket is closed.
    if (pair != nullptr) (pair->*PairAccess::Signal())(why);
  }
}

}  // namespace ckpt::worker
