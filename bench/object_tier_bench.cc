// ckpt_bench's object-tier figures. See object_tier_bench.h.
#include "bench/object_tier_bench.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/daemon_process.h"
#include "bench/huge_buffer.h"
#include "bench/object_raw.h"
#include "bench/raw_io.h"
#include "bench/stats.h"
#include "ckpt.grpc.pb.h"
#include "shm/arena.h"
#include "storage/object_backend.h"
#include "util/status.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// CPU seconds (user + system, all threads, exited ones included) and minor
// faults of a process so far, from /proc/PID/stat; zeros when it cannot be
// read (a store on another machine).
struct ProcUsage {
  double cpu_s = 0;
  double faults = 0;
};
ProcUsage UsageOf(pid_t pid) {
  ProcUsage u;
  if (pid <= 0) return u;
  FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return u;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // The fields after the command's closing parenthesis: state (3) ...
  // minflt (10) ... utime (14), stime (15).
  const char* p = std::strrchr(buf, ')');
  unsigned long long v[12] = {};
  if (p == nullptr ||
      std::sscanf(
          p + 2,
          "%*c %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu",
          &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9],
          &v[10], &v[11]) != 12)
    return u;
  // v[0] is ppid (field 4): minflt is field 10, utime 14, stime 15.
  u.faults = static_cast<double>(v[6]);
  u.cpu_s = static_cast<double>(v[10] + v[11]) /
            static_cast<double>(sysconf(_SC_CLK_TCK));
  return u;
}
ProcUsage operator-(ProcUsage a, ProcUsage b) {
  return {a.cpu_s - b.cpu_s, a.faults - b.faults};
}

class ObjectTierRun {
 public:
  ObjectTierRun(const ObjectTierConfig& c, std::span<const Tensor> tensors,
                char* scratch)
      : c_(c), tensors_(tensors), scratch_(scratch) {
    for (const Tensor& t : tensors) bytes_ += *t.bytes();
  }
  ~ObjectTierRun() {
    client_.reset();
    if (daemon_ && daemon_->running()) {
      auto state = daemon_->Query();
      (void)daemon_->Stop();  // best effort at the end of a run
      if (state.ok())
        for (const std::string& a : state->arenas) (void)shm::Arena::Unlink(a);
    }
  }

  absl::Status Run(ObjectFigures* out) {
    CKPT_ASSIGN_OR_RETURN(storage::ObjectStoreOptions so,
                          storage::ResolveObjectStoreOptions(c_.url, {}));
    out->url = c_.url;
    out->part_size = so.part_size;
    out->concurrency = so.concurrency;
    DaemonConfig dc;
    dc.binary = c_.ckptd;
    dc.socket = c_.dir + "/object-ckptd.sock";
    dc.root = c_.dir + "/object-ckptd";
    dc.shm_prefix = c_.shm_prefix;
    dc.log_path = c_.dir + "/object-ckptd.log";
    dc.extra_args = {"--object-url", c_.url, "--commit-tier", "local"};
    daemon_ = std::make_unique<DaemonProcess>(dc);
    CKPT_RETURN_IF_ERROR(daemon_->Start());
    CKPT_RETURN_IF_ERROR(Connect());

    // Uploads, each alone, beside raw PUTs of the same bytes.
    const std::string raw_key =
        absl::StrCat("ckpt-bench-raw/", getpid(), ".bin");
    std::vector<double> uploads, puts, gets, stalls, memcpys;
    int64_t step = 1;
    // The order alternates: the store still writes out what the first of
    // the two sent while the second runs.
    for (int i = 0; i < c_.saves; ++i, ++step) {
      auto raw_put = [&]() -> absl::Status {
        CKPT_ASSIGN_OR_RETURN(double put,
                              RawObjectPut(so, raw_key, scratch_, bytes_));
        puts.push_back(put);
        return absl::OkStatus();
      };
      if (i % 2 == 1) CKPT_RETURN_IF_ERROR(raw_put());
      CKPT_RETURN_IF_ERROR(SaveDurable(step));
      CKPT_ASSIGN_OR_RETURN(v1::StatusResponse st, WaitUploaded());
      uploads.push_back(st.last_upload_s());
      if (i % 2 == 0) CKPT_RETURN_IF_ERROR(raw_put());
      const double put = puts.back();
      std::fprintf(stderr,
                   "ckpt_bench: object upload %d/%d: %.4f s (raw PUT %.4f s, "
                   "ratio %.3f)\n",
                   i + 1, c_.saves, uploads.back(), put, put / uploads.back());
    }
    // Saves while the previous step's upload is in flight, vs memcpy.
    for (int i = 0; i < c_.saves; ++i, step += 2) {
      memcpys.push_back(ParallelMemcpy(scratch_, tensors_, c_.copy_threads));
      CKPT_RETURN_IF_ERROR(SaveDurable(step));  // its upload starts now
      auto t0 = Clock::now();
      CKPT_RETURN_IF_ERROR(
          Annotate(client_->Save(step + 1, tensors_), "save during an upload"));
      stalls.push_back(Since(t0));
      CKPT_ASSIGN_OR_RETURN(v1::StatusResponse st, Status());
      if (st.upload_backlog_shards() > 0) ++out->saves_during_upload;
      CKPT_RETURN_IF_ERROR(client_->WaitDurable(step + 1));
      CKPT_RETURN_IF_ERROR(WaitUploaded().status());
    }
    const int64_t last = step - 1;

    // Restores after the local files and the shared memory are gone, each
    // after a restart of its own, beside raw GETs of the same bytes: the
    // limit GETs into memory backed as the arena's slot is (the daemon's
    // GETs land there); the same GET into 2 MiB anonymous pages is kept
    // beside it: where /dev/shm gives arenas 4 KiB pages, every copy into
    // them (the receive's too) costs more than into 2 MiB ones. The order
    // alternates, so that drift in the store affects both.
    CKPT_ASSIGN_OR_RETURN(HugeBuffer like_slot,
                          HugeBuffer::MakeLikeArena(bytes_));
    std::vector<double> restores, gets_anon, gets_fresh;
    std::vector<double> r_daemon, r_client, r_store, r_fd, r_fc;
    std::vector<double> g_client, g_store, g_faults, f_client, f_faults;
    const pid_t self = getpid();
    memcpys.push_back(ParallelMemcpy(scratch_, tensors_, c_.copy_threads));
    for (int i = 0; i < c_.saves; ++i) {
      auto raw = [&]() -> absl::Status {
        const ProcUsage c0 = UsageOf(self), s0 = UsageOf(c_.store_pid);
        CKPT_ASSIGN_OR_RETURN(
            double get, RawObjectGet(so, raw_key, like_slot.data(), bytes_));
        gets.push_back(get);
        const ProcUsage c1 = UsageOf(self) - c0;
        g_client.push_back(c1.cpu_s);
        g_faults.push_back(c1.faults);
        g_store.push_back((UsageOf(c_.store_pid) - s0).cpu_s);
        CKPT_ASSIGN_OR_RETURN(double anon,
                              RawObjectGet(so, raw_key, scratch_, bytes_));
        gets_anon.push_back(anon);
        // Into memory created now, as a restarted ckptd's arena is: its
        // mapping and its pages' first faults are part of the time.
        const ProcUsage f0 = UsageOf(self);
        const auto t0 = Clock::now();
        CKPT_ASSIGN_OR_RETURN(
            HugeBuffer fresh,
            HugeBuffer::MakeLikeArena(bytes_, 0, /*fault_in=*/false));
        CKPT_RETURN_IF_ERROR(
            RawObjectGet(so, raw_key, fresh.data(), bytes_).status());
        gets_fresh.push_back(Since(t0));
        const ProcUsage f1 = UsageOf(self) - f0;
        f_client.push_back(f1.cpu_s);
        f_faults.push_back(f1.faults);
        return absl::OkStatus();
      };
      if (i % 2 == 1) CKPT_RETURN_IF_ERROR(raw());
      Usage use;
      CKPT_ASSIGN_OR_RETURN(double restore,
                            RestoreAfterRestart(dc, last, &use));
      restores.push_back(restore);
      r_daemon.push_back(use.daemon.cpu_s);
      r_fd.push_back(use.daemon.faults);
      r_client.push_back(use.client.cpu_s);
      r_fc.push_back(use.client.faults);
      r_store.push_back(use.store.cpu_s);
      if (i % 2 == 0) CKPT_RETURN_IF_ERROR(raw());
      std::fprintf(stderr,
                   "ckpt_bench: object restore %d/%d: %.4f s (raw GET %.4f s, "
                   "ratio %.3f)\n",
                   i + 1, c_.saves, restore, gets.back(),
                   gets.back() / restore);
      std::fprintf(stderr,
                   "ckpt_bench: object restore %d/%d CPU s: daemon %.3f, "
                   "client %.3f, store %.3f; raw GET: ours %.3f, store %.3f, "
                   "into fresh memory ours %.3f; minor faults: daemon %.0f, "
                   "client %.0f, raw GET %.0f, fresh %.0f\n",
                   i + 1, c_.saves, r_daemon.back(), r_client.back(),
                   r_store.back(), g_client.back(), g_store.back(),
                   f_client.back(), r_fd.back(), r_fc.back(), g_faults.back(),
                   f_faults.back());
    }
    out->restore_cpu_daemon_s = Median(r_daemon);
    out->restore_cpu_client_s = Median(r_client);
    out->restore_cpu_store_s = Median(r_store);
    out->raw_get_cpu_s = Median(g_client);
    out->raw_get_cpu_store_s = Median(g_store);
    out->raw_get_fresh_cpu_s = Median(f_client);
    out->restore_faults_daemon = Median(r_fd);
    out->restore_faults_client = Median(r_fc);
    out->raw_get_faults = Median(g_faults);
    out->raw_get_fresh_faults = Median(f_faults);
    out->restore_matches = restore_matches_;
    out->raw_get_anon_s = Median(gets_anon);
    out->raw_get_fresh_s = Median(gets_fresh);
    // The raw object goes; the daemon's objects stay with the prefix.
    auto raw = storage::NewObjectBackend(so);
    if (raw.ok()) (void)(*raw)->Delete(raw_key);  // best effort cleanup
    out->upload_s = Median(uploads);
    out->raw_put_s = Median(puts);
    out->raw_get_s = Median(gets);
    out->restore_object_s = Median(restores);
    out->save_stall_upload_s = Median(stalls);
    out->memcpy_s = Median(memcpys);
    out->measured = true;
    return absl::OkStatus();
  }

 private:
  // What each process used during a restore.
  struct Usage {
    ProcUsage daemon, client, store;
  };
  // Stops the daemon, removes its arenas and local shard files, starts it
  // again and restores `step` (which then comes from the object tier);
  // returns the restore's seconds. A restore whose bytes differ from the
  // reference clears restore_matches; *use: what each process used
  // during the restore.
  absl::StatusOr<double> RestoreAfterRestart(const DaemonConfig& dc,
                                             int64_t step, Usage* use) {
    CKPT_ASSIGN_OR_RETURN(DaemonProcess::State state, daemon_->Query());
    client_.reset();
    CKPT_RETURN_IF_ERROR(daemon_->Stop());
    for (const std::string& a : state.arenas)
      CKPT_RETURN_IF_ERROR(shm::Arena::Unlink(a));
    std::error_code ec;
    for (const auto& e :
         fs::recursive_directory_iterator(dc.root + "/objbench", ec))
      if (e.path().extension() == ".shard") fs::remove(e.path(), ec);
    CKPT_RETURN_IF_ERROR(daemon_->Start());
    CKPT_RETURN_IF_ERROR(Connect());
    for (const Tensor& t : tensors_) std::memset(t.data, 0, *t.bytes());
    const ProcUsage d0 = UsageOf(daemon_->pid()), c0 = UsageOf(getpid()),
                    s0 = UsageOf(c_.store_pid);
    auto t0 = Clock::now();
    CKPT_RETURN_IF_ERROR(Annotate(client_->Restore(step, tensors_),
                                  "restore from the object tier"));
    const double seconds = Since(t0);
    use->daemon = UsageOf(daemon_->pid()) - d0;
    use->client = UsageOf(getpid()) - c0;
    use->store = UsageOf(c_.store_pid) - s0;
    if (std::memcmp(tensors_[0].data, scratch_, bytes_) != 0)
      restore_matches_ = false;
    return seconds;
  }
  absl::Status Connect() {
    ClientOptions co;
    co.socket_path = c_.dir + "/object-ckptd.sock";
    co.job = "objbench";
    co.rank = 0;
    co.world_size = 1;
    co.copy_threads = c_.copy_threads;
    CKPT_ASSIGN_OR_RETURN(client_, Client::Connect(co));
    stub_ = v1::Ckptd::NewStub(grpc::CreateChannel(
        "unix:" + co.socket_path, grpc::InsecureChannelCredentials()));
    return absl::OkStatus();
  }
  absl::Status SaveDurable(int64_t step) {
    CKPT_RETURN_IF_ERROR(
        Annotate(client_->Save(step, tensors_), absl::StrCat("save ", step)));
    return Annotate(client_->WaitDurable(step),
                    absl::StrCat("WaitDurable ", step));
  }
  absl::StatusOr<v1::StatusResponse> Status() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::StatusResponse resp;
    grpc::Status s = stub_->Status(&ctx, v1::StatusRequest(), &resp);
    if (!s.ok()) return absl::UnavailableError("Status: " + s.error_message());
    return resp;
  }
  // Polls Status until nothing is left to upload (at most ten minutes).
  absl::StatusOr<v1::StatusResponse> WaitUploaded() {
    auto deadline = Clock::now() + std::chrono::minutes(10);
    for (;;) {
      CKPT_ASSIGN_OR_RETURN(v1::StatusResponse st, Status());
      if (st.upload_backlog_shards() == 0) return st;
      if (Clock::now() > deadline)
        return absl::DeadlineExceededError(
            absl::StrCat("object tier: uploads still pending; last error: ",
                         st.last_upload_error()));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  const ObjectTierConfig& c_;
  std::span<const Tensor> tensors_;
  char* scratch_;
  uint64_t bytes_ = 0;
  bool restore_matches_ = true;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::Ckptd::Stub> stub_;
};

}  // namespace

absl::Status MeasureObjectTier(const ObjectTierConfig& config,
                               std::span<const Tensor> tensors, char* scratch,
                               ObjectFigures* out) {
  ObjectTierRun run(config, tensors, scratch);
  return run.Run(out);
}

}  // namespace ckpt::bench
