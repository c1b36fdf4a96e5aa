// ckpt_bench: measures ckptd's save, persist and restore paths against the
// machine's limits, all in one run on the same state (see bench/report.h
// for the figures and targets). It starts its own ckptd on a temporary
// socket and root, and stops it at the end.
#include "bench/ckpt_bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/daemon_process.h"
#include "bench/huge_buffer.h"
#include "bench/object_tier_bench.h"
#include "bench/raw_io.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "ckpt/client.h"
#include "shm/arena.h"
#include "shm/huge_pages.h"
#include "storage/shard_format.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// Anonymous memory, faulted in now so no measurement pays for page faults.
struct Mapping {
  char* data = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (data) munmap(data, size);
  }
};
absl::Status Map(uint64_t size, Mapping* m) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    return ErrnoToStatus(errno, absl::StrCat("mmap of ", size, " bytes"));
  m->data = static_cast<char*>(p);
  m->size = size;
  return absl::OkStatus();
}

void FillRandom(char* data, uint64_t bytes, int threads) {
  std::vector<std::thread> pool;
  uint64_t words = bytes / 8, per = (words + threads - 1) / threads;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      uint64_t x = 0x9E3779B97F4A7C15ull * (t + 1);  // xorshift64
      uint64_t* w = reinterpret_cast<uint64_t*>(data);
      for (uint64_t i = per * t; i < std::min(words, per * (t + 1)); ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = x;
      }
    });
  for (auto& th : pool) th.join();
}

class Bench {
 public:
  explicit Bench(Options o) : o_(std::move(o)) {}
  ~Bench();
  absl::Status Run(Results* r);

 private:
  // Every sample of one figure or limit, across the rounds.
  struct Samples {
    std::vector<double> stall, copy, persist, memcpy, sync_write, raw_write,
        raw_write_anon, raw_read, restore_shm, restore_disk, restore_disk_warm;
  };
  absl::Status Setup(Results* r);
  absl::Status Connect();
  // One round; each figure is printed (stderr) as soon as it and its limit
  // are measured, the save stalls within seconds of the start.
  absl::Status MeasureRound(int round, Results* r);
  absl::Status MeasureSaves(Results* r);
  absl::Status MeasureRestoreFromShm(Results* r);
  absl::Status MeasureRestoreFromDisk(Results* r);
  absl::Status CompareState(bool* equal);
  absl::Status DropShardCache();
  absl::Status SampleMemcpy(int threads);
  absl::Status SampleRawIo(Results* r);
  absl::Status SampleRawRead(Results* r);
  absl::Status WaitDaemonSettled();
  void Report(int round, const std::string& figures) const;
  void Summarize(Results* r) const;
  void Cleanup();

  Options o_;
  std::string dir_;  // everything of this run lives here
  bool made_dir_ = false;
  Mapping state_;
  HugeBuffer scratch_;
  // The raw write's source: the state's bytes in memory backed as the
  // arena persist writes from (HugeBuffer::MakeLikeArena).
  HugeBuffer write_src_;
  std::vector<Tensor> tensors_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<std::string> arenas_;
  int64_t last_step_ = 0;
  Samples samples_;
};

Bench::~Bench() { Cleanup(); }

absl::Status Bench::Setup(Results* r) {
  if (o_.tensors < 1)
    return absl::InvalidArgumentError("--tensors: must be >= 1");
  uint64_t elems = o_.bytes / 4 / static_cast<uint64_t>(o_.tensors);
  if (elems == 0)
    return absl::InvalidArgumentError(
        "--bytes: too small for --tensors float32 tensors");
  r->bytes = elems * 4 * static_cast<uint64_t>(o_.tensors);
  r->tensors = o_.tensors;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  r->copy_threads = o_.copy_threads > 0 ? o_.copy_threads
                                        : static_cast<int>(std::max(1L, cpus));
  r->saves = o_.saves;
  r->repeat = o_.repeat;
  r->checksum_impl = ChecksumImplementation();
  // ckptd (--huge-pages auto) puts its arenas on a hugetlbfs when one is
  // mounted and its pool has room; /dev/shm's mount decides otherwise.
  const std::string hugetlbfs = shm::FindHugetlbfsOf();
  r->shm_huge_pages = hugetlbfs.empty() ? shm::ShmHugePagesOf("/dev/shm")
                                        : "hugetlbfs " + hugetlbfs +
                                              " (when its pool has room)";

  std::string parent = o_.root.empty() ? "/var/tmp" : o_.root;
  std::error_code ec;
  fs::create_directories(parent, ec);
  std::string tmpl = parent + "/ckpt_bench.XXXXXX";
  if (!mkdtemp(tmpl.data()))
    return ErrnoToStatus(errno, "mkdtemp under " + parent);
  dir_ = tmpl;
  made_dir_ = true;
  r->root = dir_;

  uint64_t padded = (r->bytes + 4095) / 4096 * 4096;
  CKPT_RETURN_IF_ERROR(Map(padded, &state_));
  // The memcpy limit's destination: pages of the arenas' size (a limit
  // into 4 KiB pages would compare page tables, HugeBuffer).
  CKPT_ASSIGN_OR_RETURN(scratch_, HugeBuffer::Make(padded));
  CKPT_ASSIGN_OR_RETURN(write_src_, HugeBuffer::MakeLikeArena(padded));
  FillRandom(state_.data, r->bytes, r->copy_threads);
  std::memcpy(write_src_.data(), state_.data, r->bytes);
  std::vector<uint64_t> sizes;
  for (int i = 0; i < o_.tensors; ++i) {
    Tensor t;
    t.name = absl::StrCat("layer", i, ".weight");
    t.shape = {static_cast<int64_t>(elems)};
    t.data = state_.data + static_cast<uint64_t>(i) * elems * 4;
    tensors_.push_back(std::move(t));
    sizes.push_back(elems * 4);
  }
  CKPT_ASSIGN_OR_RETURN(storage::ShardLayout layout,
                        storage::ComputeLayout(sizes));
  r->image_bytes = layout.image_bytes;

  DaemonConfig dc;
  dc.binary = o_.ckptd.empty() ? DefaultCkptdPath() : o_.ckptd;
  dc.socket = dir_ + "/ckptd.sock";
  dc.root = dir_ + "/ckptd";
  dc.shm_prefix = absl::StrCat("ckptbench", getpid());
  dc.log_path = dir_ + "/ckptd.log";
  if (dc.socket.size() >= 100)
    return absl::InvalidArgumentError(
        "--root: path too long for a Unix socket");
  daemon_ = std::make_unique<DaemonProcess>(dc);
  CKPT_RETURN_IF_ERROR(daemon_->Start());
  CKPT_ASSIGN_OR_RETURN(DaemonProcess::State state, daemon_->Query());
  r->backend = state.backend;
  return Connect();
}

absl::Status Bench::Connect() {
  ClientOptions co;
  co.socket_path = dir_ + "/ckptd.sock";
  co.job = "bench";
  co.rank = 0;
  co.world_size = 1;
  co.copy_threads = o_.copy_threads;
  CKPT_ASSIGN_OR_RETURN(client_, Client::Connect(co));
  return absl::OkStatus();
}

absl::Status Bench::MeasureSaves(Results* r) {
  for (int i = 0; i < o_.saves; ++i) {
    int64_t step = last_step_ + 1;
    auto t0 = Clock::now();
    CKPT_RETURN_IF_ERROR(Annotate(client_->Save(step, tensors_),
                                  absl::StrCat("save of step ", step)));
    samples_.stall.push_back(Since(t0));
    samples_.copy.push_back(client_->last_save_stats().copy_s);
    t0 = Clock::now();
    CKPT_RETURN_IF_ERROR(Annotate(client_->WaitDurable(step),
                                  absl::StrCat("WaitDurable ", step)));
    samples_.persist.push_back(Since(t0));
    CKPT_RETURN_IF_ERROR(SampleMemcpy(r->copy_threads));
    last_step_ = step;
  }
  return absl::OkStatus();
}

absl::Status Bench::MeasureRestoreFromShm(Results* r) {
  CKPT_RETURN_IF_ERROR(SampleMemcpy(r->copy_threads));
  for (const Tensor& t : tensors_) std::memset(t.data, 0, *t.bytes());
  auto t0 = Clock::now();
  CKPT_RETURN_IF_ERROR(
      Annotate(client_->Restore(last_step_, tensors_), "restore from shm"));
  samples_.restore_shm.push_back(Since(t0));
  bool equal = false;
  CKPT_RETURN_IF_ERROR(CompareState(&equal));
  r->restore_matches = r->restore_matches && equal;
  return absl::OkStatus();
}

absl::Status Bench::CompareState(bool* equal) {
  *equal = std::memcmp(state_.data, scratch_.data(),
                       tensors_.size() * *tensors_[0].bytes()) == 0;
  return absl::OkStatus();
}

absl::Status Bench::MeasureRestoreFromDisk(Results* r) {
  CKPT_ASSIGN_OR_RETURN(DaemonProcess::State state, daemon_->Query());
  arenas_ = state.arenas;
  client_.reset();
  CKPT_RETURN_IF_ERROR(daemon_->Stop());
  for (const std::string& name : arenas_)
    CKPT_RETURN_IF_ERROR(shm::Arena::Unlink(name));
  arenas_.clear();
  CKPT_RETURN_IF_ERROR(DropShardCache());
  CKPT_RETURN_IF_ERROR(daemon_->Start());
  CKPT_RETURN_IF_ERROR(Connect());
  CKPT_RETURN_IF_ERROR(SampleRawRead(r));
  for (const Tensor& t : tensors_) std::memset(t.data, 0, *t.bytes());
  auto t0 = Clock::now();
  CKPT_RETURN_IF_ERROR(
      Annotate(client_->Restore(last_step_, tensors_), "restore from disk"));
  samples_.restore_disk.push_back(Since(t0));
  bool equal = false;
  CKPT_RETURN_IF_ERROR(CompareState(&equal));
  r->restore_matches = r->restore_matches && equal;

  // The same with the arena already there: two newer saves take both slots
  // (the older one is evicted once durable), so last_step_ is only on disk.
  const int64_t restored = last_step_;
  for (int64_t step = restored + 1; step <= restored + 2; ++step) {
    CKPT_RETURN_IF_ERROR(Annotate(client_->Save(step, tensors_),
                                  absl::StrCat("save of step ", step)));
    CKPT_RETURN_IF_ERROR(Annotate(client_->WaitDurable(step),
                                  absl::StrCat("WaitDurable ", step)));
  }
  last_step_ = restored + 2;
  // The daemon writes the manifest and deletes the steps retention let go
  // after the save is durable: a 1 GiB unlink (with a discard, on a file
  // system mounted with it) took the disk from under the restore, which
  // then measured the daemon's cleanup, not the restore (1.6x the raw read
  // here). A restart's restore finds that work done too.
  CKPT_RETURN_IF_ERROR(WaitDaemonSettled());
  CKPT_RETURN_IF_ERROR(DropShardCache());
  CKPT_RETURN_IF_ERROR(SampleRawRead(r));
  for (const Tensor& t : tensors_) std::memset(t.data, 0, *t.bytes());
  t0 = Clock::now();
  CKPT_RETURN_IF_ERROR(Annotate(client_->Restore(restored, tensors_),
                                "restore from disk (arena exists)"));
  samples_.restore_disk_warm.push_back(Since(t0));
  CKPT_RETURN_IF_ERROR(CompareState(&equal));
  r->restore_matches = r->restore_matches && equal;
  return absl::OkStatus();
}

absl::Status Bench::DropShardCache() {
  std::error_code ec;
  for (const auto& e :
       fs::recursive_directory_iterator(dir_ + "/ckptd/bench", ec))
    if (e.path().extension() == ".shard")
      CKPT_RETURN_IF_ERROR(DropFileCache(e.path().string()));
  if (ec)
    return absl::InternalError(
        absl::StrCat("list ", dir_, "/ckptd/bench: ", ec.message()));
  return absl::OkStatus();
}

// The machine is shared, so limits drift during a run: each limit is
// sampled next to the figure it is compared with, and medians are reported.
absl::Status Bench::SampleMemcpy(int threads) {
  samples_.memcpy.push_back(ParallelMemcpy(scratch_.data(), tensors_, threads));
  return absl::OkStatus();
}

// The raw file stays for the raw reads of the round (SampleRawRead).
absl::Status Bench::SampleRawIo(Results* r) {
  const std::string path = dir_ + "/raw_io.bin";
  const uint64_t bytes = (r->bytes + 4095) / 4096 * 4096;
  // The limit writes from the arena's kind of pages; the same write from
  // 2 MiB anonymous pages is kept beside it (where /dev/shm gives arenas
  // 4 KiB pages, that one is faster than any write from an arena). The
  // order alternates by round.
  const bool anon_first = samples_.raw_write.size() % 2 == 1;
  for (int i = 0; i < 2; ++i) {
    const bool anon = (i == 0) == anon_first;
    fs::remove(path);
    CKPT_ASSIGN_OR_RETURN(
        double w,
        RawWrite(path, anon ? scratch_.data() : write_src_.data(), bytes, {}));
    (anon ? samples_.raw_write_anon : samples_.raw_write).push_back(w);
  }
  return absl::OkStatus();
}

// Into the tensors' own memory, where the disk restores read: on this kind
// of VM the same O_DIRECT read of one file into two equal anonymous
// mappings took 0.68 s and 2.1 s, depending on the memory backing each
// (measured: the first 1 GiB mapped was the slow one). The tensors' bytes
// are overwritten; every restore that follows clears them first.
absl::Status Bench::SampleRawRead(Results* r) {
  const std::string path = dir_ + "/raw_io.bin";
  const uint64_t bytes = r->bytes / 4096 * 4096;
  CKPT_RETURN_IF_ERROR(DropFileCache(path));
  CKPT_ASSIGN_OR_RETURN(double rd, RawRead(path, state_.data, bytes, {}));
  samples_.raw_read.push_back(rd);
  return absl::OkStatus();
}

// Until the daemon has nothing queued (persists, manifests, deletes) for
// two polls in a row, then syncfs: the deletes' freed blocks (and their
// discards) are committed before a restore is timed.
absl::Status Bench::WaitDaemonSettled() {
  int quiet = 0;
  for (int i = 0; i < 3000 && quiet < 2; ++i) {
    CKPT_ASSIGN_OR_RETURN(DaemonProcess::State state, daemon_->Query());
    quiet =
        state.persist_queue == 0 && state.bytes_in_flight == 0 ? quiet + 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A delete the persister is running is no longer queued: wait for the
  // step directories retention let go (the daemon keeps its default 3).
  for (int i = 0; i < 3000; ++i) {
    std::error_code ec;
    int steps = 0;
    for (const auto& e : fs::directory_iterator(dir_ + "/ckptd/bench", ec))
      if (e.path().filename().string().rfind("step-", 0) == 0) ++steps;
    if (ec || steps <= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int fd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", dir_));
  int ret = syncfs(fd);
  int err = errno;
  close(fd);
  if (ret != 0) return ErrnoToStatus(err, absl::StrCat("syncfs ", dir_));
  return absl::OkStatus();
}

// One round: every figure once, each next to its limit, so a drift of the
// shared machine's disk or memory speed moves both alike.
absl::Status Bench::MeasureRound(int round, Results* r) {
  const Samples& x = samples_;
  CKPT_RETURN_IF_ERROR(MeasureSaves(r));  // save stall and persist; memcpy
  // Every save of the round: one slow save (e.g. the first through a new
  // mapping) is what the median hides.
  std::vector<std::string> stalls;
  for (size_t i = x.stall.size() - std::min<size_t>(o_.saves, x.stall.size());
       i < x.stall.size(); ++i)
    stalls.push_back(absl::StrFormat("%.1f", x.stall[i] * 1e3));
  Report(round,
         absl::StrFormat("save stalls %s ms (memcpy %.1f ms)",
                         absl::StrJoin(stalls, ", "), x.memcpy.back() * 1e3));
  CKPT_RETURN_IF_ERROR(MeasureRestoreFromShm(r));
  Report(round,
         absl::StrFormat("restore from shm %.1f ms (memcpy %.1f ms)",
                         x.restore_shm.back() * 1e3, x.memcpy.back() * 1e3));
  const std::string sync_path = dir_ + "/sync_write.bin";
  CKPT_ASSIGN_OR_RETURN(double sync_write, SyncWrite(sync_path, tensors_));
  samples_.sync_write.push_back(sync_write);
  fs::remove(sync_path);
  CKPT_RETURN_IF_ERROR(SampleRawIo(r));  // raw write after persist
  Report(round,
         absl::StrFormat("persist %.3f s (raw write %.3f s; write()+fsync "
                         "%.3f s)",
                         x.persist.back(), x.raw_write.back(), sync_write));
  CKPT_RETURN_IF_ERROR(MeasureRestoreFromDisk(r));  // each after a raw read
  fs::remove(dir_ + "/raw_io.bin");
  Report(round, absl::StrFormat("restore from disk %.3f s (raw read %.3f s)",
                                x.restore_disk.back(), x.raw_read.back()));
  return absl::OkStatus();
}

void Bench::Report(int round, const std::string& figures) const {
  std::fprintf(stderr, "ckpt_bench: round %d/%d: %s\n", round + 1, o_.repeat,
               figures.c_str());
}

void Bench::Summarize(Results* r) const {
  struct Figure {
    const char* key;
    const std::vector<double>& v;
    double* median;
  };
  const Figure figures[] = {
      {"save_stall_s", samples_.stall, &r->save_stall_s},
      {"save_copy_s", samples_.copy, &r->save_copy_s},
      {"memcpy_s", samples_.memcpy, &r->memcpy_s},
      {"sync_write_s", samples_.sync_write, &r->sync_write_s},
      {"persist_s", samples_.persist, &r->persist_s},
      {"raw_write_s", samples_.raw_write, &r->raw_write_s},
      {"raw_write_anon_s", samples_.raw_write_anon, &r->raw_write_anon_s},
      {"restore_shm_s", samples_.restore_shm, &r->restore_shm_s},
      {"restore_disk_s", samples_.restore_disk, &r->restore_disk_s},
      {"restore_disk_warm_s", samples_.restore_disk_warm,
       &r->restore_disk_warm_s},
      {"raw_read_s", samples_.raw_read, &r->raw_read_s}};
  r->spreads.clear();
  for (const Figure& f : figures) {
    *f.median = Median(f.v);
    Spread sp;
    if (!f.v.empty()) {
      sp.min = *std::min_element(f.v.begin(), f.v.end());
      sp.max = *std::max_element(f.v.begin(), f.v.end());
      sp.samples = static_cast<int>(f.v.size());
    }
    r->spreads.emplace_back(f.key, sp);
  }
}

absl::Status Bench::Run(Results* r) {
  CKPT_RETURN_IF_ERROR(Setup(r));
  // Leaves scratch_ holding the state: the reference the restores are checked
  // against.
  for (int i = 0; i < 2; ++i)
    CKPT_RETURN_IF_ERROR(SampleMemcpy(r->copy_threads));
  samples_.memcpy.clear();  // warm-up
  auto t0 = Clock::now();
  CKPT_RETURN_IF_ERROR(Annotate(client_->Save(1, tensors_), "first save"));
  r->first_save_s = Since(t0);
  CKPT_RETURN_IF_ERROR(
      Annotate(client_->WaitDurable(1), "first save: WaitDurable"));
  last_step_ = 1;
  r->restore_matches = true;
  // Figures as they come (stderr), so the first one shows within seconds;
  // the table (or JSON) on stdout has the medians.
  std::fprintf(stderr, "ckpt_bench: first save (creates the arena) %.3f s\n",
               r->first_save_s);
  for (int round = 0; round < o_.repeat; ++round) {
    CKPT_RETURN_IF_ERROR(MeasureRound(round, r));
  }
  Summarize(r);

  if (!o_.object_url.empty()) {
    // Its own daemon: the disk figures above are measured without uploads.
    client_.reset();
    CKPT_ASSIGN_OR_RETURN(DaemonProcess::State state, daemon_->Query());
    CKPT_RETURN_IF_ERROR(daemon_->Stop());
    for (const std::string& name : state.arenas) (void)shm::Arena::Unlink(name);
    ParallelMemcpy(scratch_.data(), tensors_,
                   r->copy_threads);  // scratch_: the reference
    ObjectTierConfig oc{o_.object_url,
                        dir_,
                        o_.ckptd.empty() ? DefaultCkptdPath() : o_.ckptd,
                        absl::StrCat("ckptbencho", getpid()),
                        r->copy_threads,
                        o_.saves,
                        o_.object_store_pid};
    CKPT_RETURN_IF_ERROR(
        MeasureObjectTier(oc, tensors_, scratch_.data(), &r->object));
  }
  return absl::OkStatus();
}

void Bench::Cleanup() {
  client_.reset();
  if (daemon_) {
    if (daemon_->running()) {
      auto state = daemon_->Query();
      if (state.ok()) arenas_ = state->arenas;
    }
    absl::Status s = daemon_->Stop();
    if (!s.ok())
      std::fprintf(stderr, "ckpt_bench: %s\n",
                   std::string(s.message()).c_str());
    daemon_.reset();
  }
  // Arenas go even with --keep: the checkpoints are durable on disk, and a
  // daemon started on the kept root restores from there.
  for (const std::string& name : arenas_) (void)shm::Arena::Unlink(name);
  arenas_.clear();
  if (o_.keep) {
    if (made_dir_) std::fprintf(stderr, "ckpt_bench: kept %s\n", dir_.c_str());
    return;
  }
  if (made_dir_) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    made_dir_ = false;
  }
}

}  // namespace

absl::Status RunBench(const Options& o, Results* r) {
  Bench bench(o);
  return bench.Run(r);
}

}  // namespace ckpt::bench
