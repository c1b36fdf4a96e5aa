// ArenaDrops: lets go of the arenas the job table dropped — the storage
// backend's unregister (unpinning every page), shm_unlink of the name and
// the daemon's unmap (freeing a GiB of shmem pages takes a noticeable
// fraction of a second) — on its own thread, so that no RPC waits for
// them behind the job table's lock.
//
// The table decides under its lock (the rank's slot table forgets the
// arena) and hands the arena over with Drop(); from then on nobody but this
// queue references it through the table. A name whose unlink is still
// queued must not be created again before the unlink ran (it would remove
// the new arena): whoever creates an arena calls AwaitUnlinked(name) first,
// with the table's lock released. Flush() waits until every queued drop is
// done (Delete answers once the arenas are gone).
//
// Thread-safety: every method is safe from any thread and takes only this
// queue's own lock; none may be called with a lock the queue's work needs
// (it needs none but its own). The destructor finishes what is queued.
#ifndef CKPT_DAEMON_PIPELINE_ARENA_DROPS_H_
#define CKPT_DAEMON_PIPELINE_ARENA_DROPS_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "shm/arena.h"
#include "storage/backend.h"

namespace ckpt::daemon {

class ArenaDrops {
 public:
  // backend (where arenas are registered) must outlive the queue.
  explicit ArenaDrops(storage::Backend* backend);
  ~ArenaDrops();
  ArenaDrops(const ArenaDrops&) = delete;
  ArenaDrops& operator=(const ArenaDrops&) = delete;

  // Queues the drop of `arena`: its memory is unregistered from the backend
  // when `registered`, its name unlinked when `unlink`, then the queue's
  // reference goes (the unmap, unless the prefaulter still holds one).
  void Drop(std::shared_ptr<shm::Arena> arena, bool registered, bool unlink);
  // Returns once no queued drop is left to unlink `name`.
  void AwaitUnlinked(const std::string& name);
  // Returns once every drop queued before the call is done.
  void Flush();

 private:
  struct Pending {
    std::shared_ptr<shm::Arena> arena;
    bool registered = false;
    bool unlink = false;
  };
  void Loop();

  storage::Backend* const backend_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // a drop queued, or stopping
  std::condition_variable done_cv_;  // a drop done (AwaitUnlinked, Flush)
  std::deque<Pending> queue_;
  std::multiset<std::string> unlinking_;  // names of queued unlinks
  uint64_t queued_ = 0;                   // drops ever queued
  uint64_t done_ = 0;                     // drops ever done
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PIPELINE_ARENA_DROPS_H_
