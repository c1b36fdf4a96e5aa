// The digest that names a save: its STAGED report's (ShardReport.
// staged_digest when set, else checksum_digest). A DURABLE report of the
// same save may carry another checksum_digest (device tensors' checksums
// are computed while persisting); a replica of it is checked against this.
#ifndef CKPT_COORDINATOR_SAVE_DIGEST_H_
#define CKPT_COORDINATOR_SAVE_DIGEST_H_

#include <cstdint>

namespace ckpt::coordinator {

template <typename ReportOrRecord>
uint64_t StagedDigest(const ReportOrRecord& r) {
  return r.has_staged_digest() ? r.staged_digest() : r.checksum_digest();
}

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_SAVE_DIGEST_H_
