#include "bench/progress_cost.h"

#include <atomic>
#include <chrono>

#include "ckpt/ckpt.h"
#include "tests/harness.h"

namespace ckpt::bench {
namespace {

template <typename Body>
double NsPerCall(long calls, Body&& body) {
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) body(i);
  std::chrono::duration<double, std::nano> d =
      std::chrono::steady_clock::now() - t0;
  return d.count() / static_cast<double>(calls);
}

}  // namespace

absl::StatusOr<ProgressCost> MeasureProgressCost(const std::string& dir,
                                                 long calls) {
  const std::string prefix = testing::UniqueShmPrefix();
  auto daemon =
      testing::DaemonProcess::Start(dir + "/progress-root", dir, prefix);
  if (!daemon.ok()) return daemon.status();
  ProgressCost cost;
  {
    auto client =
        Client::Connect(testing::OptionsFor(**daemon, "progress-bench", 0, 1));
    if (!client.ok()) return client.status();
    testing::HostState state = testing::MakeState(1 << 20, 2, 1);
    if (absl::Status s = (*client)->Save(1, state.tensors); !s.ok()) return s;
    Client& c = **client;
    cost.progress_ns = NsPerCall(calls, [&](long i) { c.Progress(i); });
    cost.progress_compute_ns =
        NsPerCall(calls, [&](long i) { c.Progress(i, 0.125); });
    // The C API over the same client: ckpt_client wraps a Client, but a
    // binding holds it through ckpt_connect, so measure one of its own.
    ckpt_options o;
    ckpt_options_init(&o);
    const std::string socket = (*daemon)->socket();
    o.socket_path = socket.c_str();
    o.slot_bytes = 2 << 20;  // registers at once: the beacon is there
    o.job = "progress-bench-c";
    o.rank = 0;
    o.world_size = 1;
    ckpt_client* cc = nullptr;
    if (ckpt_connect(&o, &cc) != CKPT_OK)
      return absl::InternalError(ckpt_last_error());
    cost.c_api_ns =
        NsPerCall(calls, [&](long i) { (void)ckpt_progress(cc, i, -1.0); });
    ckpt_close(cc);
    alignas(64) static std::atomic<long> word{0};
    cost.store_ns = NsPerCall(
        calls, [&](long i) { word.store(i, std::memory_order_release); });
  }
  (*daemon).reset();
  testing::UnlinkArenas(prefix);
  return cost;
}

}  // namespace ckpt::bench
