// The lifecycle of one save of a rank's shard on this node, and the one
// place each other representation of it is derived from:
//
//   (commit) kStaged ──▶ kPersisting ──▶ kDurable ──▶ kFailed
//               ▲  │          │  │                       ▲
//               └──┼──────────┘  └───────────────────────┤
//                  └─────────────────────────────────────┘
//
// kStaged: committed to a slot, not yet on storage (also after a failed
// attempt, retried while the bytes are in memory). kPersisting: the
// persister writes it. kDurable: its file is on storage (a prefetch, a
// load and a recovered file start here). kFailed: for good (its bytes
// changed after the commit, its slot went to a newer save while its
// persist kept failing, or every copy failed verification); nothing
// leaves it. Recovery may adopt a staged shard's file: kStaged → kDurable.
//
// A save is also identified by its generation (Shard::gen, unique per
// engine) and by the job generation it was made in (the catalog record's
// `generation`, reported to the coordinator).
//
// The slot state mirrored into the arena, the catalog record's state and
// the RPC's state are each a function of the phase below; nothing else
// sets them. Thread-safety: plain functions.
#ifndef CKPT_DAEMON_CORE_SHARD_PHASE_H_
#define CKPT_DAEMON_CORE_SHARD_PHASE_H_

#include "catalog.pb.h"
#include "ckpt.pb.h"
#include "shm/arena.h"

namespace ckpt::daemon {

// The catalog's records (proto/catalog.proto).
namespace catv1 = ::ckpt::catalog::v1;

enum class ShardPhase { kStaged, kPersisting, kDurable, kFailed };

const char* ShardPhaseName(ShardPhase phase);
// Whether a shard may go from `from` to `to`.
bool LegalTransition(ShardPhase from, ShardPhase to);

// The state of the slot holding the shard. A failed shard's slot stays
// kStaged (the bytes are there, for tools) and is reclaimable.
shm::SlotState SlotStateOf(ShardPhase phase);
// The RPC's view of a slot (Status): the slot's state, named for clients.
v1::SlotState RpcSlotStateOf(shm::SlotState state);
// The catalog record's state: kPersisting is recorded as STAGED (a restart
// persists it again).
catv1::ShardRecord::State CatalogStateOf(ShardPhase phase);
// The phase a recovered record starts its new life in: DURABLE records
// kDurable; any other (STAGED, and FAILED, which a restart tries once
// more) kStaged: recovery persists its image if a slot still holds it,
// adopts its file if that is the recorded save, or drops it.
ShardPhase PhaseOfRecord(catv1::ShardRecord::State state);
// What List answers.
v1::ShardState RpcStateOf(ShardPhase phase);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_SHARD_PHASE_H_
