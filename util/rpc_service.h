// RpcService: a synchronous grpc::Service whose unary methods parse their
// requests themselves. gRPC's generated handlers answer a request body that
// does not parse (truncated, random bytes, invalid UTF-8 in a string field)
// with INTERNAL and an empty message; an RpcService answers
// INVALID_ARGUMENT naming the field where parsing failed, e.g.
// "tensors[2].name: truncated: 40 bytes declared, 3 left (request
// ckpt.v1.CommitSaveRequest of 97 bytes does not parse)".
//
// A subclass passes its proto service descriptor and registers each method
// with AddUnary(name, this, &Subclass::Method) (a server-streaming one
// with AddServerStreaming); the method keeps the signature of a generated
// handler. A method not registered answers
// UNIMPLEMENTED, as with the generated Service. Every request that parses
// first goes through Admit (a subclass may override it: who may call, is
// this replica serving); a refusal is the answer and the method does not
// run. The service must outlive
// the server it is registered with. Thread-safety: register every method
// before the server starts; the handlers then run concurrently on the
// server's threads, exactly as generated ones do.
#ifndef CKPT_UTIL_RPC_SERVICE_H_
#define CKPT_UTIL_RPC_SERVICE_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpc/grpc.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/sync_stream.h>

#include <deque>
#include <functional>
#include <string>
#include <string_view>

namespace ckpt::rpc {

// Why `bytes` does not parse as a message of `type`: "<field path>:
// <problem> (...)". Meant for bytes that the protobuf parser refused; for
// a failure it cannot pin to a field it still says which message and how
// many bytes.
std::string DescribeParseFailure(const google::protobuf::Descriptor& type,
                                 std::string_view bytes);

namespace internal {

// Parses and destroys `payload` (gRPC hands the handler its ownership).
[[nodiscard]] grpc::Status ParseRequest(grpc_byte_buffer* payload,
                                        google::protobuf::Message* request);

// The request of a call, parsed into the call's arena as gRPC's own
// handlers do; nullptr (and *status set) when it does not parse. The
// handler's RunHandler destroys it.
template <class Req>
Req* ParseInArena(grpc_call* call, grpc_byte_buffer* payload,
                  grpc::Status* status) {
  Req* request = new (grpc_call_arena_alloc(call, sizeof(Req))) Req;
  *status = ParseRequest(payload, request);
  if (status->ok()) return request;
  request->~Req();
  return nullptr;
}

template <class Req, class Resp>
class UnaryHandler final : public grpc::internal::MethodHandler {
 public:
  using Fn =
      std::function<grpc::Status(grpc::ServerContext*, const Req*, Resp*)>;
  explicit UnaryHandler(Fn fn) : fn_(std::move(fn)) {}

  void* Deserialize(grpc_call* call, grpc_byte_buffer* payload,
                    grpc::Status* status, void** /*handler_data*/) override {
    return ParseInArena<Req>(call, payload, status);  // freed in RunHandler
  }

  void RunHandler(const HandlerParameter& param) override {
    Resp response;
    grpc::Status status = param.status;
    if (status.ok()) {
      auto* request = static_cast<Req*>(param.request);
      status = fn_(static_cast<grpc::ServerContext*>(param.server_context),
                   request, &response);
      request->~Req();
    }
    grpc::internal::UnaryRunHandlerHelper(
        param, static_cast<google::protobuf::MessageLite*>(&response), status);
  }

 private:
  const Fn fn_;
};

// A server-streaming method: the request parsed as UnaryHandler's is, the
// rest gRPC's own handler (it writes the stream and the status).
template <class Self, class Req, class Resp>
class ServerStreamingHandler final : public grpc::internal::MethodHandler {
 public:
  using Fn = std::function<grpc::Status(Self*, grpc::ServerContext*, const Req*,
                                        grpc::ServerWriter<Resp>*)>;
  ServerStreamingHandler(Fn fn, Self* self) : run_(std::move(fn), self) {}

  void* Deserialize(grpc_call* call, grpc_byte_buffer* payload,
                    grpc::Status* status, void** /*handler_data*/) override {
    // Destroyed by run_'s RunHandler, as it destroys its own.
    return ParseInArena<Req>(call, payload, status);
  }
  void RunHandler(const HandlerParameter& param) override {
    run_.RunHandler(param);
  }

 private:
  grpc::internal::ServerStreamingHandler<Self, Req, Resp> run_;
};

}  // namespace internal

class RpcService : public grpc::Service {
 protected:
  // `service` must come from a generated descriptor (it lives forever).
  explicit RpcService(const google::protobuf::ServiceDescriptor* service)
      : service_(service) {}

  // Registers method `name` of the service; aborts if the service has no
  // such method or its request/response types differ (a programming error).
  template <class Self, class Req, class Resp>
  void AddUnary(std::string_view name, Self* self,
                grpc::Status (Self::*method)(grpc::ServerContext*, const Req*,
                                             Resp*)) {
    const char* path = MethodPath(name, Req::descriptor(), Resp::descriptor());
    AddMethod(new grpc::internal::RpcServiceMethod(
        path, grpc::internal::RpcMethod::NORMAL_RPC,
        new internal::UnaryHandler<Req, Resp>(
            [self, method, name = std::string(name)](
                grpc::ServerContext* ctx, const Req* req, Resp* resp) {
              grpc::Status admitted =
                  static_cast<RpcService*>(self)->Admit(ctx, name, *req);
              if (!admitted.ok()) return admitted;
              return (self->*method)(ctx, req, resp);
            })));
  }

  template <class Self, class Req, class Resp>
  void AddServerStreaming(
      std::string_view name, Self* self,
      grpc::Status (Self::*method)(grpc::ServerContext*, const Req*,
                                   grpc::ServerWriter<Resp>*)) {
    const char* path = MethodPath(name, Req::descriptor(), Resp::descriptor(),
                                  /*server_streaming=*/true);
    AddMethod(new grpc::internal::RpcServiceMethod(
        path, grpc::internal::RpcMethod::SERVER_STREAMING,
        new internal::ServerStreamingHandler<Self, Req, Resp>(
            [method, name = std::string(name)](
                Self* s, grpc::ServerContext* ctx, const Req* req,
                grpc::ServerWriter<Resp>* writer) {
              grpc::Status admitted =
                  static_cast<RpcService*>(s)->Admit(ctx, name, *req);
              if (!admitted.ok()) return admitted;
              return (s->*method)(ctx, req, writer);
            },
            self)));
  }

  // Called before each registered method with its name and parsed request;
  // the default admits every call.
  virtual grpc::Status Admit(grpc::ServerContext* /*ctx*/,
                             const std::string& /*method*/,
                             const google::protobuf::Message& /*request*/) {
    return grpc::Status::OK;
  }

 private:
  // "/package.Service/Method", kept alive here (gRPC keeps the pointer).
  const char* MethodPath(std::string_view name,
                         const google::protobuf::Descriptor* request,
                         const google::protobuf::Descriptor* response,
                         bool server_streaming = false);

  const google::protobuf::ServiceDescriptor* const service_;
  std::deque<std::string> paths_;
};

}  // namespace ckpt::rpc

#endif  // CKPT_UTIL_RPC_SERVICE_H_
