// FaultInjectionBackend: a BackendWrapper for tests (after RocksDB's
// FaultInjectionTestFS) that overrides only the calls it injects faults into.
// It fails the Nth write or commit with a chosen errno, runs out of space past
// a byte budget, hangs writes until released, and simulates a crash: every
// object whose Commit() had not returned OK loses its data, and calls fail
// with Unavailable until Restart(). Tests then reopen and check that exactly
// the committed objects are visible. Thread-safe.
#ifndef CKPT_STORAGE_FAULT_BACKEND_H_
#define CKPT_STORAGE_FAULT_BACKEND_H_

#include <memory>

#include "storage/backend.h"

namespace ckpt::storage {

class FaultInjectionBackend : public BackendWrapper {
 public:
  // Does not own base; base must outlive this.
  explicit FaultInjectionBackend(Backend* base);
  using BackendWrapper::NewObjectWriter;
  ~FaultInjectionBackend() override;

  // The Nth WriteAt (1-based, counted from now, across writers) fails with err.
  void FailNthWrite(int n, int err);
  // The Nth Commit fails with err; that object does not become visible.
  void FailNthCommit(int n, int err);
  // Writes past `bytes` more bytes fail with ENOSPC.
  void SetSpaceLimit(uint64_t bytes);
  // Every WriteAt from now on blocks (a wedged disk) until ClearFaults().
  void HangWrites();
  void ClearFaults();
  // Drops every uncommitted object; later calls fail until Restart().
  void SimulateCrash();
  void Restart();

  std::string name() const override;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size,
      const WriterOptions& options) override;
  [[nodiscard]] absl::Status PutSmallObject(std::string_view key,
                                            std::string_view contents) override;
  // Readers fail once a crash is simulated, like every other call.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ObjectReader>> NewObjectReader(
      std::string_view key) override;
  absl::StatusOr<ObjectInfo> Stat(std::string_view key) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> List(
      std::string_view prefix) override;
  absl::Status Delete(std::string_view key) override;
  [[nodiscard]] absl::Status DeletePrefix(std::string_view prefix) override;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_FAULT_BACKEND_H_
