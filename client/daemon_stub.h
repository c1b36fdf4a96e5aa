// DaemonStub: the client's gRPC connection to ckptd over its Unix socket.
//
// Each method is one RPC with a deadline; a failed RPC becomes an
// absl::Status with the same code (gRPC and absl codes coincide) and the RPC
// name in front of the daemon's message. Thread-safe: RPCs may be issued
// concurrently from several threads.
#ifndef CKPT_CLIENT_DAEMON_STUB_H_
#define CKPT_CLIENT_DAEMON_STUB_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt.grpc.pb.h"
#include "ckpt.pb.h"

namespace ckpt::client {

class DaemonStub {
 public:
  // Opens "unix:<socket_path>" and waits (up to connect_timeout) until the
  // daemon answers; Unavailable naming the socket if it does not.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DaemonStub>> Connect(
      const std::string& socket_path,
      std::chrono::milliseconds connect_timeout);

  [[nodiscard]] absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& req);
  // Blocking BeginSave may wait for a slot up to its own timeout_ms.
  [[nodiscard]] absl::StatusOr<v1::BeginSaveResponse> BeginSave(
      const v1::BeginSaveRequest& req);
  [[nodiscard]] absl::StatusOr<v1::CommitSaveResponse> CommitSave(
      const v1::CommitSaveRequest& req);
  [[nodiscard]] absl::StatusOr<v1::AbortSaveResponse> AbortSave(
      const v1::AbortSaveRequest& req);
  [[nodiscard]] absl::StatusOr<v1::LatestResponse> Latest(
      const v1::LatestRequest& req);
  [[nodiscard]] absl::StatusOr<v1::OpenRestoreResponse> OpenRestore(
      const v1::OpenRestoreRequest& req);
  // OpenRestoreStream (ckpt.proto's RestoreProgress): Read each message in
  // turn; after the last, Finish says how the stream ended, its error
  // named as OpenRestore's ("OpenRestore: ..."). Not thread-safe.
  class RestoreStream {
   public:
    RestoreStream(const DaemonStub& stub, const v1::OpenRestoreRequest& req);
    [[nodiscard]] bool Read(v1::RestoreProgress* msg) {
      return reader_->Read(msg);
    }
    [[nodiscard]] absl::Status Finish();

   private:
    grpc::ClientContext ctx_;
    std::unique_ptr<grpc::ClientReader<v1::RestoreProgress>> reader_;
    const std::string target_;
  };
  [[nodiscard]] std::unique_ptr<RestoreStream> OpenRestoreStream(
      const v1::OpenRestoreRequest& req) {
    return std::make_unique<RestoreStream>(*this, req);
  }
  [[nodiscard]] absl::StatusOr<v1::CloseRestoreResponse> CloseRestore(
      const v1::CloseRestoreRequest& req);
  [[nodiscard]] absl::StatusOr<v1::LayoutIndexResponse> LayoutIndex(
      const v1::LayoutIndexRequest& req);
  [[nodiscard]] absl::StatusOr<v1::WaitDurableResponse> WaitDurable(
      const v1::WaitDurableRequest& req);

 private:
  DaemonStub(std::string target, std::unique_ptr<v1::Ckptd::Stub> stub)
      : target_(std::move(target)), stub_(std::move(stub)) {}

  std::string target_;
  std::unique_ptr<v1::Ckptd::Stub> stub_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_DAEMON_STUB_H_
