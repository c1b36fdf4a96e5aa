// XmlReply over Boost.PropertyTree.
#include "storage/object_xml.h"

#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "util/validate.h"

namespace ckpt::storage::internal {

struct XmlReply::Tree {
  boost::property_tree::ptree pt;
};

XmlReply::XmlReply() : tree_(std::make_unique<Tree>()) {}
XmlReply::~XmlReply() = default;
XmlReply::XmlReply(XmlReply&&) noexcept = default;

absl::StatusOr<XmlReply> XmlReply::Parse(const std::string& body,
                                         std::string what) {
  XmlReply reply;
  reply.what_ = std::move(what);
  try {
    std::istringstream in(body);
    boost::property_tree::read_xml(
        in, reply.tree_->pt, boost::property_tree::xml_parser::trim_whitespace);
  } catch (const boost::property_tree::ptree_error& e) {
    return absl::DataLossError(absl::StrCat(
        reply.what_, ": reply is not XML: ", QuotePrefix(e.what(), 120)));
  }
  return reply;
}

std::optional<std::string> XmlReply::Find(const std::string& path) const {
  boost::optional<std::string> v = tree_->pt.get_optional<std::string>(path);
  if (!v) return std::nullopt;
  return *v;
}

absl::StatusOr<std::string> XmlReply::Get(const std::string& path) const {
  std::optional<std::string> v = Find(path);
  if (!v)
    return absl::DataLossError(absl::StrCat(what_, ": reply has no ", path));
  return *v;
}

absl::StatusOr<std::vector<std::string>> XmlReply::Each(
    const std::string& parent, const std::string& child,
    const std::string& field) const {
  std::vector<std::string> out;
  boost::optional<const boost::property_tree::ptree&> p =
      static_cast<const boost::property_tree::ptree&>(tree_->pt)
          .get_child_optional(parent);
  if (!p)
    return absl::DataLossError(absl::StrCat(what_, ": reply has no ", parent));
  for (const auto& [name, node] : *p) {
    if (name != child) continue;
    boost::optional<std::string> v = node.get_optional<std::string>(field);
    if (!v)
      return absl::DataLossError(
          absl::StrCat(what_, ": ", parent, ".", child, " has no ", field));
    out.push_back(*v);
  }
  return out;
}

}  // namespace ckpt::storage::internal
