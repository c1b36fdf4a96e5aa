// What a ranged fetch from a peer works with (doc/resharding.md, "Byte
// ranges from a peer"): a byte range of a shard image, and the slot such a
// fetch fills (daemon/replica/ranged_read.h, ReplicaSource's
// FetchRangesFromPeer). Plain data.
#ifndef CKPT_DAEMON_CORE_RANGED_SLOT_H_
#define CKPT_DAEMON_CORE_RANGED_SLOT_H_

#include <cstdint>

#include "ckpt.pb.h"

namespace ckpt::daemon {

struct ImageRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A ranged fetch's slot: only the chunks the ranges touch and the image's
// header, index and footer are there; it belongs to no shard of the table
// and is held by one reader, the caller's lease (its EndRead frees it).
struct RangedSlot {
  int slot = -1;
  uint64_t image_bytes = 0;
  uint64_t wire_bytes = 0;  // what came over the network
  // The image's index, each touched tensor with the save's chunk hashes.
  google::protobuf::RepeatedPtrField<v1::TensorMeta> tensors;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_RANGED_SLOT_H_
