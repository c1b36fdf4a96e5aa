// SaveOneTensorStep: a save through the Engine's RPC methods (Register,
// BeginSave, writing the slot as a client would, CommitSave) of one 64 KiB
// uint8 tensor "w" filled with the step's low byte (or `fill`), by one rank
// of a job of world_size ranks (rank 0 of 1 by default), for the in-process
// engine tests (engine_test, object_tier_engine_test). The caller owns
// `arena`, the client-side mapping, which is (re)attached when the engine
// hands out another one. Not thread-safe: one test thread.
#ifndef CKPT_TESTS_ENGINE_SAVE_H_
#define CKPT_TESTS_ENGINE_SAVE_H_

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt.pb.h"
#include "ckpt/tensor.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/shard_format.h"
#include "util/checksum.h"

namespace ckpt::testing {

struct OneTensorSave {
  std::string job;
  uint64_t step = 0;
  bool block = false;    // BeginSave waits for a slot
  bool corrupt = false;  // one byte changes after its checksum was taken
  uint32_t rank = 0;
  uint32_t world_size = 1;
  int fill = -1;  // the byte the tensor holds; -1: the step's low byte
  // Committed as a device tensor is: has_checksum=false, checksum 0 (the
  // daemon computes it while persisting).
  bool device = false;
  std::optional<uint64_t> generation =
      std::nullopt;  // CommitSaveRequest.generation
};

[[nodiscard]] inline absl::Status SaveOneTensorStep(
    daemon::Engine* engine, const daemon::PeerCreds& peer,
    const OneTensorSave& save, std::unique_ptr<shm::Arena>* arena) {
  namespace v1 = ::ckpt::v1;
  v1::RegisterRequest rr;
  rr.set_job(save.job);
  rr.set_rank(save.rank);
  rr.set_world_size(save.world_size);
  rr.set_slot_bytes(4 << 20);
  auto reg = engine->Register(peer, rr);
  if (!reg.ok()) return reg.status();
  if (!*arena || (*arena)->name() != reg->shm_name()) {
    auto a = shm::Arena::Attach(reg->shm_name(), reg->arena_bytes(),
                                reg->slots_offset());
    if (!a.ok()) return a.status();
    *arena = std::move(*a);
  }
  std::vector<uint64_t> sizes = {64 << 10};
  auto layout = storage::ComputeLayout(sizes);
  if (!layout.ok()) return layout.status();
  v1::BeginSaveRequest br;
  br.set_job(save.job);
  br.set_rank(save.rank);
  br.set_step(save.step);
  br.set_block(save.block);
  br.set_image_bytes(layout->image_bytes);
  auto begin = engine->BeginSave(peer, br);
  if (!begin.ok()) return begin.status();
  char* dst =
      (*arena)->base() + begin->slot_offset() + layout->tensor_offsets[0];
  std::memset(dst, save.fill >= 0 ? save.fill : static_cast<int>(save.step),
              sizes[0]);
  v1::CommitSaveRequest cr;
  cr.set_job(save.job);
  cr.set_rank(save.rank);
  cr.set_step(save.step);
  cr.set_slot(begin->slot());
  cr.set_lease(begin->lease());
  v1::TensorMeta* m = cr.add_tensors();
  m->set_name("w");
  m->set_dtype(static_cast<uint32_t>(DType::kUInt8));
  m->add_shape(sizes[0]);
  m->set_offset(layout->tensor_offsets[0]);
  m->set_bytes(sizes[0]);
  m->set_checksum(save.device ? 0 : TensorChecksum(dst, sizes[0]));
  m->set_has_checksum(!save.device);
  if (save.generation) cr.set_generation(*save.generation);
  if (save.corrupt) dst[0] ^= 1;
  return engine->CommitSave(peer, cr);
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_ENGINE_SAVE_H_
