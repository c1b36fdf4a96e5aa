#include "storage/shard_image.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt::storage {
namespace {

// Tensor names are untrusted: at most this much of one is quoted.
constexpr size_t kNameQuote = 64;

std::string Quote(std::string_view name) {
  return std::string(name.substr(0, kNameQuote));
}

}  // namespace

absl::StatusOr<ShardInfo> ValidateImage(std::span<const char> image,
                                        const ImageExpect& expect,
                                        std::string_view what_view) {
  const std::string what(what_view);
  const uint64_t bytes = image.size();
  if (bytes < 2 * kShardAlign)
    return absl::DataLossError(absl::StrCat(what, ": too short: ", bytes,
                                            " bytes, a shard needs at least ",
                                            2 * kShardAlign));
  absl::StatusOr<ShardHeader> header =
      DecodeHeader(image.subspan(0, kShardAlign));
  if (!header.ok()) return Annotate(header.status(), what);
  if (header->data_offset > bytes ||
      header->footer_offset > bytes - kShardAlign)
    return absl::DataLossError(
        absl::StrCat(what, ": offsets beyond the image's ", bytes, " bytes"));
  absl::StatusOr<ShardInfo> info = DecodeShardMetadata(
      image.subspan(0, header->data_offset),
      image.subspan(header->footer_offset, kShardAlign), bytes);
  if (!info.ok()) return Annotate(info.status(), what);
  if (info->step != expect.step || info->rank != expect.rank ||
      info->job != expect.job)
    return absl::DataLossError(absl::StrCat(
        what, ": holds job '", Quote(info->job), "' step ", info->step,
        " rank ", info->rank, ", not job '", Quote(expect.job), "' step ",
        expect.step, " rank ", expect.rank));
  return info;
}

absl::Status SameIndex(const ShardInfo& got, const ShardInfo& want,
                       const std::vector<bool>& known,
                       std::string_view what_view) {
  const std::string what(what_view);
  if (got.tensors.size() != want.tensors.size())
    return absl::DataLossError(absl::StrCat(what, ": ", got.tensors.size(),
                                            " tensors, expected ",
                                            want.tensors.size()));
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const ShardTensor& g = got.tensors[i];
    const ShardTensor& w = want.tensors[i];
    const bool check_sum = known.empty() || (i < known.size() && known[i]);
    if (g.name != w.name || g.offset != w.offset || g.bytes != w.bytes ||
        (check_sum && g.checksum != w.checksum) ||
        g.global_shape != w.global_shape ||
        g.piece_offsets != w.piece_offsets || g.global_name != w.global_name)
      return absl::DataLossError(
          absl::StrCat(what, ": tensor \"", Quote(g.name), "\" differs"));
  }
  return absl::OkStatus();
}

absl::Status VerifyTensorChecksum(const char* image, const ShardInfo& info,
                                  std::string_view what, size_t i) {
  const ShardTensor& t = info.tensors[i];
  const uint64_t found = TensorChecksum(image + t.offset, t.bytes);
  if (found == t.checksum) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "%s: tensor \"%s\": checksum mismatch (recorded %016x, found %016x)",
      what, Quote(t.name), t.checksum, found));
}

absl::Status VerifyTensorChecksums(const char* image, const ShardInfo& info,
                                   std::string_view what,
                                   const std::vector<bool>& known) {
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (!known.empty() && (i >= known.size() || !known[i])) continue;
    CKPT_RETURN_IF_ERROR(VerifyTensorChecksum(image, info, what, i));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::storage
