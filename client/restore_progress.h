// RestoreProgressCheck: the client's check of an OpenRestoreStream's
// messages (ckpt.proto's RestoreProgress). They come from ckptd over its
// socket, but are checked as every input is: `opened` first and once,
// `verified` naming tensors of `opened`, each once, `done` last and naming
// the slot and tensors `opened` named. A message that breaks a rule is an
// error naming the field; nothing is copied on its word.
//
// Thread-safety: one thread (the restore's).
#ifndef CKPT_CLIENT_RESTORE_PROGRESS_H_
#define CKPT_CLIENT_RESTORE_PROGRESS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "ckpt.pb.h"

namespace ckpt::client {

class RestoreProgressCheck {
 public:
  // Takes the next message; *fresh receives the tensors (indices into
  // opened().tensors) it reports verified. InternalError naming the field
  // for a message that breaks the protocol (then *fresh is empty, and
  // every later message is refused too).
  [[nodiscard]] absl::Status Next(const v1::RestoreProgress& msg,
                                  std::vector<uint32_t>* fresh);
  bool has_opened() const { return has_opened_; }
  bool has_done() const { return has_done_; }
  const v1::OpenRestoreResponse& opened() const { return opened_; }
  const v1::OpenRestoreResponse& done() const { return done_; }

 private:
  absl::Status Take(const v1::RestoreProgress& msg,
                    std::vector<uint32_t>* fresh);

  v1::OpenRestoreResponse opened_;
  v1::OpenRestoreResponse done_;
  bool has_opened_ = false;
  bool has_done_ = false;
  std::vector<bool> verified_;  // by index into opened_.tensors
  absl::Status broken_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_RESTORE_PROGRESS_H_
