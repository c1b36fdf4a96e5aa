// The catalog's group writer. See catalog_writer.h.
#include "daemon/core/catalog_writer.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"

namespace ckpt::daemon {

CatalogWriter::CatalogWriter(Catalog* catalog) : catalog_(catalog) {
  thread_ = std::thread([this] { Loop(); });
}

CatalogWriter::~CatalogWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CatalogWriter::Enqueue(CatalogEdit edit, bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  queue_.push_back({ticket, std::move(edit), sync});
  cv_.notify_all();
  return ticket;
}

absl::Status CatalogWriter::Wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  while (done_ < ticket) {
    if (!writing_ && !queue_.empty())
      WriteGroupLocked(lock);  // no thread hop when the writer is idle
    else
      cv_.wait(lock);
  }
  auto run = failed_.upper_bound(ticket);
  if (run != failed_.begin()) {
    --run;
    const auto& [first, failed] = *run;
    if (ticket <= failed.last) {
      if (first == ticket && failed.last == ticket) return failed.status;
      return absl::Status(
          failed.status.code(),
          absl::StrCat("catalog edit ", ticket, " failed with edits ", first,
                       " to ", failed.last,
                       " (the first: ", failed.status.message(), ")"));
    }
  }
  if (ticket <= forgotten_)
    return absl::Status(
        forgotten_status_.code(),
        absl::StrCat("catalog edit ", ticket,
                     ": outcome no longer known (more than ", kMaxFailedRuns,
                     " runs of failed edits since; the last forgotten: ",
                     forgotten_status_.message(), ")"));
  return absl::OkStatus();
}

void CatalogWriter::RecordFailureLocked(uint64_t ticket, absl::Status status) {
  if (!failed_.empty()) {
    FailedRun& newest = failed_.rbegin()->second;
    if (newest.last + 1 == ticket && newest.status.code() == status.code()) {
      newest.last = ticket;
      return;
    }
  }
  failed_.emplace(ticket, FailedRun{ticket, std::move(status)});
  while (failed_.size() > kMaxFailedRuns) {
    forgotten_ = failed_.begin()->second.last;
    forgotten_status_ = failed_.begin()->second.status;
    failed_.erase(failed_.begin());
  }
}

void CatalogWriter::Flush() {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = next_ticket_ - 1;
  }
  if (last > 0) (void)Wait(last);
}

uint64_t CatalogWriter::groups_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_;
}

void CatalogWriter::WriteGroupLocked(std::unique_lock<std::mutex>& lock) {
  std::deque<Queued> group;
  group.swap(queue_);
  writing_ = true;
  lock.unlock();
  std::vector<const CatalogEdit*> edits;
  bool sync = false;
  for (const Queued& q : group) {
    edits.push_back(&q.edit);
    sync = sync || q.sync;
  }
  std::vector<std::pair<uint64_t, absl::Status>> failures;
  absl::Status s = catalog_->ApplyGroup(edits, sync);
  if (!s.ok()) {
    // One at a time, in order: only the edits that cannot be written fail.
    for (const Queued& q : group) {
      absl::Status one = catalog_->Apply(q.edit, q.sync);
      if (!one.ok()) {
        LogWarning(absl::StrCat("catalog: ", one.message()));
        failures.emplace_back(q.ticket, std::move(one));
      }
    }
  }
  lock.lock();
  for (auto& [ticket, status] : failures)
    RecordFailureLocked(ticket, std::move(status));
  done_ = group.back().ticket;
  ++groups_;
  writing_ = false;
  cv_.notify_all();
}

void CatalogWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !writing_ && (stopping_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stopping, nothing left
    WriteGroupLocked(lock);
  }
}

}  // namespace ckpt::daemon
