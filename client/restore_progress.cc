#include "client/restore_progress.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt::client {
namespace {

absl::Status Refuse(const std::string& field, const std::string& why) {
  return absl::InternalError(
      absl::StrCat("OpenRestoreStream: ", field, ": ", why));
}

}  // namespace

absl::Status RestoreProgressCheck::Next(const v1::RestoreProgress& msg,
                                        std::vector<uint32_t>* fresh) {
  fresh->clear();
  if (!broken_.ok()) return broken_;
  broken_ = Take(msg, fresh);
  if (!broken_.ok()) fresh->clear();
  return broken_;
}

absl::Status RestoreProgressCheck::Take(const v1::RestoreProgress& msg,
                                        std::vector<uint32_t>* fresh) {
  if (has_done_) return Refuse("done", "a message after the last one");
  if (msg.has_done()) {
    if (msg.has_opened() || msg.verified_size() != 0)
      return Refuse("done", "comes with opened or verified");
    const v1::OpenRestoreResponse& d = msg.done();
    if (has_opened_) {
      const v1::OpenRestoreResponse& o = opened_;
      if (d.shm_name() != o.shm_name() || d.arena_bytes() != o.arena_bytes() ||
          d.slot_offset() != o.slot_offset() ||
          d.image_bytes() != o.image_bytes())
        return Refuse("done",
                      absl::StrCat("slot at ", d.slot_offset(), " of ",
                                   d.shm_name(), " is not the opened one at ",
                                   o.slot_offset(), " of ", o.shm_name()));
      if (d.tensors_size() != o.tensors_size())
        return Refuse("done.tensors",
                      absl::StrCat(d.tensors_size(), " tensors, opened had ",
                                   o.tensors_size()));
      for (int i = 0; i < d.tensors_size(); ++i) {
        const v1::TensorMeta& a = d.tensors(i);
        const v1::TensorMeta& b = o.tensors(i);
        if (a.name() != b.name() || a.offset() != b.offset() ||
            a.bytes() != b.bytes() || a.has_checksum() != b.has_checksum() ||
            a.checksum() != b.checksum())
          return Refuse(absl::StrCat("done.tensors[", i, "]"),
                        "not the tensor opened named");
      }
    }
    done_ = d;
    has_done_ = true;
    return absl::OkStatus();
  }
  if (msg.has_opened()) {
    if (has_opened_) return Refuse("opened", "sent twice");
    opened_ = msg.opened();
    has_opened_ = true;
    verified_.assign(static_cast<size_t>(opened_.tensors_size()), false);
  } else if (msg.verified_size() == 0) {
    return Refuse("RestoreProgress", "an empty message");
  }
  if (msg.verified_size() != 0 && !has_opened_)
    return Refuse("verified", "before opened");
  for (int k = 0; k < msg.verified_size(); ++k) {
    const uint32_t t = msg.verified(k);
    if (t >= verified_.size())
      return Refuse(absl::StrCat("verified[", k, "]"),
                    absl::StrCat(t, " is not a tensor index (",
                                 verified_.size(), " tensors)"));
    if (verified_[t])
      return Refuse(absl::StrCat("verified[", k, "]"),
                    absl::StrCat("tensor ", t, " reported twice"));
    verified_[t] = true;
    fresh->push_back(t);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::client
