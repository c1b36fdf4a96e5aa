// The C API (include/ckpt/ckpt.h) over ckpt::Client. Every entry point
// checks its pointers, converts the C structs, and records the message of a
// failure in a thread-local string for ckpt_last_error(). Every entry point
// runs inside Guarded(): no exception crosses extern "C".
#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/ckpt.h"
#include "ckpt/client.h"

struct ckpt_client {
  std::unique_ptr<ckpt::Client> client;
};

struct ckpt_save_handle {
  ckpt::SaveHandle handle;
};

namespace {

thread_local std::string last_error;

// Sets last_error without letting an allocation failure escape: the
// message is then cut to what fits the string's capacity.
void SetLastError(absl::string_view message) noexcept {
  try {
    last_error.assign(message.data(), message.size());
  } catch (...) {
    last_error.assign(message.data(),
                      std::min(message.size(), last_error.capacity()));
  }
}

ckpt_status Fail(const absl::Status& s) {
  SetLastError(s.message());
  const int code = static_cast<int>(s.code());
  return code >= CKPT_OK && code <= CKPT_UNAUTHENTICATED ? code : CKPT_UNKNOWN;
}

// "function: what" into last_error; with no memory for it, what fits.
void SetLastError(const char* function, const char* what) noexcept {
  try {
    last_error = absl::StrCat(function, ": ", what);
  } catch (...) {
    SetLastError(function);
  }
}

// Runs body, turning any exception into CKPT_INTERNAL naming the function.
template <typename Body>
ckpt_status Guarded(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    SetLastError(function, "out of memory");
  } catch (const std::exception& e) {
    SetLastError(function, e.what());
  } catch (...) {
    SetLastError(function, "unknown exception");
  }
  return CKPT_INTERNAL;
}

ckpt_status Report(const absl::Status& s) {
  if (s.ok()) {
    last_error.clear();
    return CKPT_OK;
  }
  return Fail(s);
}

ckpt_status NullArgument(const char* function, const char* argument) {
  return Fail(absl::InvalidArgumentError(
      absl::StrCat(function, ": ", argument, " is NULL")));
}

absl::Status ConvertTensors(const ckpt_tensor* in, size_t count,
                            std::vector<ckpt::Tensor>* out) {
  if (in == nullptr && count > 0)
    return absl::InvalidArgumentError("tensors: NULL");
  out->resize(count);
  for (size_t i = 0; i < count; ++i) {
    const ckpt_tensor& c = in[i];
    ckpt::Tensor& t = (*out)[i];
    if (c.name == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "].name: NULL"));
    t.name = c.name;
    if (c.ndim < 0 || static_cast<size_t>(c.ndim) > ckpt::kMaxTensorDims)
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "] (\"", t.name, "\").ndim: ", c.ndim,
                       " is not in [0, ", ckpt::kMaxTensorDims, "]"));
    if (c.ndim > 0 && c.shape == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "] (\"", t.name,
                       "\").shape: NULL with ndim ", c.ndim));
    t.shape.assign(c.shape, c.shape + c.ndim);
    t.dtype = static_cast<ckpt::DType>(c.dtype);
    t.data = c.data;
    if (c.device < -1)
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "] (\"", t.name, "\").device: ", c.device,
                       " (use -1 for host, N >= 0 for cuda:N)"));
    t.device =
        c.device == -1 ? ckpt::Device::Host() : ckpt::Device::Cuda(c.device);
  }
  return absl::OkStatus();
}

// layouts[i] onto ts[i] (ConvertTensors ran first); NULL: none.
absl::Status ConvertLayouts(const ckpt_tensor_layout* layouts,
                            std::vector<ckpt::Tensor>* ts) {
  if (layouts == nullptr) return absl::OkStatus();
  for (size_t i = 0; i < ts->size(); ++i) {
    const ckpt_tensor_layout& l = layouts[i];
    ckpt::Tensor& t = (*ts)[i];
    if (l.global_shape == nullptr) {
      if (l.offsets != nullptr ||
          (l.global_name != nullptr && l.global_name[0] != 0))
        return absl::InvalidArgumentError(
            absl::StrCat("layouts[", i, "] (\"", t.name,
                         "\").global_shape: NULL with offsets or a "
                         "global_name set"));
      continue;
    }
    if (l.offsets == nullptr && !t.shape.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("layouts[", i, "] (\"", t.name,
                       "\").offsets: NULL with a global_shape"));
    ckpt::TensorLayout layout;
    const size_t nd = t.shape.size();
    layout.global_shape.assign(l.global_shape, l.global_shape + nd);
    if (nd > 0) layout.offsets.assign(l.offsets, l.offsets + nd);
    if (l.global_name != nullptr) layout.global_name = l.global_name;
    t.layout = std::move(layout);
  }
  return absl::OkStatus();
}

// A saved layout into its C struct (zeroed when there is none).
void FillSavedLayout(const std::optional<ckpt::TensorLayout>& l,
                     ckpt_saved_layout* out) {
  *out = ckpt_saved_layout{};
  if (!l) return;
  out->has_layout = 1;
  const size_t nd = std::min(l->global_shape.size(), ckpt::kMaxTensorDims);
  out->ndim = static_cast<int>(nd);
  for (size_t d = 0; d < nd; ++d) {
    out->global_shape[d] = l->global_shape[d];
    out->offsets[d] = d < l->offsets.size() ? l->offsets[d] : 0;
  }
  const size_t n =
      std::min(l->global_name.size(), sizeof(out->global_name) - 1);
  std::copy_n(l->global_name.data(), n, out->global_name);
}

ckpt::ClientOptions ToClientOptions(const ckpt_options& o) {
  ckpt::ClientOptions co;
  if (o.socket_path != nullptr) co.socket_path = o.socket_path;
  if (o.job != nullptr) co.job = o.job;
  co.rank = o.rank;
  co.world_size = o.world_size;
  co.slot_bytes = o.slot_bytes;
  co.slot_headroom = o.slot_headroom;
  co.num_slots = o.num_slots == 0 ? 2 : o.num_slots;
  co.block_when_busy = o.block_when_busy != 0;
  co.busy_timeout = std::chrono::milliseconds(o.busy_timeout_ms);
  co.copy_threads = o.copy_threads;
  return co;
}

ckpt::SaveOptions ToSaveOptions(const ckpt_save_options* options) {
  ckpt::SaveOptions o;
  if (options != nullptr) o.rewind = options->rewind != 0;
  return o;
}

// A call's tensors, each with its layout (layouts may be null: whole).
absl::Status ConvertTensorsWithLayouts(const ckpt_tensor* tensors,
                                       const ckpt_tensor_layout* layouts,
                                       size_t count,
                                       std::vector<ckpt::Tensor>* ts) {
  absl::Status s = ConvertTensors(tensors, count, ts);
  if (s.ok()) s = ConvertLayouts(layouts, ts);
  return s;
}

ckpt_status SaveWith(const char* fn, ckpt_client* client, int64_t step,
                     const ckpt_tensor* tensors,
                     const ckpt_tensor_layout* layouts, size_t count,
                     const ckpt_save_options* options) {
  return Guarded(fn, [&] {
    std::vector<ckpt::Tensor> ts;
    absl::Status s = ConvertTensorsWithLayouts(tensors, layouts, count, &ts);
    if (!s.ok()) return Fail(s);
    if (client == nullptr) return NullArgument(fn, "client");
    return Report(client->client->Save(step, ts, ToSaveOptions(options)));
  });
}

ckpt_status SaveAsyncWith(const char* fn, ckpt_client* client, int64_t step,
                          const ckpt_tensor* tensors,
                          const ckpt_tensor_layout* layouts, size_t count,
                          const ckpt_save_options* options,
                          ckpt_save_handle** out) {
  return Guarded(fn, [&] {
    if (out == nullptr) return NullArgument(fn, "out");
    *out = nullptr;
    std::vector<ckpt::Tensor> ts;
    absl::Status s = ConvertTensorsWithLayouts(tensors, layouts, count, &ts);
    if (!s.ok()) return Fail(s);
    if (client == nullptr) return NullArgument(fn, "client");
    auto handle = client->client->SaveAsync(step, ts, ToSaveOptions(options));
    if (!handle.ok()) return Fail(handle.status());
    *out = new ckpt_save_handle{std::move(*handle)};
    return Report(absl::OkStatus());
  });
}

}  // namespace

extern "C" {

void ckpt_options_init(ckpt_options* options) {
  if (options == nullptr) return;
  const ckpt::ClientOptions defaults;
  options->socket_path = nullptr;
  options->job = nullptr;
  options->rank = defaults.rank;
  options->world_size = defaults.world_size;
  options->slot_bytes = defaults.slot_bytes;
  options->num_slots = 0;  // the default, 2
  options->block_when_busy = defaults.block_when_busy ? 1 : 0;
  options->copy_threads = defaults.copy_threads;
  options->slot_headroom = defaults.slot_headroom;
  options->busy_timeout_ms = defaults.busy_timeout.count();
}

void ckpt_save_options_init(ckpt_save_options* options) {
  if (options == nullptr) return;
  const ckpt::SaveOptions defaults;
  options->rewind = defaults.rewind ? 1 : 0;
}

const char* ckpt_last_error(void) { return last_error.c_str(); }

int ckpt_abi_version(void) { return CKPT_ABI_VERSION; }

ckpt_status ckpt_resolve_rank(int* rank, int* world_size, int* local_rank) {
  return Guarded("ckpt_resolve_rank", [&] {
    if (rank == nullptr) return NullArgument("ckpt_resolve_rank", "rank");
    if (world_size == nullptr)
      return NullArgument("ckpt_resolve_rank", "world_size");
    int r = *rank, w = *world_size, l = -1;
    if (absl::Status s = ckpt::ResolveRank(&r, &w, &l); !s.ok()) return Fail(s);
    *rank = r;
    *world_size = w;
    if (local_rank != nullptr) *local_rank = l;
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_connect(const ckpt_options* options, ckpt_client** out) {
  return Guarded("ckpt_connect", [&] {
    if (out == nullptr) return NullArgument("ckpt_connect", "out");
    *out = nullptr;
    ckpt_options defaults;
    ckpt_options_init(&defaults);
    auto client =
        ckpt::Client::Connect(ToClientOptions(options ? *options : defaults));
    if (!client.ok()) return Fail(client.status());
    *out = new ckpt_client{std::move(*client)};
    return Report(absl::OkStatus());
  });
}

void ckpt_close(ckpt_client* client) {
  ckpt_status s = Guarded("ckpt_close", [&] {
    delete client;
    return CKPT_OK;
  });
  // A void function cannot report: the failure stays in ckpt_last_error().
  (void)s;
}

ckpt_status ckpt_save(ckpt_client* client, int64_t step,
                      const ckpt_tensor* tensors, size_t count) {
  return ckpt_save_ex(client, step, tensors, count, nullptr);
}

ckpt_status ckpt_save_ex(ckpt_client* client, int64_t step,
                         const ckpt_tensor* tensors, size_t count,
                         const ckpt_save_options* options) {
  return SaveWith("ckpt_save", client, step, tensors, nullptr, count, options);
}

ckpt_status ckpt_save_layout(ckpt_client* client, int64_t step,
                             const ckpt_tensor* tensors,
                             const ckpt_tensor_layout* layouts, size_t count,
                             const ckpt_save_options* options) {
  return SaveWith("ckpt_save_layout", client, step, tensors, layouts, count,
                  options);
}

ckpt_status ckpt_save_async(ckpt_client* client, int64_t step,
                            const ckpt_tensor* tensors, size_t count,
                            ckpt_save_handle** out) {
  return ckpt_save_async_ex(client, step, tensors, count, nullptr, out);
}

ckpt_status ckpt_save_async_ex(ckpt_client* client, int64_t step,
                               const ckpt_tensor* tensors, size_t count,
                               const ckpt_save_options* options,
                               ckpt_save_handle** out) {
  return SaveAsyncWith("ckpt_save_async", client, step, tensors, nullptr, count,
                       options, out);
}

ckpt_status ckpt_save_async_layout(ckpt_client* client, int64_t step,
                                   const ckpt_tensor* tensors,
                                   const ckpt_tensor_layout* layouts,
                                   size_t count,
                                   const ckpt_save_options* options,
                                   ckpt_save_handle** out) {
  return SaveAsyncWith("ckpt_save_async_layout", client, step, tensors, layouts,
                       count, options, out);
}

ckpt_status ckpt_wait_copied(ckpt_save_handle* handle) {
  return Guarded("ckpt_wait_copied", [&] {
    if (handle == nullptr) return NullArgument("ckpt_wait_copied", "handle");
    return Report(handle->handle.WaitCopied());
  });
}

ckpt_status ckpt_wait(ckpt_save_handle* handle) {
  return Guarded("ckpt_wait", [&] {
    if (handle == nullptr) return NullArgument("ckpt_wait", "handle");
    std::unique_ptr<ckpt_save_handle> owned(handle);  // freed even on a throw
    return Report(owned->handle.Wait());
  });
}

ckpt_status ckpt_latest_step(ckpt_client* client, int64_t* step) {
  return Guarded("ckpt_latest_step", [&] {
    if (step == nullptr) return NullArgument("ckpt_latest_step", "step");
    *step = -1;
    if (client == nullptr) return NullArgument("ckpt_latest_step", "client");
    auto latest = client->client->LatestStep();
    if (!latest.ok()) return Fail(latest.status());
    *step = *latest;
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_restore(ckpt_client* client, int64_t step,
                         const ckpt_tensor* tensors, size_t count) {
  return ckpt_restore_layout(client, step, tensors, nullptr, count, nullptr);
}

ckpt_status ckpt_restore_layout(ckpt_client* client, int64_t step,
                                const ckpt_tensor* tensors,
                                const ckpt_tensor_layout* layouts, size_t count,
                                ckpt_saved_layout* saved) {
  const char* fn = layouts || saved ? "ckpt_restore_layout" : "ckpt_restore";
  return Guarded(fn, [&] {
    std::vector<ckpt::Tensor> ts;
    absl::Status s = ConvertTensorsWithLayouts(tensors, layouts, count, &ts);
    if (!s.ok()) return Fail(s);
    if (client == nullptr) return NullArgument(fn, "client");
    std::vector<std::optional<ckpt::TensorLayout>> got;
    s = client->client->Restore(step, ts, saved ? &got : nullptr);
    if (s.ok() && saved != nullptr)
      for (size_t i = 0; i < count && i < got.size(); ++i)
        FillSavedLayout(got[i], &saved[i]);
    return Report(s);
  });
}

ckpt_status ckpt_restore_latest(ckpt_client* client, const ckpt_tensor* tensors,
                                size_t count, int64_t* step) {
  return Guarded("ckpt_restore_latest", [&] {
    if (step == nullptr) return NullArgument("ckpt_restore_latest", "step");
    *step = -1;
    std::vector<ckpt::Tensor> ts;
    if (absl::Status s = ConvertTensors(tensors, count, &ts); !s.ok())
      return Fail(s);
    if (client == nullptr) return NullArgument("ckpt_restore_latest", "client");
    auto restored = client->client->RestoreLatest(ts);
    if (!restored.ok()) return Fail(restored.status());
    *step = *restored;
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_wait_durable(ckpt_client* client, int64_t step,
                              int64_t timeout_ms) {
  return Guarded("ckpt_wait_durable", [&] {
    if (client == nullptr) return NullArgument("ckpt_wait_durable", "client");
    if (timeout_ms < 0)
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "ckpt_wait_durable: timeout_ms ", timeout_ms, " is negative")));
    return Report(client->client->WaitDurable(
        step, std::chrono::milliseconds(timeout_ms)));
  });
}

ckpt_status ckpt_progress(ckpt_client* client, int64_t step, double compute_s) {
  return Guarded("ckpt_progress", [&] {
    if (client == nullptr) return NullArgument("ckpt_progress", "client");
    if (compute_s < 0)
      client->client->Progress(step);
    else
      client->client->Progress(step, compute_s);
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_expect_pause(ckpt_client* client, double seconds,
                              const char* reason) {
  return Guarded("ckpt_expect_pause", [&] {
    if (client == nullptr) return NullArgument("ckpt_expect_pause", "client");
    client->client->ExpectPause(seconds, reason == nullptr ? "" : reason);
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_last_save_stats(ckpt_client* client, ckpt_save_stats* out) {
  return Guarded("ckpt_last_save_stats", [&] {
    if (out == nullptr) return NullArgument("ckpt_last_save_stats", "out");
    *out = ckpt_save_stats{};
    if (client == nullptr)
      return NullArgument("ckpt_last_save_stats", "client");
    const ckpt::SaveStats stats = client->client->last_save_stats();
    out->wait_slot_s = stats.wait_slot_s;
    out->copy_s = stats.copy_s;
    out->rpc_s = stats.rpc_s;
    out->total_s = stats.total_s;
    out->bytes = stats.bytes;
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_last_restore_stats(ckpt_client* client,
                                    ckpt_restore_stats* out) {
  return Guarded("ckpt_last_restore_stats", [&] {
    if (out == nullptr) return NullArgument("ckpt_last_restore_stats", "out");
    *out = ckpt_restore_stats{};
    if (client == nullptr)
      return NullArgument("ckpt_last_restore_stats", "client");
    const ckpt::RestoreStats stats = client->client->last_restore_stats();
    out->bytes = stats.bytes;
    out->bytes_read = stats.bytes_read;
    out->saved_ranks = stats.saved_ranks;
    out->resharded = stats.resharded ? 1 : 0;
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_restart_enable(void) {
  return Guarded("ckpt_restart_enable",
                 [&] { return Report(ckpt::EnableRestart()); });
}

ckpt_status ckpt_restart_poll(uint64_t after, ckpt_plan* out, int* fresh) {
  return Guarded("ckpt_restart_poll", [&] {
    if (out == nullptr) return NullArgument("ckpt_restart_poll", "out");
    if (fresh == nullptr) return NullArgument("ckpt_restart_poll", "fresh");
    *fresh = 0;
    auto plan = ckpt::PollRestart(after);
    if (!plan.ok()) return Fail(plan.status());
    if (!plan->has_value()) return Report(absl::OkStatus());
    const ckpt::RestartPlan& p = **plan;
    ckpt_plan c{};
    c.generation = p.generation;
    c.rank = p.rank;
    c.world_size = p.world_size;
    c.local_rank = p.local_rank;
    c.local_world_size = p.local_world_size;
    // ParsePlan refuses an address that does not fit with its NUL.
    p.master_addr.copy(c.master_addr, sizeof c.master_addr - 1);
    c.master_port = p.master_port;
    c.has_restore_step = p.restore_step.has_value() ? 1 : 0;
    c.restore_step = p.restore_step.value_or(0);
    *out = c;
    *fresh = 1;
    return Report(absl::OkStatus());
  });
}

ckpt_status ckpt_restart_joined(uint64_t generation) {
  return Guarded("ckpt_restart_joined",
                 [&] { return Report(ckpt::JoinedRestart(generation)); });
}

}  // extern "C"
