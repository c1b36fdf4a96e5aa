// The XML replies of an S3 store (ListObjectsV2, multipart uploads,
// errors), parsed with Boost.PropertyTree (its rapidxml parser:
// non-validating, no entities fetched; already a build dependency). Every
// reply is untrusted: a parse error or a missing field is DataLoss naming
// the request and the field. Not thread-safe (one reply, one thread).
#ifndef CKPT_STORAGE_OBJECT_XML_H_
#define CKPT_STORAGE_OBJECT_XML_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::storage::internal {

// One child element's text of a parsed XML reply, by path
// ("ListBucketResult.IsTruncated"). Parse errors and missing fields are
// DataLoss naming `what` and the field.
class XmlReply {
 public:
  [[nodiscard]] static absl::StatusOr<XmlReply> Parse(const std::string& body,
                                                      std::string what);
  ~XmlReply();
  XmlReply(XmlReply&&) noexcept;
  [[nodiscard]] absl::StatusOr<std::string> Get(const std::string& path) const;
  std::optional<std::string> Find(const std::string& path) const;
  // The text of `field` in each child named `child` of `parent`
  // ("ListBucketResult", "Contents", "Key").
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> Each(
      const std::string& parent, const std::string& child,
      const std::string& field) const;

 private:
  XmlReply();
  struct Tree;
  std::unique_ptr<Tree> tree_;
  std::string what_;
};

}  // namespace ckpt::storage::internal

#endif  // CKPT_STORAGE_OBJECT_XML_H_
