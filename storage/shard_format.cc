#include "storage/shard_format.h"

#include <cstddef>
#include <cstring>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/checksum.h"
#include "util/status.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::storage {
namespace {

bool AlignUp(uint64_t v, uint64_t* out) {
  if (v > UINT64_MAX - (kShardAlign - 1)) return false;
  *out = (v + kShardAlign - 1) / kShardAlign * kShardAlign;
  return true;
}

uint64_t HeaderChecksum(const ShardHeader& h) {
  return Hash64(&h, offsetof(ShardHeader, header_checksum));
}
uint64_t FooterChecksum(const ShardFooter& f) {
  return Hash64(&f, offsetof(ShardFooter, footer_checksum));
}

// Only built for a refusal; quotes at most a prefix of the name.
std::string TensorField(size_t i, std::string_view name,
                        std::string_view field) {
  return absl::StrFormat("tensors[%d] (%s).%s", i, QuotePrefix(name),
                         AV(field));
}

// Reads a NUL-padded fixed-size field: a NUL must occur, and every byte after
// the first NUL must be NUL too (the encoding is canonical).
absl::StatusOr<std::string> FixedString(const char* p, size_t n,
                                        std::string_view field) {
  const void* nul = std::memchr(p, 0, n);
  if (nul == nullptr)
    return absl::DataLossError(absl::StrCat(AV(field), ": not NUL-terminated"));
  size_t len = static_cast<const char*>(nul) - p;
  for (size_t i = len; i < n; ++i) {
    if (p[i] != 0)
      return absl::DataLossError(
          absl::StrCat(AV(field), ": garbage after the terminating NUL"));
  }
  return std::string(p, len);
}

absl::Status Mismatch(std::string_view field, uint64_t got, uint64_t want) {
  return absl::DataLossError(
      absl::StrFormat("%s: %d, expected %d", AV(field), got, want));
}

// Rejects anything but a pristine shard tail: the same message everywhere.
absl::Status SizeMismatch(uint64_t file_bytes, uint64_t image_bytes) {
  if (file_bytes < image_bytes)
    return absl::DataLossError(absl::StrFormat(
        "truncated: %d bytes, header says %d", file_bytes, image_bytes));
  return absl::DataLossError(
      absl::StrFormat("trailing bytes: file has %d bytes, header says %d",
                      file_bytes, image_bytes));
}

// Index bytes per tensor: the IndexEntry, and in version 2 its LayoutEntry.
uint64_t EntryBytes(uint32_t version) {
  return sizeof(IndexEntry) +
         (version == kShardVersionLayout ? sizeof(LayoutEntry) : 0);
}

absl::Status CheckLayoutFields(const ShardTensor& t, size_t i) {
  if (t.global_shape.empty()) {
    if (!t.piece_offsets.empty())
      return absl::InvalidArgumentError(
          absl::StrCat(TensorField(i, t.name, "piece_offsets"),
                       ": set without global_shape"));
    if (!t.global_name.empty())
      return absl::InvalidArgumentError(absl::StrCat(
          TensorField(i, t.name, "global_name"), ": set without global_shape"));
    return absl::OkStatus();
  }
  if (t.global_shape.size() != t.shape.size())
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d dims, shape has %d", TensorField(i, t.name, "global_shape"),
        t.global_shape.size(), t.shape.size()));
  if (t.piece_offsets.size() != t.shape.size())
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d dims, shape has %d", TensorField(i, t.name, "piece_offsets"),
        t.piece_offsets.size(), t.shape.size()));
  for (size_t d = 0; d < t.shape.size(); ++d) {
    const uint64_t g = t.global_shape[d], o = t.piece_offsets[d],
                   l = t.shape[d];
    if (o > g || l > g - o)
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s[%d]: offset %d + length %d exceed global_shape[%d] %d",
          TensorField(i, t.name, "piece_offsets"), d, o, l, d, g));
  }
  if (!t.global_name.empty())
    return ValidateTensorName(t.global_name,
                              TensorField(i, t.name, "global_name"));
  return absl::OkStatus();
}

}  // namespace

namespace {

// A LayoutEntry into t (whose ndim is known): canonical zeros everywhere a
// field is unused. ValidateShardInfo checks the values afterwards.
absl::Status DecodeLayoutEntry(const LayoutEntry& e, size_t i, ShardTensor* t) {
  const std::string field = TensorField(i, t->name, "layout");
  CKPT_ASSIGN_OR_RETURN(t->global_name,
                        FixedString(e.global_name, sizeof(e.global_name),
                                    absl::StrCat(field, ".global_name")));
  if (e.has_layout > 1)
    return absl::DataLossError(
        absl::StrFormat("%s.has_layout: %d, not 0 or 1", field, e.has_layout));
  if (e.reserved != 0)
    return absl::DataLossError(
        absl::StrFormat("%s.reserved: %d, not 0", field, e.reserved));
  const size_t nd = e.has_layout ? t->shape.size() : 0;
  for (size_t d = nd; d < kMaxTensorDims; ++d) {
    if (e.global_shape[d] != 0 || e.piece_offsets[d] != 0)
      return absl::DataLossError(
          absl::StrFormat("%s[%d]: nonzero in an unused dimension", field, d));
  }
  if (!e.has_layout) {
    if (!t->global_name.empty())
      return absl::DataLossError(
          absl::StrCat(field, ".global_name: set without a layout"));
    return absl::OkStatus();
  }
  if (nd == 0)
    return absl::DataLossError(
        absl::StrCat(field, ".has_layout: 1 for a scalar"));
  t->global_shape.assign(e.global_shape, e.global_shape + nd);
  t->piece_offsets.assign(e.piece_offsets, e.piece_offsets + nd);
  return absl::OkStatus();
}

}  // namespace

bool ShardInfo::HasLayout() const {
  for (const ShardTensor& t : tensors)
    if (!t.global_shape.empty()) return true;
  return false;
}

absl::StatusOr<ShardLayout> ComputeLayout(
    std::span<const uint64_t> tensor_bytes, bool with_layout) {
  if (tensor_bytes.size() > kMaxShardTensors)
    return absl::InvalidArgumentError(
        absl::StrFormat("num_tensors: %d, at most %d allowed",
                        tensor_bytes.size(), kMaxShardTensors));
  ShardLayout layout;
  layout.version = with_layout ? kShardVersionLayout : kShardVersion;
  layout.index_offset = kShardAlign;
  AlignUp(kShardAlign + tensor_bytes.size() * EntryBytes(layout.version),
          &layout.data_offset);
  layout.tensor_offsets.reserve(tensor_bytes.size());
  uint64_t pos = layout.data_offset;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    uint64_t start;
    if (!AlignUp(pos, &start) || tensor_bytes[i] > UINT64_MAX - start)
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensors[%d].bytes: %d overflows the layout", i, tensor_bytes[i]));
    layout.tensor_offsets.push_back(start);
    pos = start + tensor_bytes[i];
  }
  if (!AlignUp(pos, &layout.footer_offset) ||
      layout.footer_offset > UINT64_MAX - kShardAlign)
    return absl::InvalidArgumentError("tensor bytes overflow the layout");
  layout.image_bytes = layout.footer_offset + kShardAlign;
  return layout;
}

absl::Status ValidateShardInfo(ShardInfo* info) {
  if (absl::Status s = ValidateJobName(info->job, "job"); !s.ok()) return s;
  if (info->rank >= info->world_size)
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank: %d, must be below world_size %d", info->rank, info->world_size));
  if (info->tensors.size() > kMaxShardTensors)
    return absl::InvalidArgumentError(
        absl::StrFormat("tensors: %d, at most %d allowed", info->tensors.size(),
                        kMaxShardTensors));
  std::set<std::string_view> names;
  std::vector<uint64_t> sizes;
  sizes.reserve(info->tensors.size());
  for (size_t i = 0; i < info->tensors.size(); ++i) {
    const ShardTensor& t = info->tensors[i];
    // Every commit passes here: the field's full name is built only to refuse.
    if (!ValidateTensorName(t.name, "name").ok())
      return ValidateTensorName(t.name, TensorField(i, t.name, "name"));
    if (!names.insert(t.name).second)
      return absl::InvalidArgumentError(
          absl::StrCat(TensorField(i, t.name, "name"), ": duplicate name"));
    if (!IsValidDType(static_cast<uint32_t>(t.dtype)))
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d is not a known dtype", TensorField(i, t.name, "dtype"),
          static_cast<uint32_t>(t.dtype)));
    if (t.shape.size() > kMaxTensorDims)
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d dims, at most %d allowed", TensorField(i, t.name, "shape"),
          t.shape.size(), kMaxTensorDims));
    uint64_t numel = 1;
    bool overflow = false;
    for (uint64_t d : t.shape) {
      if (d != 0 && numel > UINT64_MAX / d) overflow = true;
      numel *= d;
    }
    uint64_t elem = DTypeSize(t.dtype);
    if (overflow || (elem != 0 && numel > UINT64_MAX / elem))
      return absl::InvalidArgumentError(absl::StrCat(
          TensorField(i, t.name, "shape"), ": element count overflows"));
    if (t.bytes != numel * elem)
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d, expected %d (numel %d * %d bytes)",
          TensorField(i, t.name, "bytes"), t.bytes, numel * elem, numel, elem));
    CKPT_RETURN_IF_ERROR(CheckLayoutFields(t, i));
    sizes.push_back(t.bytes);
  }
  CKPT_ASSIGN_OR_RETURN(ShardLayout layout,
                        ComputeLayout(sizes, info->HasLayout()));
  for (size_t i = 0; i < info->tensors.size(); ++i) {
    const ShardTensor& t = info->tensors[i];
    if (t.offset != layout.tensor_offsets[i])
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d, expected %d", TensorField(i, t.name, "offset"), t.offset,
          layout.tensor_offsets[i]));
  }
  info->layout = std::move(layout);
  return absl::OkStatus();
}

absl::Status EncodeShardMetadata(ShardInfo info, std::span<char> image) {
  CKPT_RETURN_IF_ERROR(ValidateShardInfo(&info));
  const ShardLayout& layout = info.layout;
  if (image.size() < layout.image_bytes)
    return absl::InvalidArgumentError(
        absl::StrFormat("image: %d bytes, the shard needs %d", image.size(),
                        layout.image_bytes));
  std::memset(image.data(), 0, layout.data_offset);
  char* index = image.data() + layout.index_offset;
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const ShardTensor& t = info.tensors[i];
    IndexEntry e;
    std::memset(&e, 0, sizeof(e));
    std::memcpy(e.name, t.name.data(), t.name.size());
    e.dtype = static_cast<uint32_t>(t.dtype);
    e.ndim = static_cast<uint32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) e.shape[d] = t.shape[d];
    e.offset = t.offset;
    e.bytes = t.bytes;
    e.checksum = t.checksum;
    std::memcpy(index + i * sizeof(IndexEntry), &e, sizeof(e));
  }
  const uint64_t num = info.tensors.size();
  if (layout.version == kShardVersionLayout) {
    char* table = index + num * sizeof(IndexEntry);
    for (size_t i = 0; i < num; ++i) {
      const ShardTensor& t = info.tensors[i];
      LayoutEntry e;
      std::memset(&e, 0, sizeof(e));
      if (!t.global_shape.empty()) {
        std::memcpy(e.global_name, t.global_name.data(), t.global_name.size());
        e.has_layout = 1;
        for (size_t d = 0; d < t.global_shape.size(); ++d) {
          e.global_shape[d] = t.global_shape[d];
          e.piece_offsets[d] = t.piece_offsets[d];
        }
      }
      std::memcpy(table + i * sizeof(LayoutEntry), &e, sizeof(e));
    }
  }
  const uint64_t index_checksum =
      Hash64(index, num * EntryBytes(layout.version));

  ShardHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kShardMagic, sizeof(h.magic));
  h.version = layout.version;
  h.header_bytes = sizeof(ShardHeader);
  h.step = info.step;
  h.rank = info.rank;
  h.world_size = info.world_size;
  h.num_tensors = static_cast<uint32_t>(info.tensors.size());
  h.index_entry_bytes = sizeof(IndexEntry);
  h.index_offset = layout.index_offset;
  h.data_offset = layout.data_offset;
  h.footer_offset = layout.footer_offset;
  h.image_bytes = layout.image_bytes;
  h.checksum_chunk_bytes = kChecksumChunk;
  h.index_checksum = index_checksum;
  h.created_unix_ns = info.created_unix_ns;
  std::memcpy(h.job, info.job.data(), info.job.size());
  h.header_checksum = HeaderChecksum(h);
  std::memcpy(image.data(), &h, sizeof(h));

  ShardFooter f;
  std::memset(&f, 0, sizeof(f));
  std::memcpy(f.magic, kFooterMagic, sizeof(f.magic));
  f.step = info.step;
  f.rank = info.rank;
  f.num_tensors = h.num_tensors;
  f.image_bytes = layout.image_bytes;
  f.index_checksum = index_checksum;
  f.footer_checksum = FooterChecksum(f);
  char* footer = image.data() + layout.footer_offset;
  std::memset(footer, 0, kShardAlign);
  std::memcpy(footer, &f, sizeof(f));
  return absl::OkStatus();
}

absl::StatusOr<ShardHeader> DecodeHeader(std::span<const char> first_block) {
  if (first_block.size() < kShardAlign)
    return absl::DataLossError(
        absl::StrFormat("truncated: %d bytes, a shard header needs %d",
                        first_block.size(), kShardAlign));
  ShardHeader h;
  std::memcpy(&h, first_block.data(), sizeof(h));
  if (std::memcmp(h.magic, kShardMagic, sizeof(h.magic)) != 0)
    return absl::DataLossError(
        "header.magic: not a ckpt shard (expected \"CKPTSHRD\")");
  if (h.version != kShardVersion && h.version != kShardVersionLayout)
    return absl::DataLossError(
        absl::StrFormat("header.version: %d, this build reads versions %d "
                        "and %d",
                        h.version, kShardVersion, kShardVersionLayout));
  if (h.header_bytes != sizeof(ShardHeader))
    return Mismatch("header.header_bytes", h.header_bytes, sizeof(ShardHeader));
  if (h.index_entry_bytes != sizeof(IndexEntry))
    return Mismatch("header.index_entry_bytes", h.index_entry_bytes,
                    sizeof(IndexEntry));
  uint64_t sum = HeaderChecksum(h);
  if (h.header_checksum != sum)
    return absl::DataLossError(
        absl::StrFormat("header.header_checksum: stored %#x, computed %#x",
                        h.header_checksum, sum));
  if (h.num_tensors > kMaxShardTensors)
    return absl::DataLossError(
        absl::StrFormat("header.num_tensors: %d, at most %d allowed",
                        h.num_tensors, kMaxShardTensors));
  if (h.index_offset != kShardAlign)
    return Mismatch("header.index_offset", h.index_offset, kShardAlign);
  uint64_t data_offset;
  AlignUp(kShardAlign + uint64_t{h.num_tensors} * EntryBytes(h.version),
          &data_offset);
  if (h.data_offset != data_offset)
    return Mismatch("header.data_offset", h.data_offset, data_offset);
  if (h.footer_offset < h.data_offset || h.footer_offset % kShardAlign != 0 ||
      h.footer_offset > UINT64_MAX - kShardAlign)
    return absl::DataLossError(absl::StrFormat(
        "header.footer_offset: %d is not a valid offset", h.footer_offset));
  if (h.image_bytes != h.footer_offset + kShardAlign)
    return Mismatch("header.image_bytes", h.image_bytes,
                    h.footer_offset + kShardAlign);
  if (h.checksum_chunk_bytes != kChecksumChunk)
    return Mismatch("header.checksum_chunk_bytes", h.checksum_chunk_bytes,
                    kChecksumChunk);
  return h;
}

absl::StatusOr<ShardInfo> DecodeShardMetadata(
    std::span<const char> head, std::span<const char> footer_block,
    uint64_t file_bytes) {
  CKPT_ASSIGN_OR_RETURN(ShardHeader h, DecodeHeader(head));
  if (file_bytes != h.image_bytes)
    return SizeMismatch(file_bytes, h.image_bytes);
  if (head.size() < h.data_offset)
    return absl::InvalidArgumentError(
        absl::StrFormat("head: %d bytes given, the index ends at %d",
                        head.size(), h.data_offset));
  if (footer_block.size() < sizeof(ShardFooter))
    return absl::InvalidArgumentError(
        absl::StrFormat("footer block: %d bytes given, need %d",
                        footer_block.size(), sizeof(ShardFooter)));

  const char* index = head.data() + h.index_offset;
  const uint64_t index_bytes = uint64_t{h.num_tensors} * EntryBytes(h.version);
  uint64_t index_sum = Hash64(index, index_bytes);
  if (index_sum != h.index_checksum)
    return absl::DataLossError(absl::StrFormat(
        "header.index_checksum: stored %#x, computed %#x over the index",
        h.index_checksum, index_sum));

  ShardFooter f;
  std::memcpy(&f, footer_block.data(), sizeof(f));
  if (std::memcmp(f.magic, kFooterMagic, sizeof(f.magic)) != 0)
    return absl::DataLossError("footer.magic: expected \"CKPTEND1\"");
  uint64_t footer_sum = FooterChecksum(f);
  if (f.footer_checksum != footer_sum)
    return absl::DataLossError(
        absl::StrFormat("footer.footer_checksum: stored %#x, computed %#x",
                        f.footer_checksum, footer_sum));
  if (f.step != h.step) return Mismatch("footer.step", f.step, h.step);
  if (f.rank != h.rank) return Mismatch("footer.rank", f.rank, h.rank);
  if (f.num_tensors != h.num_tensors)
    return Mismatch("footer.num_tensors", f.num_tensors, h.num_tensors);
  if (f.image_bytes != h.image_bytes)
    return Mismatch("footer.image_bytes", f.image_bytes, h.image_bytes);
  if (f.index_checksum != h.index_checksum)
    return Mismatch("footer.index_checksum", f.index_checksum,
                    h.index_checksum);

  ShardInfo info;
  CKPT_ASSIGN_OR_RETURN(info.job,
                        FixedString(h.job, sizeof(h.job), "header.job"));
  if (absl::Status s = ValidateJobName(info.job, "header.job"); !s.ok())
    return absl::DataLossError(s.message());
  info.step = h.step;
  info.rank = h.rank;
  info.world_size = h.world_size;
  info.created_unix_ns = h.created_unix_ns;
  info.tensors.resize(h.num_tensors);
  for (uint32_t i = 0; i < h.num_tensors; ++i) {
    IndexEntry e;
    std::memcpy(&e, index + uint64_t{i} * sizeof(IndexEntry), sizeof(e));
    ShardTensor& t = info.tensors[i];
    CKPT_ASSIGN_OR_RETURN(t.name,
                          FixedString(e.name, sizeof(e.name),
                                      absl::StrFormat("tensors[%d].name", i)));
    if (e.ndim > kMaxTensorDims)
      return absl::DataLossError(absl::StrFormat("%s: %d, at most %d allowed",
                                                 TensorField(i, t.name, "ndim"),
                                                 e.ndim, kMaxTensorDims));
    for (uint32_t d = e.ndim; d < kMaxTensorDims; ++d) {
      if (e.shape[d] != 0)
        return absl::DataLossError(
            absl::StrFormat("%s[%d]: %d in an unused dimension",
                            TensorField(i, t.name, "shape"), d, e.shape[d]));
    }
    t.dtype = static_cast<DType>(e.dtype);
    t.shape.assign(e.shape, e.shape + e.ndim);
    t.offset = e.offset;
    t.bytes = e.bytes;
    t.checksum = e.checksum;
    if (h.version == kShardVersionLayout) {
      LayoutEntry le;
      std::memcpy(&le,
                  index + uint64_t{h.num_tensors} * sizeof(IndexEntry) +
                      uint64_t{i} * sizeof(LayoutEntry),
                  sizeof(le));
      CKPT_RETURN_IF_ERROR(DecodeLayoutEntry(le, i, &t));
    }
  }
  if (absl::Status s = ValidateShardInfo(&info); !s.ok())
    return absl::DataLossError(s.message());
  // A version-2 shard must carry a layout (one encoding per shard).
  if (info.layout.version != h.version)
    return Mismatch("header.version", h.version, info.layout.version);
  if (info.layout.footer_offset != h.footer_offset)
    return Mismatch("header.footer_offset", h.footer_offset,
                    info.layout.footer_offset);
  return info;
}

}  // namespace ckpt::storage
