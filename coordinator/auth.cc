#include "coordinator/auth.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::coordinator {
namespace {

bool IsAdminMethod(const std::string& method) {
  return method == "Rollback" || method == "Resume" || method == "Cordon" ||
         method == "Uncordon" || method == "CheckHealth";
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Quoted(const std::string& s) {
  return "\"" + s.substr(0, 64) + "\"";
}

}  // namespace

std::vector<std::string> PeerIdentities(const grpc::ServerContextBase& ctx) {
  std::vector<std::string> out;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (!auth) return out;
  for (const char* prop :
       {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME})
    for (const grpc::string_ref& v : auth->FindPropertyValues(prop)) {
      std::string id(v.data(), v.size());
      if (!Contains(out, id)) out.push_back(std::move(id));
    }
  return out;
}

grpc::Status Authorize(const grpc::ServerContextBase& ctx,
                       const std::string& method,
                       const google::protobuf::Message& request,
                       const AuthPolicy& policy) {
  if (!policy.mtls) return grpc::Status::OK;
  std::vector<std::string> ids = PeerIdentities(ctx);
  if (ids.empty())
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        method +
                            ": the client presented no certificate identity "
                            "(CN or subjectAltName)");
  const std::string who = "[" + absl::StrJoin(ids, ", ") + "]";
  if (IsAdminMethod(method)) {
    for (const std::string& id : ids)
      if (Contains(policy.admin_identities, id)) return grpc::Status::OK;
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat(method, ": the client certificate ", who,
                     " is not an admin identity (--admin-identities: ",
                     absl::StrJoin(policy.admin_identities, ","), ")"));
  }
  if (method == "RelayBatch") {
    for (const std::string& id : ids)
      if (Contains(policy.relay_identities, id)) return grpc::Status::OK;
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat(method, ": the client certificate ", who,
                     " is not a relay identity (--relay-identities: ",
                     policy.relay_identities.empty()
                         ? "none"
                         : absl::StrJoin(policy.relay_identities, ","),
                     ")"));
  }
  const google::protobuf::FieldDescriptor* field =
      request.GetDescriptor()->FindFieldByName("node_id");
  if (field &&
      field->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE &&
      !field->is_repeated()) {
    std::string node = request.GetReflection()->GetString(request, field);
    if (!Contains(ids, node))
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat(method, ": node_id ", Quoted(node),
                       ": the client certificate is for ", who,
                       ", not this node (a node may only speak for itself)"));
  }
  return grpc::Status::OK;
}

}  // namespace ckpt::coordinator
