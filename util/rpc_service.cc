#include "util/rpc_service.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "util/validate.h"

namespace ckpt::rpc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

// Protobuf's own limit is 100; a request of ours nests two deep.
constexpr int kMaxDepth = 32;

bool IsVarintType(const FieldDescriptor& f) {
  switch (f.type()) {
    case FieldDescriptor::TYPE_INT32:
    case FieldDescriptor::TYPE_INT64:
    case FieldDescriptor::TYPE_UINT32:
    case FieldDescriptor::TYPE_UINT64:
    case FieldDescriptor::TYPE_SINT32:
    case FieldDescriptor::TYPE_SINT64:
    case FieldDescriptor::TYPE_BOOL:
    case FieldDescriptor::TYPE_ENUM:
      return true;
    default:
      return false;
  }
}

// The first problem in `data` read as a `type`, named by its field path
// (prefix + field name); empty if this level parses.
std::string FindProblem(const Descriptor& type, const uint8_t* data,
                        size_t size, const std::string& prefix, int depth) {
  if (depth > kMaxDepth)
    return absl::StrCat(prefix, ": nested more than ", kMaxDepth, " deep");
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  std::map<int, int> repeats;  // field number -> elements seen
  for (;;) {
    const size_t at = in.CurrentPosition();
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (at == size) return "";
      return absl::StrCat(prefix.empty() ? "request" : prefix,
                          ": malformed tag at byte ", at);
    }
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const FieldDescriptor* f = type.FindFieldByNumber(number);
    std::string name = f ? absl::StrCat(prefix, f->name())
                         : absl::StrCat(prefix, "field ", number);
    if (f && f->is_repeated() && f->type() == FieldDescriptor::TYPE_MESSAGE)
      absl::StrAppend(&name, "[", repeats[number]++, "]");
    const auto wire = WireFormatLite::GetTagWireType(tag);
    if (wire == WireFormatLite::WIRETYPE_END_GROUP)
      return absl::StrCat(name, ": unexpected end-group tag at byte ", at);
    if (wire != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag))
        return absl::StrCat(name, ": truncated or malformed value at byte ",
                            at);
      continue;
    }
    uint32_t len = 0;
    if (!in.ReadVarint32(&len))
      return absl::StrCat(name, ": malformed length at byte ", at);
    const size_t start = in.CurrentPosition();
    if (len > size - start)
      return absl::StrCat(name, ": truncated: ", len, " bytes declared, ",
                          size - start, " left");
    in.Skip(static_cast<int>(len));
    const uint8_t* p = data + start;
    if (!f) continue;
    if (f->type() == FieldDescriptor::TYPE_STRING &&
        !IsValidUtf8({reinterpret_cast<const char*>(p), len}))
      return absl::StrCat(name, ": not valid UTF-8 (use printable ASCII)");
    if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      std::string inner =
          FindProblem(*f->message_type(), p, len, name + ".", depth + 1);
      if (!inner.empty()) return inner;
    }
    if (f->is_repeated() && IsVarintType(*f)) {  // packed
      google::protobuf::io::CodedInputStream packed(p, static_cast<int>(len));
      uint64_t v;
      while (packed.CurrentPosition() < static_cast<int>(len))
        if (!packed.ReadVarint64(&v))
          return absl::StrCat(name, ": malformed packed value");
    }
  }
}

}  // namespace

std::string DescribeParseFailure(const Descriptor& type,
                                 std::string_view bytes) {
  std::string where =
      FindProblem(type, reinterpret_cast<const uint8_t*>(bytes.data()),
                  bytes.size(), "", 0);
  if (where.empty()) where = "request: does not parse";
  return absl::StrCat(where, " (request ", type.full_name(), " of ",
                      bytes.size(), " bytes does not parse)");
}

namespace internal {

grpc::Status ParseRequest(grpc_byte_buffer* payload,
                          google::protobuf::Message* request) {
  const Descriptor& type = *request->GetDescriptor();
  if (payload == nullptr)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("request: no ", type.full_name(),
                                     " message in a unary call"));
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, payload)) {
    grpc_byte_buffer_destroy(payload);
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("request: cannot decompress the ", type.full_name()));
  }
  // One copy into a contiguous slice: the requests are small, and the
  // failure path needs the bytes in one piece anyway.
  grpc_slice slice = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  grpc_byte_buffer_destroy(payload);
  std::string_view bytes(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
      GRPC_SLICE_LENGTH(slice));
  grpc::Status status;
  if (!request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          DescribeParseFailure(type, bytes));
  grpc_slice_unref(slice);
  return status;
}

}  // namespace internal

const char* RpcService::MethodPath(std::string_view name,
                                   const Descriptor* request,
                                   const Descriptor* response,
                                   bool server_streaming) {
  const google::protobuf::MethodDescriptor* m =
      service_->FindMethodByName(std::string(name));
  if (m == nullptr || m->input_type() != request ||
      m->output_type() != response || m->client_streaming() ||
      m->server_streaming() != server_streaming) {
    std::fprintf(
        stderr, "RpcService: %s has no %s method %.*s(%s) returns (%s%s)\n",
        service_->full_name().c_str(),
        server_streaming ? "server-streaming" : "unary",
        static_cast<int>(name.size()), name.data(),
        request->full_name().c_str(), server_streaming ? "stream " : "",
        response->full_name().c_str());
    std::abort();
  }
  paths_.push_back(absl::StrCat("/", service_->full_name(), "/", m->name()));
  return paths_.back().c_str();
}

}  // namespace ckpt::rpc
