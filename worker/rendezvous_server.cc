#include "worker/rendezvous_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "rendezvous.grpc.pb.h"

namespace ckpt::worker {

namespace v1 = ::ckpt::worker::rendezvous::v1;
using Clock = std::chrono::system_clock;

// A Get holds a server thread while it waits; bounding each wait keeps a
// shutdown quick and lets the client re-check its own deadline.
constexpr std::chrono::milliseconds kMaxServerWait{1000};

std::string HostPort(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

namespace {

// A key too long to be a rendezvous key: named by its first bytes only.
std::string KeyName(const std::string& key) {
  return key.size() <= 64 ? key : absl::StrCat(key.substr(0, 64), "...");
}

grpc::Status CheckKey(const std::string& key) {
  if (key.empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "key: empty");
  if (key.size() > StoreServer::kMaxKeyBytes)
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("key '", KeyName(key), "': ", key.size(), " bytes, above ",
                     StoreServer::kMaxKeyBytes));
  return grpc::Status::OK;
}

}  // namespace

class StoreServer::Impl final : public v1::KeyValueStore::Service {
 public:
  grpc::Status Set(grpc::ServerContext*, const v1::SetRequest* req,
                   v1::SetResponse*) override {
    if (grpc::Status s = CheckKey(req->key()); !s.ok()) return s;
    if (req->value().size() > kMaxValueBytes)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("value of key '", KeyName(req->key()),
                                       "': ", req->value().size(),
                                       " bytes, above ", kMaxValueBytes));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (values_.size() >= kMaxKeys && values_.count(req->key()) == 0)
        return grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("key '", KeyName(req->key()), "': the store holds ",
                         kMaxKeys, " keys already"));
      values_[req->key()] = req->value();
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext*, const v1::GetRequest* req,
                   v1::GetResponse* resp) override {
    if (grpc::Status s = CheckKey(req->key()); !s.ok()) return s;
    auto wait =
        std::min(std::chrono::milliseconds(req->wait_ms()), kMaxServerWait);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait,
                 [&] { return stopping_ || values_.count(req->key()) > 0; });
    auto it = values_.find(req->key());
    if (it != values_.end()) {
      resp->set_found(true);
      resp->set_value(it->second);
    }
    return grpc::Status::OK;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (server_) server_->Shutdown(Clock::now() + std::chrono::seconds(2));
  }

  std::unique_ptr<grpc::Server> server_;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  bool stopping_ = false;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() { impl_->Stop(); }

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(
    const std::string& host, int port) {
  auto impl = std::make_unique<Impl>();
  std::string address = HostPort(host, port);
  int bound = 0;
  grpc::ServerBuilder builder;
  // Two jobs given the same port must not share it silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxValueBytes) + 4096);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(impl.get());
  impl->server_ = builder.BuildAndStart();
  if (!impl->server_ || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the rendezvous store at ", address,
                     " (port in use, or not an address of this host?)"));
  }
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

}  // namespace ckpt::worker
