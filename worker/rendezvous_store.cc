#include "worker/rendezvous_store.h"

#include <gloo/common/error.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rendezvous.grpc.pb.h"

namespace ckpt::worker {

namespace v1 = ::ckpt::worker::rendezvous::v1;
using Clock = std::chrono::system_clock;

// A Get waits on the server at most this long per call (the server bounds
// it too); the client loops until its own deadline.
constexpr std::chrono::milliseconds kMaxGetWait{1000};

namespace {

// The channel to a store address, one for the life of the process: a rank
// kept by an in-process restart meets the same store (the launcher's, or
// rank 0's node's) in every generation, and a new channel would connect
// again, a TCP and HTTP/2 handshake on the restart's critical path. A store
// is aborted call by call (GrpcStore::Abort), never by closing its channel,
// so sharing one is safe; a server that restarts is reconnected by the
// channel itself. At most a few addresses: the oldest is dropped.
std::shared_ptr<grpc::Channel> StoreChannel(const std::string& address) {
  static std::mutex mu;
  static auto* channels =
      new std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>>;
  constexpr size_t kMaxChannels = 4;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [a, c] : *channels)
    if (a == address) return c;
  grpc::ChannelArguments args;
  // Retry a refused connection every 50 ms rather than gRPC's default
  // back-off of up to two minutes: ranks kept by an in-process restart
  // wait here for a relaunched rank 0, and each retry they skip is time
  // the whole job waits once its store is up. A refused local connect
  // costs next to nothing.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 50);
  auto channel = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args);
  if (channels->size() >= kMaxChannels) channels->erase(channels->begin());
  channels->emplace_back(address, channel);
  return channel;
}

}  // namespace

class GrpcStore::Impl {
 public:
  Impl(std::string address, std::chrono::milliseconds timeout)
      : address_(std::move(address)), timeout_(timeout) {
    channel_ = StoreChannel(address_);
    stub_ = v1::KeyValueStore::NewStub(channel_);
  }

  void Set(const std::string& key, const std::vector<char>& data) {
    v1::SetRequest req;
    req.set_key(key);
    req.set_value(std::string(data.begin(), data.end()));
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      v1::SetResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      ctx.set_wait_for_ready(true);
      Track(&ctx, "set", key);
      grpc::Status s = stub_->Set(&ctx, req, &resp);
      Untrack(&ctx, "set", key);
      if (s.ok()) return;
      // The channel outlives generations (StoreChannel): a call sent on the
      // connection of a server that went away since (a lost node's ckptrun
      // served the store; a live one serves it now) fails UNAVAILABLE, and
      // the next waits for the channel to connect again. A set is
      // idempotent.
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
          Clock::now() >= deadline)
        Fail("set", key, s.error_message());
    }
  }

  // Every call in flight is cancelled, and every later one fails.
  void Abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    why_ = why;
    for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
  }

  bool aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  void Track(grpc::ClientContext* ctx, const char* op, const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) Fail(op, key, why_);
    in_flight_.insert(ctx);
  }
  // Fails when the call was cancelled by Abort.
  void Untrack(grpc::ClientContext* ctx, const char* op,
               const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(ctx);
    if (aborted_) Fail(op, key, why_);
  }

  // The key's value, waiting up to `timeout` for it; nullopt if it never came.
  std::optional<std::string> Get(const std::string& key,
                                 std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      v1::GetRequest req;
      req.set_key(key);
      req.set_wait_ms(
          static_cast<uint32_t>(std::min(left, kMaxGetWait).count()));
      v1::GetResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(Clock::now() + kMaxGetWait + std::chrono::seconds(5));
      // A server of an older generation may go away under a Get of the
      // next one's key: wait for the store to be served again.
      ctx.set_wait_for_ready(true);
      Track(&ctx, "get", key);
      grpc::Status s = stub_->Get(&ctx, req, &resp);
      Untrack(&ctx, "get", key);
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) continue;
      if (!s.ok()) Fail("get", key, s.error_message());
      if (resp.found()) return resp.value();
    }
  }

  [[noreturn]] void Fail(const char* op, const std::string& key,
                         const std::string& why) const {
    throw ::gloo::IoException(
        absl::StrCat("rendezvous store at MASTER_ADDR:MASTER_PORT = ", address_,
                     ": ", op, " '", key, "': ", why));
  }

  const std::string address_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KeyValueStore::Stub> stub_;

 private:
  std::mutex mu_;
  bool aborted_ = false;
  std::string why_;
  std::set<grpc::ClientContext*> in_flight_;
};

GrpcStore::GrpcStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcStore::~GrpcStore() = default;

absl::StatusOr<std::unique_ptr<GrpcStore>> GrpcStore::Connect(
    const std::string& host, int port,
    std::chrono::milliseconds connect_timeout,
    std::chrono::milliseconds timeout) {
  std::unique_ptr<GrpcStore> store = Create(host, port, timeout);
  if (absl::Status s = store->WaitConnected(connect_timeout); !s.ok()) return s;
  return store;
}

std::unique_ptr<GrpcStore> GrpcStore::Create(
    const std::string& host, int port, std::chrono::milliseconds timeout) {
  return std::unique_ptr<GrpcStore>(
      new GrpcStore(std::make_unique<Impl>(HostPort(host, port), timeout)));
}

absl::Status GrpcStore::WaitConnected(
    std::chrono::milliseconds connect_timeout) {
  // In short slices, so that Abort ends the wait.
  constexpr std::chrono::milliseconds kSlice{50};
  const auto deadline = Clock::now() + connect_timeout;
  while (!impl_->aborted()) {
    auto now = Clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no rendezvous store answered at MASTER_ADDR:MASTER_PORT = ",
          impl_->address_, " within ", connect_timeout.count() / 1000.0,
          " s (rank 0 or the launcher serves it: is it running, and are "
          "MASTER_ADDR and MASTER_PORT the same on every rank?)"));
    }
    if (impl_->channel_->WaitForConnected(std::min(now + kSlice, deadline)))
      return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat(
      "rendezvous store at MASTER_ADDR:MASTER_PORT = ", impl_->address_,
      ": connection given up (aborted)"));
}

void GrpcStore::Abort(const std::string& why) { impl_->Abort(why); }

void GrpcStore::set(const std::string& key, const std::vector<char>& data) {
  impl_->Set(key, data);
}

std::vector<char> GrpcStore::get(const std::string& key) {
  std::optional<std::string> v = impl_->Get(key, impl_->timeout_);
  if (!v.has_value()) {
    impl_->Fail(
        "get", key,
        absl::StrCat("not set within ", impl_->timeout_.count() / 1000.0,
                     " s (a rank did not join?)"));
  }
  return std::vector<char>(v->begin(), v->end());
}

void GrpcStore::wait(const std::vector<std::string>& keys) {
  wait(keys, impl_->timeout_);
}

void GrpcStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  auto deadline = Clock::now() + timeout;
  for (const std::string& key : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (!impl_->Get(key, std::max(left, std::chrono::milliseconds(1)))
             .has_value()) {
      impl_->Fail("wait", key,
                  absl::StrCat("not set within ", timeout.count() / 1000.0,
                               " s (a rank did not join?)"));
    }
  }
}

}  // namespace ckpt::worker
