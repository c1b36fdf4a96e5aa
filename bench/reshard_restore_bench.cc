// ckpt_bench --reshard N:M: a restore into another layout against a
// same-layout restore of the same bytes from the same tier, in one run
// (doc/resharding.md, "Restore into another layout"). N ranks save
// --tensors float32 tensors of --bytes in all, each row-sharded over the N
// ranks; then, interleaved over --repeat rounds, the N ranks restore their
// own pieces (same_layout_restore_s: today's path) and M ranks restore the
// rows an M-way sharding gives them (reshard_restore_s), from memory, and
// after a daemon restart with the arenas and the page cache dropped (disk),
// and with --object-url after a restart with the arenas and the local shard
// files gone (object: the daemon loads each saved rank from the object
// store). Each figure is the sum of every rank's Restore call (the ranks
// restore one after the other: the same bytes either way); medians.
#include "bench/reshard_restore_bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/ckpt_bench.h"
#include "bench/daemon_process.h"
#include "bench/raw_io.h"
#include "bench/stats.h"
#include "ckpt/client.h"
#include "shm/arena.h"
#include "storage/layout.h"
#include "storage/reshard_plan.h"
#include "util/status.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kCols = 1024;

struct Anon {
  char* data = nullptr;
  uint64_t size = 0;
  ~Anon() {
    if (data) munmap(data, size);
  }
  absl::Status Map(uint64_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
      return ErrnoToStatus(errno, absl::StrCat("mmap of ", bytes, " bytes"));
    data = static_cast<char*>(p);
    size = bytes;
    return absl::OkStatus();
  }
};

class ReshardBench {
 public:
  ReshardBench(const Options& o, int saved, int restored)
      : o_(o), saved_(saved), restored_(restored) {}
  ~ReshardBench() { Cleanup(); }
  absl::Status Run(ReshardFigures* f);

 private:
  // Rank r of `world`'s pieces of every tensor, pointing into `base` at
  // the global offsets (row sharding keeps a piece contiguous).
  std::vector<Tensor> Pieces(int world, int r, char* base) const {
    std::vector<Tensor> t;
    for (int i = 0; i < o_.tensors; ++i) {
      const int64_t lo = rows_ * r / world, hi = rows_ * (r + 1) / world;
      t.push_back({absl::StrCat("layer", i, ".weight"),
                   DType::kFloat32,
                   {hi - lo, kCols},
                   base + (static_cast<uint64_t>(i) * rows_ + lo) * kCols * 4,
                   Device::Host(),
                   TensorLayout{{rows_, kCols}, {lo, 0}, ""}});
    }
    return t;
  }
  absl::StatusOr<std::unique_ptr<Client>> Connect(int world, int r) const {
    ClientOptions co;
    co.socket_path = dir_ + "/ckptd.sock";
    co.job = "reshard";
    co.rank = r;
    co.world_size = world;
    co.copy_threads = o_.copy_threads;
    return Client::Connect(co);
  }
  // Every rank of `world` restores its pieces into dst_; the seconds of
  // all Restore calls; the bytes are then checked against the state.
  absl::StatusOr<double> RestoreAll(int world, const std::string& what) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int r = 0; r < world; ++r) {
      CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Connect(world, r));
      clients.push_back(std::move(c));
    }
    std::memset(dst_.data, 0, bytes_);
    double seconds = 0;
    for (int r = 0; r < world; ++r) {
      std::vector<Tensor> t = Pieces(world, r, dst_.data);
      auto t0 = Clock::now();
      CKPT_RETURN_IF_ERROR(
          Annotate(clients[r]->Restore(1, t), absl::StrCat(what, " rank ", r)));
      seconds += Since(t0);
    }
    if (std::memcmp(dst_.data, state_.data, bytes_) != 0) matches_ = false;
    return seconds;
  }
  // Stops the daemon, drops its arenas and the shards' page cache, starts
  // it again: the step is only on disk. With `object` the local shard
  // files are removed instead: the step is only in the object store.
  absl::Status RestartCold(bool object) {
    CKPT_ASSIGN_OR_RETURN(DaemonProcess::State st, daemon_->Query());
    CKPT_RETURN_IF_ERROR(daemon_->Stop());
    for (const std::string& name : st.arenas)
      CKPT_RETURN_IF_ERROR(shm::Arena::Unlink(name));
    std::error_code ec;
    std::vector<fs::path> shards;
    for (const auto& e : fs::recursive_directory_iterator(dir_ + "/ckptd", ec))
      if (e.path().extension() == ".shard") shards.push_back(e.path());
    if (ec)
      return absl::InternalError(
          absl::StrCat("list ", dir_, "/ckptd: ", ec.message()));
    for (const fs::path& p : shards) {
      if (!object) {
        CKPT_RETURN_IF_ERROR(DropFileCache(p.string()));
      } else if (!fs::remove(p, ec) || ec) {
        return absl::InternalError(
            absl::StrCat("remove ", p.string(), ": ", ec.message()));
      }
    }
    return daemon_->Start();
  }
  // Every shard of the step uploaded: the object tier's backlog is empty.
  // The daemon retries a failed upload, so an error is reported only when
  // the backlog has not emptied within 10 minutes (as object_tier_bench).
  absl::Status WaitUploaded() {
    const auto deadline = Clock::now() + std::chrono::minutes(10);
    for (;;) {
      CKPT_ASSIGN_OR_RETURN(DaemonProcess::State st, daemon_->Query());
      if (st.upload_backlog_shards == 0 && st.persist_queue == 0)
        return absl::OkStatus();
      if (Clock::now() > deadline)
        return absl::DeadlineExceededError(
            absl::StrCat("object tier: uploads still pending; last error: ",
                         st.last_upload_error));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  void Cleanup();

  Options o_;
  int saved_, restored_;
  int64_t rows_ = 0;
  uint64_t bytes_ = 0;
  std::string dir_;
  Anon state_, dst_;
  std::unique_ptr<DaemonProcess> daemon_;
  bool matches_ = true;
};

absl::Status ReshardBench::Run(ReshardFigures* f) {
  if (o_.tensors < 1)
    return absl::InvalidArgumentError("--tensors: must be >= 1");
  rows_ = static_cast<int64_t>(o_.bytes / 4 / kCols /
                               static_cast<uint64_t>(o_.tensors));
  if (rows_ < std::max(saved_, restored_))
    return absl::InvalidArgumentError(absl::StrCat(
        "--bytes: too small for ", o_.tensors, " tensors of ", kCols,
        " float32 columns and ", std::max(saved_, restored_), " ranks"));
  bytes_ = static_cast<uint64_t>(rows_) * kCols * 4 *
           static_cast<uint64_t>(o_.tensors);
  std::string tmpl = (o_.root.empty() ? std::string("/var/tmp") : o_.root) +
                     "/ckpt-reshard-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr)
    return ErrnoToStatus(errno, absl::StrCat("mkdtemp ", tmpl));
  dir_ = tmpl;
  CKPT_RETURN_IF_ERROR(state_.Map(bytes_));
  CKPT_RETURN_IF_ERROR(dst_.Map(bytes_));
  uint64_t x = 0x9E3779B97F4A7C15ull;  // xorshift64
  for (uint64_t i = 0; i < bytes_ / 8; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    reinterpret_cast<uint64_t*>(state_.data)[i] = x;
  }
  DaemonConfig dc;
  dc.binary = o_.ckptd.empty() ? DefaultCkptdPath() : o_.ckptd;
  dc.socket = dir_ + "/ckptd.sock";
  dc.root = dir_ + "/ckptd";
  dc.shm_prefix = absl::StrCat("ckptreshard", getpid());
  dc.log_path = dir_ + "/ckptd.log";
  if (!o_.object_url.empty())
    dc.extra_args = {"--object-url", o_.object_url, "--commit-tier", "local"};
  daemon_ = std::make_unique<DaemonProcess>(dc);
  CKPT_RETURN_IF_ERROR(daemon_->Start());
  for (int r = 0; r < saved_; ++r) {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Connect(saved_, r));
    CKPT_RETURN_IF_ERROR(Annotate(c->Save(1, Pieces(saved_, r, state_.data)),
                                  absl::StrCat("save rank ", r)));
    CKPT_RETURN_IF_ERROR(c->WaitDurable(1));
  }
  if (!o_.object_url.empty()) CKPT_RETURN_IF_ERROR(WaitUploaded());
  // The plan of every restoring rank at once, as a coordinator would make
  // it: both layouts as indexes, PlanReshard timed (a client plans only
  // its own rank's part of it).
  double plan_s = 0;
  {
    auto index = [&](int world) -> absl::StatusOr<storage::LayoutIndex> {
      storage::LayoutIndexBuilder b(static_cast<uint32_t>(world));
      const uint64_t shape[] = {static_cast<uint64_t>(rows_), kCols};
      for (int i = 0; i < o_.tensors; ++i) {
        CKPT_ASSIGN_OR_RETURN(uint32_t t,
                              b.AddTensor(absl::StrCat("layer", i, ".weight"),
                                          DType::kFloat32, shape));
        for (int r = 0; r < world; ++r) {
          const uint64_t lo = rows_ * r / world, hi = rows_ * (r + 1) / world;
          const uint64_t off[] = {lo, 0}, len[] = {hi - lo, kCols};
          CKPT_RETURN_IF_ERROR(
              b.AddPiece(t, static_cast<uint32_t>(r), 0, off, len));
        }
      }
      return std::move(b).Finish();
    };
    CKPT_ASSIGN_OR_RETURN(storage::LayoutIndex from, index(saved_));
    CKPT_ASSIGN_OR_RETURN(storage::LayoutIndex to, index(restored_));
    uint64_t reads = 0;
    auto t0 = Clock::now();
    CKPT_RETURN_IF_ERROR(storage::PlanReshard(
        from, to, {}, [&](const storage::PlannedRead&) { ++reads; }));
    plan_s = Since(t0);
    if (reads == 0) return absl::InternalError("the plan has no read");
  }
  // Interleaved: the order alternates per round.
  std::vector<double> mem_same, mem_reshard, disk_same, disk_reshard;
  for (int round = 0; round < o_.repeat; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool same = (k == 0) == (round % 2 == 0);
      CKPT_ASSIGN_OR_RETURN(double s,
                            RestoreAll(same ? saved_ : restored_,
                                       same ? "same-layout restore (memory)"
                                            : "reshard restore (memory)"));
      (same ? mem_same : mem_reshard).push_back(s);
    }
  }
  // Cold tiers: disk, then (with --object-url) the object store, each
  // restore after a restart of its own.
  auto cold = [&](bool object, std::vector<double>* same_s,
                  std::vector<double>* reshard_s) -> absl::Status {
    const char* tier = object ? "object" : "disk";
    for (int round = 0; round < o_.repeat; ++round) {
      for (int k = 0; k < 2; ++k) {
        const bool same = (k == 0) == (round % 2 == 0);
        CKPT_RETURN_IF_ERROR(RestartCold(object));
        CKPT_ASSIGN_OR_RETURN(
            double s, RestoreAll(same ? saved_ : restored_,
                                 absl::StrCat(same ? "same-layout" : "reshard",
                                              " restore (", tier, ")")));
        (same ? same_s : reshard_s)->push_back(s);
      }
    }
    return absl::OkStatus();
  };
  CKPT_RETURN_IF_ERROR(cold(false, &disk_same, &disk_reshard));
  std::vector<double> obj_same, obj_reshard;
  if (!o_.object_url.empty())
    CKPT_RETURN_IF_ERROR(cold(true, &obj_same, &obj_reshard));
  f->saved_ranks = saved_;
  f->restored_ranks = restored_;
  f->bytes = bytes_;
  f->tensors = o_.tensors;
  f->rounds = o_.repeat;
  f->same_layout_restore_s = Median(mem_same);
  f->reshard_restore_s = Median(mem_reshard);
  f->disk_same_layout_restore_s = Median(disk_same);
  f->disk_reshard_restore_s = Median(disk_reshard);
  f->object = !obj_same.empty();
  if (f->object) {
    f->object_same_layout_restore_s = Median(obj_same);
    f->object_reshard_restore_s = Median(obj_reshard);
  }
  f->plan_s = plan_s;
  f->restore_matches = matches_;
  return absl::OkStatus();
}

void ReshardBench::Cleanup() {
  if (daemon_ && daemon_->running()) {
    absl::StatusOr<DaemonProcess::State> st = daemon_->Query();
    (void)daemon_->Stop();
    if (st.ok())
      for (const std::string& name : st->arenas) (void)shm::Arena::Unlink(name);
  }
  daemon_.reset();
  if (!dir_.empty() && !o_.keep) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

}  // namespace

absl::StatusOr<ReshardFigures> MeasureReshard(const Options& o, int saved,
                                              int restored) {
  ReshardFigures f;
  ReshardBench b(o, saved, restored);
  CKPT_RETURN_IF_ERROR(b.Run(&f));
  return f;
}

std::string ReshardJsonFields(const ReshardFigures& f) {
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::string j = absl::StrFormat(
      "\"saved_ranks\": %d, \"restored_ranks\": %d, \"bytes\": %d, "
      "\"tensors\": %d, \"repeat\": %d, "
      "\"same_layout_restore_s\": %.6f, \"reshard_restore_s\": %.6f, "
      "\"reshard_over_same\": %.3f, "
      "\"disk_same_layout_restore_s\": %.6f, "
      "\"disk_reshard_restore_s\": %.6f, \"disk_reshard_over_same\": %.3f, ",
      f.saved_ranks, f.restored_ranks, f.bytes, f.tensors, f.rounds,
      f.same_layout_restore_s, f.reshard_restore_s,
      ratio(f.reshard_restore_s, f.same_layout_restore_s),
      f.disk_same_layout_restore_s, f.disk_reshard_restore_s,
      ratio(f.disk_reshard_restore_s, f.disk_same_layout_restore_s));
  if (f.object)
    absl::StrAppend(
        &j,
        absl::StrFormat(
            "\"object_same_layout_restore_s\": %.6f, "
            "\"object_reshard_restore_s\": %.6f, "
            "\"object_reshard_over_same\": %.3f, ",
            f.object_same_layout_restore_s, f.object_reshard_restore_s,
            ratio(f.object_reshard_restore_s, f.object_same_layout_restore_s)));
  absl::StrAppend(
      &j, absl::StrFormat("\"plan_s\": %.6f, \"restore_matches\": %s", f.plan_s,
                          f.restore_matches ? "true" : "false"));
  return j;
}

std::string ReshardText(const ReshardFigures& f) {
  auto row = [](const char* tier, double reshard, double same) {
    return absl::StrFormat("%-8s %22.4f s %22.4f s %8.3f %8s\n", tier, reshard,
                           same, same > 0 ? reshard / same : 0.0, "<= 1.5");
  };
  std::string t = absl::StrFormat(
      "%d ranks saved %d bytes (%d tensors, row-sharded); restored at %d "
      "ranks, medians of %d interleaved rounds\n"
      "%-8s %24s %24s %8s %8s\n",
      f.saved_ranks, f.bytes, f.tensors, f.restored_ranks, f.rounds, "tier",
      "reshard_restore_s", "same_layout_restore_s", "ratio", "target");
  absl::StrAppend(&t,
                  row("memory", f.reshard_restore_s, f.same_layout_restore_s));
  absl::StrAppend(
      &t, row("disk", f.disk_reshard_restore_s, f.disk_same_layout_restore_s));
  if (f.object)
    absl::StrAppend(&t, row("object", f.object_reshard_restore_s,
                            f.object_same_layout_restore_s));
  absl::StrAppend(
      &t, absl::StrFormat("plan of every restoring rank (plan_s): %.6f s\n"
                          "restored bytes equal the saved ones: %s",
                          f.plan_s, f.restore_matches ? "yes" : "NO"));
  return t;
}

absl::Status RunReshardBench(const Options& o, int saved, int restored,
                             std::string* out) {
  CKPT_ASSIGN_OR_RETURN(ReshardFigures f, MeasureReshard(o, saved, restored));
  *out = o.json ? absl::StrCat("{", ReshardJsonFields(f), "}") : ReshardText(f);
  if (!f.restore_matches)
    return absl::DataLossError(
        absl::StrCat("restored bytes differ from the saved ones\n", *out));
  return absl::OkStatus();
}

}  // namespace ckpt::bench
