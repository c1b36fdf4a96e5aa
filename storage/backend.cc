#include "storage/backend.h"

#include "util/status.h"

namespace ckpt::storage {

absl::StatusOr<uint64_t> Backend::ObjectSize(std::string_view key) {
  CKPT_ASSIGN_OR_RETURN(ObjectInfo info, Stat(key));
  return info.size;
}

absl::Status Backend::ReadAt(std::string_view key, uint64_t offset, void* dst,
                             uint64_t len) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader,
                        NewObjectReader(key));
  return reader->ReadAt(offset, dst, len);
}

}  // namespace ckpt::storage
