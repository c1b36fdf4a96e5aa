#include "client/daemon_stub.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "util/status.h"

namespace ckpt::client {

namespace {

using std::chrono::milliseconds;

// Default deadline of short control RPCs; Register may create and pre-fault
// a large arena, restores may first load a shard from disk.
constexpr milliseconds kShortDeadline{std::chrono::seconds(60)};
constexpr milliseconds kLongDeadline{std::chrono::minutes(30)};
// Extra time given to RPCs that wait server-side for timeout_ms.
constexpr milliseconds kWaitSlack{std::chrono::seconds(30)};

absl::Status FromGrpc(const grpc::Status& s, const char* rpc,
                      const std::string& target) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(rpc, ": ", s.error_message());
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE)
    absl::StrAppend(&msg, " (", target, ")");
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

template <typename Resp, typename Req, typename Method>
absl::StatusOr<Resp> Call(v1::Ckptd::Stub* stub, Method method, const char* rpc,
                          const std::string& target, const Req& req,
                          milliseconds deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  Resp resp;
  grpc::Status s = (stub->*method)(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, rpc, target);
  return resp;
}

milliseconds WaitDeadline(uint32_t timeout_ms) {
  // 0 means the daemon's default (minutes): give it the long deadline.
  return timeout_ms == 0 ? kLongDeadline
                         : milliseconds(timeout_ms) + kWaitSlack;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonStub>> DaemonStub::Connect(
    const std::string& socket_path, milliseconds connect_timeout) {
  struct stat st {};
  if (::stat(socket_path.c_str(), &st) != 0)
    return absl::UnavailableError(
        absl::StrCat("socket_path ", socket_path,
                     ": cannot reach ckptd: ", std::strerror(errno)));
  if (!S_ISSOCK(st.st_mode))
    return absl::UnavailableError(
        absl::StrCat("socket_path ", socket_path, ": not a Unix socket"));
  std::string target = "unix:" + socket_path;
  grpc::ChannelArguments args;
  // A restore's tensor index can exceed gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 connect_timeout))
    return absl::UnavailableError(absl::StrCat("socket_path ", socket_path,
                                               ": ckptd did not answer within ",
                                               connect_timeout.count(), " ms"));
  return std::unique_ptr<DaemonStub>(
      new DaemonStub(target, v1::Ckptd::NewStub(channel)));
}

absl::StatusOr<v1::RegisterResponse> DaemonStub::Register(
    const v1::RegisterRequest& req) {
  return Call<v1::RegisterResponse>(stub_.get(), &v1::Ckptd::Stub::Register,
                                    "Register", target_, req, kLongDeadline);
}

absl::StatusOr<v1::BeginSaveResponse> DaemonStub::BeginSave(
    const v1::BeginSaveRequest& req) {
  milliseconds d =
      req.block() ? WaitDeadline(req.timeout_ms()) : kShortDeadline;
  return Call<v1::BeginSaveResponse>(stub_.get(), &v1::Ckptd::Stub::BeginSave,
                                     "BeginSave", target_, req, d);
}

absl::StatusOr<v1::CommitSaveResponse> DaemonStub::CommitSave(
    const v1::CommitSaveRequest& req) {
  return Call<v1::CommitSaveResponse>(stub_.get(), &v1::Ckptd::Stub::CommitSave,
                                      "CommitSave", target_, req,
                                      kShortDeadline);
}

absl::StatusOr<v1::AbortSaveResponse> DaemonStub::AbortSave(
    const v1::AbortSaveRequest& req) {
  return Call<v1::AbortSaveResponse>(stub_.get(), &v1::Ckptd::Stub::AbortSave,
                                     "AbortSave", target_, req, kShortDeadline);
}

absl::StatusOr<v1::LatestResponse> DaemonStub::Latest(
    const v1::LatestRequest& req) {
  return Call<v1::LatestResponse>(stub_.get(), &v1::Ckptd::Stub::Latest,
                                  "Latest", target_, req, kShortDeadline);
}

absl::StatusOr<v1::OpenRestoreResponse> DaemonStub::OpenRestore(
    const v1::OpenRestoreRequest& req) {
  return Call<v1::OpenRestoreResponse>(
      stub_.get(), &v1::Ckptd::Stub::OpenRestore, "OpenRestore", target_, req,
      kLongDeadline);
}

DaemonStub::RestoreStream::RestoreStream(const DaemonStub& stub,
                                         const v1::OpenRestoreRequest& req)
    : target_(stub.target_) {
  ctx_.set_deadline(std::chrono::system_clock::now() + kLongDeadline);
  reader_ = stub.stub_->OpenRestoreStream(&ctx_, req);
}

absl::Status DaemonStub::RestoreStream::Finish() {
  return FromGrpc(reader_->Finish(), "OpenRestore", target_);
}

absl::StatusOr<v1::CloseRestoreResponse> DaemonStub::CloseRestore(
    const v1::CloseRestoreRequest& req) {
  return Call<v1::CloseRestoreResponse>(
      stub_.get(), &v1::Ckptd::Stub::CloseRestore, "CloseRestore", target_, req,
      kShortDeadline);
}

absl::StatusOr<v1::LayoutIndexResponse> DaemonStub::LayoutIndex(
    const v1::LayoutIndexRequest& req) {
  // Reads the step's node manifests on a shared root or the object tier.
  return Call<v1::LayoutIndexResponse>(
      stub_.get(), &v1::Ckptd::Stub::LayoutIndex, "LayoutIndex", target_, req,
      kLongDeadline);
}

absl::StatusOr<v1::WaitDurableResponse> DaemonStub::WaitDurable(
    const v1::WaitDurableRequest& req) {
  return Call<v1::WaitDurableResponse>(
      stub_.get(), &v1::Ckptd::Stub::WaitDurable, "WaitDurable", target_, req,
      WaitDeadline(req.timeout_ms()));
}

}  // namespace ckpt::client
