// Test helper shared by the hostile-client tests of ckptd and of the
// coordinator: sends bytes, exactly as given, as the request body of a unary
// gRPC method, the way a client that does not use our protos would, and
// returns the call's status. Header-only; thread-safe (no shared state).
#ifndef CKPT_TESTS_RAW_GRPC_CALL_H_
#define CKPT_TESTS_RAW_GRPC_CALL_H_

#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <memory>
#include <string>

namespace ckpt::testing {

// method is the full name, e.g. "/ckpt.v1.Ckptd/Register".
inline grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method,
                                 const std::string& body,
                                 std::chrono::seconds deadline) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  grpc::Slice slice(body.data(), body.size());
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok))
    return grpc::Status(grpc::StatusCode::INTERNAL, "no completion");
  return status;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_RAW_GRPC_CALL_H_
