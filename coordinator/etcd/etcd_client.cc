#include "coordinator/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "coordinator/client/channel.h"
#include "util/log.h"
#include "util/retry.h"

namespace ckpt::coordinator::etcd {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const char* what,
                      const std::string& endpoint) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(s.error_code()),
      absl::StrCat("etcd ", what, " at ", endpoint, ": ", s.error_message()));
}

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) != 0xff) {
      end.back() =
          static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints,
                       std::chrono::milliseconds timeout,
                       std::shared_ptr<grpc::ChannelCredentials> credentials)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {
  if (!credentials) credentials = grpc::InsecureChannelCredentials();
  for (const std::string& ep : endpoints_) {
    grpc::ChannelArguments args;
    // Reconnect soon after a member comes back;
    // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at its default because it also
    // bounds each connection attempt, and a busy member may take longer than
    // 100 ms to complete one.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel = grpc::CreateCustomChannel(ep, credentials, args);
    kv_.push_back(etcdserverpb::KV::NewStub(channel));
    lease_.push_back(etcdserverpb::Lease::NewStub(channel));
    watch_.push_back(etcdserverpb::Watch::NewStub(channel));
  }
}

std::string EtcdClient::endpoint() const {
  return endpoints_[current_.load() % endpoints_.size()];
}

template <typename Call>
absl::Status EtcdClient::WithFailover(const char* what, Call call) {
  absl::Status last;
  const size_t start = current_.load();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t idx = (start + i) % endpoints_.size();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
    last = FromGrpc(call(idx, &ctx), what, endpoints_[idx]);
    if (!IsUnreachable(last)) {
      if (idx != start % endpoints_.size()) {
        LogWarning(
            absl::StrCat("etcd: member ", endpoints_[start % endpoints_.size()],
                         " unreachable; now talking to ", endpoints_[idx]));
        current_.store(idx);
      }
      return last;
    }
  }
  return last;
}

template <typename Response, typename Call>
absl::StatusOr<Response> EtcdClient::Unary(const char* what, Call call) {
  Response resp;
  absl::Status s = WithFailover(what, [&](size_t i, grpc::ClientContext* ctx) {
    resp.Clear();
    return call(i, ctx, &resp);
  });
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& req) {
  return Unary<etcdserverpb::RangeResponse>(
      "Range", [&](size_t i, grpc::ClientContext* ctx, auto* resp) {
        return kv_[i]->Range(ctx, req, resp);
      });
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(
    const etcdserverpb::TxnRequest& req) {
  return Unary<etcdserverpb::TxnResponse>(
      "Txn", [&](size_t i, grpc::ClientContext* ctx, auto* resp) {
        return kv_[i]->Txn(ctx, req, resp);
      });
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> EtcdClient::LeaseGrant(
    int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  auto resp = Unary<etcdserverpb::LeaseGrantResponse>(
      "LeaseGrant", [&](size_t i, grpc::ClientContext* ctx, auto* r) {
        return lease_[i]->LeaseGrant(ctx, req, r);
      });
  if (resp.ok() && !resp->error().empty())
    return absl::UnavailableError("etcd LeaseGrant: " + resp->error());
  return resp;
}

absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> EtcdClient::KeepAlive(
    int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  return Unary<etcdserverpb::LeaseKeepAliveResponse>(
      "LeaseKeepAlive", [&](size_t i, grpc::ClientContext* ctx, auto* resp) {
        auto stream = lease_[i]->LeaseKeepAlive(ctx);
        bool answered = stream->Write(req) && stream->Read(resp);
        stream->WritesDone();
        if (answered) ctx->TryCancel();  // one keepalive is all we wanted
        grpc::Status st = stream->Finish();
        if (answered) return grpc::Status::OK;
        return st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                      "keepalive stream closed")
                       : st;
      });
}

absl::StatusOr<bool> EtcdClient::WatchForDelete(
    const std::string& key, int64_t from_revision,
    std::chrono::milliseconds max_wait, std::mutex* mu,
    grpc::ClientContext** active) {
  const size_t idx = current_.load() % endpoints_.size();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + max_wait);
  {
    std::lock_guard<std::mutex> lock(*mu);
    *active = &ctx;
  }
  auto stream = watch_[idx]->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  req.mutable_create_request()->set_key(key);
  req.mutable_create_request()->set_start_revision(from_revision);
  bool deleted = false;
  etcdserverpb::WatchResponse resp;
  if (stream->Write(req)) {
    while (!deleted && stream->Read(&resp)) {
      if (resp.canceled() || resp.compact_revision() > 0) break;
      for (const mvccpb::Event& e : resp.events())
        deleted = deleted || e.type() == mvccpb::Event::DELETE;
    }
  }
  ctx.TryCancel();
  grpc::Status st = stream->Finish();
  {
    std::lock_guard<std::mutex> lock(*mu);
    *active = nullptr;
  }
  if (deleted) return true;
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    current_.store((idx + 1) % endpoints_.size());
    return FromGrpc(st, "Watch", endpoints_[idx]);
  }
  return false;  // deadline, cancelled, compacted: the caller reads the key
                 // again
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseRevokeResponse resp;
  return WithFailover("LeaseRevoke", [&](size_t i, grpc::ClientContext* ctx) {
    return lease_[i]->LeaseRevoke(ctx, req, &resp);
  });
}

}  // namespace ckpt::coordinator::etcd
