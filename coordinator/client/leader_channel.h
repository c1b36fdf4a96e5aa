// CoordinatorClient: a client's connection to a set of ckpt-coordinator
// replicas (`--coordinator A:P[,B:P...]`) that follows the leader. A call
// goes to the replica that answered last; when that one is unreachable
// (UNAVAILABLE, DEADLINE_EXCEEDED) or answers "not leader" naming leader X
// in its "ckpt-leader" trailer (a standby, coordinator/service.h; an older
// coordinator named X only in the message, still read), the call is tried on X
// when X is in the list, else on the next address, at most once per address;
// the client then sticks to the replica that answered. With one address it is
// exactly one stub (coordinator/client/channel.h). TLS per
// coordinator/client/tls.h. Streams (CoordinatorWatch.WatchJob) follow the
// leader the same way: open one on watch_stub(), and after it ends call
// StreamEnded(), which moves the client on (to the named leader, else the next
// address) when the stream ended UNAVAILABLE or DEADLINE_EXCEEDED; the caller
// reopens. Thread-safe: calls may run concurrently (the "current" index is
// atomic).
#ifndef CKPT_COORDINATOR_CLIENT_LEADER_CHANNEL_H_
#define CKPT_COORDINATOR_CLIENT_LEADER_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/tls.h"

namespace ckpt::coordinator {

// "A:P[,B:P...]" -> addresses, each checked by ValidateHostPort; otherwise
// InvalidArgument naming `flag`.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ParseAddressList(
    const std::string& list, std::string_view flag);

// The trailing metadata key in which a standby names the leader's
// "HOST:PORT" (coordinator/service.h); the message says it too, for people.
inline constexpr char kLeaderMetadataKey[] = "ckpt-leader";

// The leader a refusal names: the kLeaderMetadataKey trailer when there is
// one, else (a coordinator older than the trailer) the address in a "not
// leader; leader is X" message; "" when neither names one.
std::string LeaderHint(
    const grpc::Status& s,
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers);
// The same with the trailers of the call made on `ctx`.
std::string LeaderHint(const grpc::Status& s, const grpc::ClientContext& ctx);
// The message alone, for a caller without the call's context.
std::string LeaderHint(const grpc::Status& s);

class CoordinatorClient {
 public:
  using Stub = coord::v1::Coordinator::Stub;
  using WatchStub = coord::v1::CoordinatorWatch::Stub;
  template <class Req, class Resp>
  using Method = grpc::Status (Stub::*)(grpc::ClientContext*, const Req&,
                                        Resp*);

  // `addresses` as for ParseAddressList; TLS files are read here.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorClient>>
  Create(const std::string& addresses, const TlsFiles& tls);

  // Each attempt has its own deadline of `timeout`. `trailers`, when
  // given, receives the trailing metadata of the last attempt (a relay
  // passes a refusal's ckpt-retry-after-ms and ckpt-leader on).
  template <class Req, class Resp>
  grpc::Status Call(
      Method<Req, Resp> method, const Req& req, Resp* resp,
      std::chrono::milliseconds timeout,
      std::multimap<std::string, std::string>* trailers = nullptr) {
    const size_t n = stubs_.size();
    size_t idx = current_.load() % n;
    grpc::Status s;
    for (size_t attempt = 0; attempt < n; ++attempt) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, timeout);
      s = (stubs_[idx].get()->*method)(&ctx, req, resp);
      if (trailers != nullptr) {
        trailers->clear();
        for (const auto& [k, v] : ctx.GetServerTrailingMetadata())
          trailers->emplace(std::string(k.data(), k.size()),
                            std::string(v.data(), v.size()));
      }
      if (!Retry(s)) {
        current_.store(idx);
        return WithHint(s);
      }
      idx = NextIndex(LeaderHint(s, ctx), idx);
    }
    return WithHint(s);
  }

  // The watch stub of the replica the client talks to now; *idx is that
  // replica's index, for StreamEnded.
  WatchStub* watch_stub(size_t* idx) {
    *idx = current_.load() % watch_stubs_.size();
    return watch_stubs_[*idx].get();
  }
  // A stream opened on replica `idx` with `ctx` ended with `s`; returns
  // `s` with the TLS hint of Call. Without ctx only the message is read.
  grpc::Status StreamEnded(const grpc::Status& s, size_t idx,
                           const grpc::ClientContext* ctx = nullptr) {
    if (Retry(s)) {
      size_t next = NextIndex(ctx ? LeaderHint(s, *ctx) : LeaderHint(s), idx);
      size_t expected = idx;
      current_.compare_exchange_strong(expected, next);
    }
    return WithHint(s);
  }

  // The replica the client talks to now ("HOST:PORT"), for messages.
  std::string current() const {
    return addresses_[current_.load() % addresses_.size()];
  }

 private:
  CoordinatorClient() = default;
  bool Retry(const grpc::Status& s) const;
  // An unreachable coordinator may be one that refused our TLS (or lack
  // of it): say what to check.
  grpc::Status WithHint(const grpc::Status& s) const;
  // The replica named `leader` when it is in the list, else the next one.
  size_t NextIndex(const std::string& leader, size_t idx) const;

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Stub>> stubs_;
  std::vector<std::unique_ptr<WatchStub>> watch_stubs_;
  std::atomic<size_t> current_{0};
  bool tls_ = false;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_CLIENT_LEADER_CHANNEL_H_
