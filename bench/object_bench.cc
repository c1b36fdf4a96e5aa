// object_bench: ObjectBackend's upload and restore of one large object
// against the store's limits measured in the same run (bench/object_raw.h:
// the same bytes PUT and ranged-GET by plain libcurl with the same part
// size and concurrency, to the same server). Rounds alternate raw and ours
// so drift in the store affects both; the best round of each is reported
// with the ratios, and the median of the rounds' own ratios beside them
// (targets: upload >= 0.9, restore >= 0.85 of raw). Each round's figures
// go to stderr.
//
//   AWS_ENDPOINT_URL=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=..
//   AWS_SECRET_ACCESS_KEY=.. object_bench --object-url s3://bucket/prefix
//   [--mib 1024] [--part-mib 16]
//                [--concurrency 8] [--rounds 3] [--json]
//
// A loopback server measures our overhead against the same server, not a
// cloud store's bandwidth.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "bench/object_raw.h"
#include "bench/stats.h"
#include "storage/object_backend.h"
#include "util/program.h"

namespace {

using ckpt::storage::Backend;

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

absl::StatusOr<double> OursUpload(Backend& b, const std::string& key,
                                  const char* buf, uint64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  auto w = b.NewObjectWriter(key, n);
  if (!w.ok()) return w.status();
  if (absl::Status s = (*w)->WriteAt(0, buf, n); !s.ok()) return s;
  if (absl::Status s = (*w)->Commit(); !s.ok()) return s;
  return Since(t0);
}

absl::StatusOr<double> OursRestore(Backend& b, const std::string& key,
                                   char* buf, uint64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = b.NewObjectReader(key);
  if (!r.ok()) return r.status();
  if (absl::Status s = (*r)->ReadAt(0, buf, n); !s.ok()) return s;
  return Since(t0);
}

char* MapBuffer(uint64_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "object_bench", CKPT_VERSION)) return 0;
  CLI::App app{
      "ObjectBackend upload/restore vs raw libcurl PUT/GET to the same store"};
  std::string url;
  uint64_t mib = 1024, part_mib = 0;
  unsigned concurrency = 0, rounds = 3;
  bool json = false, md5 = false;
  app.add_option("--object-url", url,
                 "s3://BUCKET/PREFIX (endpoint, credentials: AWS_* env)")
      ->required();
  app.add_option("--mib", mib, "object size in MiB")
      ->check(CLI::Range(1, 65536));
  app.add_option("--part-mib", part_mib, "part size (default: the backend's)");
  app.add_option("--concurrency", concurrency,
                 "requests in flight (default: the backend's)");
  app.add_option("--rounds", rounds, "rounds (best reported)")
      ->check(CLI::Range(1, 20));
  app.add_option("--verify-md5", md5,
                 "check each part's ETag against its MD5 (ours only)");
  app.add_flag("--json", json, "one JSON object on stdout");
  CLI11_PARSE(app, argc, argv);

  ckpt::storage::ObjectStoreConfig config;
  if (part_mib) config.part_size_mib = part_mib;
  if (concurrency) config.concurrency = concurrency;
  config.verify_part_md5 = md5;
  auto options = ckpt::storage::ResolveObjectStoreOptions(url, config);
  if (!options.ok()) {
    std::fprintf(stderr, "object_bench: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  auto backend = ckpt::storage::NewObjectBackend(*options);
  if (!backend.ok()) {
    std::fprintf(stderr, "object_bench: %s\n",
                 std::string(backend.status().message()).c_str());
    return 2;
  }
  const uint64_t n = mib << 20;
  char* src = MapBuffer(n);
  char* dst = MapBuffer(n);
  if (!src || !dst) {
    std::fprintf(stderr, "object_bench: cannot map 2 x %llu MiB\n",
                 static_cast<unsigned long long>(mib));
    return 2;
  }
  std::mt19937_64 rng(42);
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(src + i, &x, 8);
  }

  double raw_put = 1e30, ours_put = 1e30, raw_get = 1e30, ours_get = 1e30;
  std::vector<double> put_ratios, get_ratios;  // raw / ours, round by round
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "object_bench: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  };
  // Each measurement starts with no dirty pages left by the previous one
  // (a loopback store writes to this machine's disk); rounds alternate
  // which of raw and ours goes first.
  for (unsigned r = 0; r < rounds; ++r) {
    auto timed = [&](auto fn) {
      ::sync();
      return fn();
    };
    auto raw_up = [&] {
      return ckpt::bench::RawObjectPut(*options, "bench/raw.bin", src, n);
    };
    auto ours_up = [&] {
      return OursUpload(**backend, "bench/ours.bin", src, n);
    };
    absl::StatusOr<double> rp = 0.0, op = 0.0, rg = 0.0, og = 0.0;
    if (r % 2 == 0) {
      rp = timed(raw_up);
      if (rp.ok()) op = timed(ours_up);
    } else {
      op = timed(ours_up);
      if (op.ok()) rp = timed(raw_up);
    }
    if (!rp.ok()) return fail(rp.status());
    if (!op.ok()) return fail(op.status());
    auto raw_down = [&] {
      return ckpt::bench::RawObjectGet(*options, "bench/raw.bin", dst, n);
    };
    auto ours_down = [&] {
      return OursRestore(**backend, "bench/ours.bin", dst, n);
    };
    auto check = [&]() -> absl::Status {
      if (std::memcmp(src, dst, n) != 0)
        return absl::DataLossError("restored bytes differ");
      std::memset(dst, 0, n);
      return absl::OkStatus();
    };
    if (r % 2 == 0) {
      rg = timed(raw_down);
      if (rg.ok()) og = timed(ours_down);
      if (og.ok()) {
        absl::Status c = check();
        if (!c.ok()) og = c;
      }
    } else {
      og = timed(ours_down);
      if (og.ok()) {
        absl::Status c = check();
        if (!c.ok()) og = c;
      }
      if (og.ok()) rg = timed(raw_down);
    }
    if (!rg.ok()) return fail(rg.status());
    if (!og.ok()) return fail(og.status());
    raw_put = std::min(raw_put, *rp), ours_put = std::min(ours_put, *op);
    raw_get = std::min(raw_get, *rg), ours_get = std::min(ours_get, *og);
    put_ratios.push_back(*rp / *op);
    get_ratios.push_back(*rg / *og);
    std::fprintf(stderr,
                 "object_bench: round %u/%u: upload %.4f s (raw PUT %.4f s, "
                 "ratio %.3f); restore %.4f s (raw GET %.4f s, ratio %.3f)\n",
                 r + 1, rounds, *op, *rp, *rp / *op, *og, *rg, *rg / *og);
  }
  const double put_ratio = ckpt::bench::Median(put_ratios),
               get_ratio = ckpt::bench::Median(get_ratios);
  (void)(*backend)->Delete("bench/ours.bin");
  (void)(*backend)->Delete("bench/raw.bin");
  const double gib = static_cast<double>(n) / (1 << 30);
  if (json) {
    std::printf(
        "{\"bytes\":%llu,\"part_mib\":%llu,\"concurrency\":%u,\"verify_md5\":%"
        "s,\"upload_s\":%.4f,"
        "\"raw_put_s\":%.4f,\"upload_ratio\":%.3f,\"restore_object_s\":%.4f,"
        "\"raw_get_s\":%.4f,"
        "\"restore_ratio\":%.3f,\"upload_ratio_median\":%.3f,"
        "\"restore_ratio_median\":%.3f}\n",
        static_cast<unsigned long long>(n),
        static_cast<unsigned long long>(options->part_size >> 20),
        options->concurrency, md5 ? "true" : "false", ours_put, raw_put,
        raw_put / ours_put, ours_get, raw_get, raw_get / ours_get, put_ratio,
        get_ratio);
  } else {
    std::printf(
        "object store %s, %.2f GiB, part %llu MiB, %u in flight, best of %u "
        "rounds\n",
        options->endpoint.c_str(), gib,
        static_cast<unsigned long long>(options->part_size >> 20),
        options->concurrency, rounds);
    std::printf(
        "  upload   ours %.3f s (%.2f GiB/s)  raw PUT %.3f s (%.2f GiB/s)  "
        "ratio %.3f, median of the rounds' %.3f (target >= 0.90)\n",
        ours_put, gib / ours_put, raw_put, gib / raw_put, raw_put / ours_put,
        put_ratio);
    std::printf(
        "  restore  ours %.3f s (%.2f GiB/s)  raw GET %.3f s (%.2f GiB/s)  "
        "ratio %.3f, median of the rounds' %.3f (target >= 0.85)\n",
        ours_get, gib / ours_get, raw_get, gib / raw_get, raw_get / ours_get,
        get_ratio);
  }
  return 0;
}
