// Prefaulter: reserves and faults in the slots of new arenas on one
// background thread, then registers each arena's memory with the storage
// backend, and publishes the outcome into the job table.
//
// Creating an arena allocates and faults in only the slot the first save
// writes (see shm::Arena::Create's prefault_slots); the remaining slots'
// pages are allocated and zeroed here (shm::Arena::ReserveSlots), off every
// RPC's path. Registering pins, and so faults, every page: only once they
// are faulted. The outcome goes to JobTable::RecordPrefaulted (the state,
// not the engine): the rank holding the arena gets its slots ready (or the
// reservation's error) and its waiters are woken; an arena dropped
// meanwhile is unregistered again here.
//
// Ownership: each queued arena is shared with its owner, so its mapping
// stays valid until the prefaulter is done with it even if the owner drops
// it meanwhile. Thread-safety: Add is safe from any thread, the job
// table's lock may be held; the thread takes the table's lock (through
// RecordPrefaulted) with no lock of its own held. The destructor drops
// what is still queued and joins the thread (callers must not hold the
// table's lock).
//
// Loads come first: while a load reads a shard into an arena (a restore
// from storage, the object tier after a restart), queued arenas wait
// (Hold). Zeroing another slot's pages beside the load takes the CPU from
// the transfer that a trainer waits for; a save needs those slots later.
// Likewise while a restore's client copies out of an arena (its read lease
// is open: BeginRead .. EndRead), that arena's queued slots wait, for at
// most `read_hold` (EngineOptions::prefault_read_hold) from the first open
// read: a client that never closes its lease cannot keep a save's slot
// back for longer. Other arenas in the queue are readied meanwhile.
#ifndef CKPT_DAEMON_STATE_PREFAULTER_H_
#define CKPT_DAEMON_STATE_PREFAULTER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "daemon/state/job_table.h"
#include "shm/arena.h"
#include "storage/backend.h"

namespace ckpt::daemon {

class Prefaulter {
 public:
  // table and backend must outlive the prefaulter. read_hold bounds how
  // long open restores hold an arena's queued slots back (BeginRead).
  Prefaulter(JobTable* table, storage::Backend* backend,
             std::chrono::milliseconds read_hold = std::chrono::seconds(2));
  ~Prefaulter();
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Queues the slots from `first_slot` on of `arena`.
  void Add(std::shared_ptr<shm::Arena> arena, uint32_t first_slot);

  // Holds queued arenas back while a load reads, from its construction
  // until its destruction or Release(): no arena's slots are started on
  // meanwhile (one being readied finishes). Take() holds again. A holder
  // that waits for the prefaulter (a slot it readies) releases first.
  class Hold {
   public:
    explicit Hold(Prefaulter* p) : p_(p) { Take(); }
    ~Hold() { Release(); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    void Take();
    void Release();

   private:
    Prefaulter* const p_;
    bool held_ = false;
  };
  // Returns once the thread has an arena queued and waits for the holds to
  // end (for tests: the wait is the thread's decision, not a race).
  void AwaitHeldBack();

  // A restore's read lease on the arena named `arena` opens / closes: while
  // one is open, and for at most read_hold from the first, the arena's
  // queued slots wait. Safe from any thread, the job table's lock may be
  // held. Every BeginRead is matched by one EndRead of the same name.
  void BeginRead(const std::string& arena);
  void EndRead(const std::string& arena);
  // One BeginRead of an arena, ended by reset() or the destructor: a load
  // holds the arena with it until the restore's lease takes over.
  class ReadHold {
   public:
    ReadHold() = default;
    ~ReadHold() { reset(); }
    ReadHold(const ReadHold&) = delete;
    ReadHold& operator=(const ReadHold&) = delete;
    // Ends the one held before, if any. p may be null (no prefaulter).
    void Take(Prefaulter* p, std::string arena);
    void reset();

   private:
    Prefaulter* p_ = nullptr;
    std::string arena_;
  };

 private:
  void Loop();
  // Reserves the arena's slots from `first` on and registers its memory.
  void Ready(const std::shared_ptr<shm::Arena>& arena, uint32_t first);

  JobTable* const table_;
  storage::Backend* const backend_;
  const std::chrono::milliseconds read_hold_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<shm::Arena>, uint32_t>> queue_;
  int holds_ = 0;
  // Arenas with open restore reads: how many, and since when (the first).
  struct Reads {
    int open = 0;
    std::chrono::steady_clock::time_point since;
  };
  std::map<std::string, Reads> reads_;
  bool held_back_ = false;  // the thread waits with an arena queued
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_STATE_PREFAULTER_H_
