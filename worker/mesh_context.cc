#include "worker/mesh_context.h"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/phase_trace.h"

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

struct LoopTurns::Waker final : gloo::transport::tcp::Handler {
  void handleEvents(int /*events*/) override {}
};

LoopTurns::LoopTurns(const std::shared_ptr<gloo::transport::Device>& device)
    : device_(device), waker_(std::make_unique<Waker>()) {
  auto* tcp = dynamic_cast<gloo::transport::tcp::Device*>(device.get());
  if (tcp == nullptr) return;
  fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // Registering does not wait for a turn.
  if (fd_ >= 0) tcp->registerDescriptor(fd_, EPOLLIN | EPOLLET, waker_.get());
}

LoopTurns::~LoopTurns() {
  if (fd_ < 0) return;
  if (std::shared_ptr<gloo::transport::Device> d = device_.lock()) {
    Arm();
    static_cast<gloo::transport::tcp::Device*>(d.get())->unregisterDescriptor(
        fd_, waker_.get());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (kicker_.joinable()) kicker_.join();
  close(fd_);
}

void LoopTurns::Arm() {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++armed_;
    if (!kicker_.joinable()) kicker_ = std::thread([this] { Kick(); });
  }
  cv_.notify_all();
}

void LoopTurns::Disarm() {
  if (fd_ < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (armed_ > 0) --armed_;
}

void LoopTurns::Kick() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (armed_ == 0) {
      cv_.wait(lock, [&] { return stopping_ || armed_ > 0; });
      continue;
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof(one));
    cv_.wait_for(lock, std::chrono::microseconds(500),
                 [&] { return stopping_; });
  }
}

void MeshContext::ThrowIfAborted() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw gloo::IoException(why_);
}

void MeshContext::ConnectFullMesh(
    gloo::rendezvous::Store& store,
    std::shared_ptr<gloo::transport::Device> device, const std::string& prefix,
    LoopTurns* turns) {
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
  Phase("pairs_created", rank);
  store.set(absl::StrCat(prefix, rank), addresses);
  Phase("key_set", rank);
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    const std::string key = absl::StrCat(prefix, i);
    store.wait({key}, getTimeout());
    std::vector<char> all = store.get(key);
    Phase(absl::StrCat("got_key_", i).c_str(), rank);
    // Rank i listed one address per peer, in rank order, without its own.
    const size_t each = all.size() / static_cast<size_t>(size - 1);
    const size_t at = static_cast<size_t>(rank > i ? rank - 1 : rank) * each;
    if (each == 0 || all.size() % static_cast<size_t>(size - 1) != 0) {
      throw gloo::IoException(absl::StrCat("rendezvous key '", key,
                                           "': ", all.size(), " bytes for ",
                                           size - 1, " peer addresses"));
    }
    ThrowIfAborted();
    if (turns != nullptr) turns->Arm();
    try {
      pairs->getPair(i)->connect(
          std::vector<char>(all.begin() + at, all.begin() + at + each));
    } catch (...) {
      if (turns != nullptr) turns->Disarm();
      throw;
    }
    if (turns != nullptr) turns->Disarm();
    Phase(absl::StrCat("connected_", i).c_str(), rank);
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
