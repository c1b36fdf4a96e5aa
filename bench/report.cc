#include "bench/report.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/json_writer.h"
#include "tools/text_output.h"

namespace ckpt::bench {
namespace {

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }
double GiBps(uint64_t bytes, double s) {
  return s > 0 ? static_cast<double>(bytes) / s / (1 << 30) : 0;
}

}  // namespace

std::vector<Check> Evaluate(const Results& r) {
  std::vector<Check> c;
  double stall_ratio = Ratio(r.save_stall_s, r.memcpy_s);
  c.push_back({"save_stall_vs_memcpy", "save stall", r.save_stall_s, "memcpy",
               r.memcpy_s, stall_ratio, "<= 1.15", stall_ratio <= 1.15});
  double persist_ratio = Ratio(r.raw_write_s, r.persist_s);
  c.push_back({"persist_vs_raw_write", "persist", r.persist_s, "raw write",
               r.raw_write_s, persist_ratio, ">= 0.90", persist_ratio >= 0.9});
  double shm_ratio = Ratio(r.restore_shm_s, r.memcpy_s);
  c.push_back({"restore_shm_vs_memcpy", "restore (shm)", r.restore_shm_s,
               "memcpy", r.memcpy_s, shm_ratio, "<= 1.20", shm_ratio <= 1.2});
  double disk_ratio = Ratio(r.raw_read_s, r.restore_disk_s);
  c.push_back({"restore_disk_vs_raw_read", "restore (disk)", r.restore_disk_s,
               "raw read", r.raw_read_s, disk_ratio, ">= 0.85",
               disk_ratio >= 0.85});
  double warm_ratio = Ratio(r.raw_read_s, r.restore_disk_warm_s);
  c.push_back({"restore_disk_warm_vs_raw_read", "restore (disk, arena exists)",
               r.restore_disk_warm_s, "raw read", r.raw_read_s, warm_ratio,
               ">= 0.85", warm_ratio >= 0.85});
  double sync_ratio = Ratio(r.sync_write_s, r.save_stall_s);
  c.push_back({"sync_write_vs_save_stall", "save stall", r.save_stall_s,
               "write+fsync", r.sync_write_s, sync_ratio,
               ">= 10 (limit/figure)", sync_ratio >= 10});
  if (r.object.measured) {
    const ObjectFigures& o = r.object;
    double up = Ratio(o.raw_put_s, o.upload_s);
    c.push_back({"upload_vs_raw_put", "upload", o.upload_s, "raw PUT",
                 o.raw_put_s, up, ">= 0.90", up >= 0.9});
    double get = Ratio(o.raw_get_s, o.restore_object_s);
    c.push_back({"restore_object_vs_raw_get", "restore (object)",
                 o.restore_object_s, "raw GET", o.raw_get_s, get, ">= 0.85",
                 get >= 0.85});
    double stall = Ratio(o.save_stall_upload_s, o.memcpy_s);
    c.push_back({"save_stall_during_upload_vs_memcpy",
                 "save stall (upload in flight)", o.save_stall_upload_s,
                 "memcpy", o.memcpy_s, stall, "<= 1.15", stall <= 1.15});
  }
  return c;
}

std::string FormatJson(const Results& r) {
  tools::JsonWriter w;
  w.BeginObject();
  w.Field("bytes", r.bytes)
      .Field("image_bytes", r.image_bytes)
      .Field("tensors", r.tensors);
  w.Field("copy_threads", r.copy_threads)
      .Field("saves", r.saves)
      .Field("root", r.root);
  w.Field("backend", r.backend).Field("checksum_impl", r.checksum_impl);
  w.Field("shm_huge_pages", r.shm_huge_pages);
  w.Field("first_save_s", r.first_save_s).Field("save_stall_s", r.save_stall_s);
  w.Field("save_copy_s", r.save_copy_s).Field("memcpy_s", r.memcpy_s);
  w.Field("sync_write_s", r.sync_write_s).Field("persist_s", r.persist_s);
  w.Field("raw_write_s", r.raw_write_s).Field("restore_shm_s", r.restore_shm_s);
  w.Field("restore_disk_s", r.restore_disk_s)
      .Field("restore_disk_warm_s", r.restore_disk_warm_s)
      .Field("raw_read_s", r.raw_read_s);
  w.Field("restore_matches", r.restore_matches);
  // New keys only: scripts read the medians under the keys above.
  w.Field("repeat", r.repeat);
  w.Field("raw_write_anon_s", r.raw_write_anon_s);
  w.Key("spreads").BeginObject();
  for (const auto& [key, sp] : r.spreads) {
    w.Key(key).BeginObject();
    w.Field("min", sp.min).Field("max", sp.max).Field("samples", sp.samples);
    w.EndObject();
  }
  w.EndObject();
  if (r.object.measured) {
    const ObjectFigures& o = r.object;
    w.Field("object_url", o.url).Field("object_part_size", o.part_size);
    w.Field("object_concurrency", o.concurrency);
    w.Field("upload_s", o.upload_s).Field("raw_put_s", o.raw_put_s);
    w.Field("restore_object_s", o.restore_object_s)
        .Field("raw_get_s", o.raw_get_s);
    w.Field("save_stall_upload_s", o.save_stall_upload_s)
        .Field("object_memcpy_s", o.memcpy_s);
    w.Field("saves_during_upload", o.saves_during_upload);
    w.Field("restore_object_matches", o.restore_matches);
    w.Field("raw_get_anon_s", o.raw_get_anon_s);
    w.Field("raw_get_fresh_s", o.raw_get_fresh_s);
    w.Field("restore_cpu_daemon_s", o.restore_cpu_daemon_s)
        .Field("restore_cpu_client_s", o.restore_cpu_client_s)
        .Field("restore_cpu_store_s", o.restore_cpu_store_s);
    w.Field("raw_get_cpu_s", o.raw_get_cpu_s)
        .Field("raw_get_cpu_store_s", o.raw_get_cpu_store_s)
        .Field("raw_get_fresh_cpu_s", o.raw_get_fresh_cpu_s);
    w.Field("restore_faults_daemon", o.restore_faults_daemon)
        .Field("restore_faults_client", o.restore_faults_client)
        .Field("raw_get_faults", o.raw_get_faults)
        .Field("raw_get_fresh_faults", o.raw_get_fresh_faults);
  }
  std::vector<Check> checks = Evaluate(r);
  bool all =
      r.restore_matches && (!r.object.measured || r.object.restore_matches);
  w.Key("ratios").BeginObject();
  for (const Check& c : checks) w.Field(c.name, c.ratio);
  w.EndObject().Key("targets_met").BeginObject();
  for (const Check& c : checks) {
    w.Field(c.name, c.met);
    all = all && c.met;
  }
  w.EndObject().Field("all_targets_met", all).EndObject();
  return w.str();
}

std::string FormatTable(const Results& r) {
  std::string out = absl::StrFormat(
      "ckpt_bench: %s in %d float32 tensors (shard image %s), %d copy threads, "
      "%d rounds of %d "
      "saves; medians, each figure measured next to its limit in every round\n"
      "root %s, storage %s, checksums %s, /dev/shm huge pages %s\n\n",
      tools::FormatBytes(r.bytes), r.tensors, tools::FormatBytes(r.image_bytes),
      r.copy_threads, r.repeat, r.saves, r.root, r.backend, r.checksum_impl,
      r.shm_huge_pages);
  struct Row {
    const char* name;
    double s;
    const char* key;  // its spread, if any
  };
  Row rows[] = {
      {"first save (creates arena)", r.first_save_s, ""},
      {"save stall", r.save_stall_s, "save_stall_s"},
      {"  of which copy+checksum", r.save_copy_s, "save_copy_s"},
      {"memcpy", r.memcpy_s, "memcpy_s"},
      {"write+fsync", r.sync_write_s, "sync_write_s"},
      {"persist (commit->durable)", r.persist_s, "persist_s"},
      {"raw O_DIRECT write", r.raw_write_s, "raw_write_s"},
      {"  the same from 2 MiB anonymous pages", r.raw_write_anon_s,
       "raw_write_anon_s"},
      {"restore from shm", r.restore_shm_s, "restore_shm_s"},
      {"restore from disk (after restart)", r.restore_disk_s, "restore_disk_s"},
      {"restore from disk (arena exists)", r.restore_disk_warm_s,
       "restore_disk_warm_s"},
      {"raw O_DIRECT read", r.raw_read_s, "raw_read_s"}};
  tools::Table figures({"FIGURE", "MEDIAN", "SPREAD (MIN-MAX)", "N", "GiB/s"});
  for (const Row& row : rows) {
    std::string spread = "-", n = "1";
    for (const auto& [key, sp] : r.spreads) {
      if (key != row.key) continue;
      spread = absl::StrCat(tools::FormatSeconds(sp.min), " - ",
                            tools::FormatSeconds(sp.max));
      n = absl::StrCat(sp.samples);
    }
    figures.AddRow({row.name, tools::FormatSeconds(row.s), spread, n,
                    absl::StrFormat("%.2f", GiBps(r.bytes, row.s))});
  }
  std::string table;
  {
    char* buf = nullptr;
    size_t len = 0;
    FILE* mem = open_memstream(&buf, &len);
    figures.Print(mem);
    std::fputc('\n', mem);
    tools::Table checks({"CHECK", "FIGURE", "LIMIT", "RATIO", "TARGET", "MET"});
    for (const Check& c : Evaluate(r))
      checks.AddRow(
          {absl::StrFormat("%s vs %s", c.figure, c.limit),
           tools::FormatSeconds(c.figure_s), tools::FormatSeconds(c.limit_s),
           absl::StrFormat("%.3f", c.ratio), c.target, c.met ? "yes" : "NO"});
    checks.Print(mem);
    std::fclose(mem);
    table.assign(buf, len);
    std::free(buf);
  }
  out += table;
  out += absl::StrFormat("\nrestored bytes equal the saved ones: %s\n",
                         r.restore_matches ? "yes" : "NO");
  if (r.object.measured)
    out += absl::StrFormat(
        "object tier %s (parts of %s, %u in flight): upload %s (raw PUT %s), "
        "restore %s (raw GET "
        "%s; into 2 MiB anonymous pages %s; into fresh memory like a new "
        "arena's %s); restored bytes equal: %s; %d of "
        "the stall samples ended with the "
        "upload in flight\n",
        r.object.url, tools::FormatBytes(r.object.part_size),
        r.object.concurrency, tools::FormatSeconds(r.object.upload_s),
        tools::FormatSeconds(r.object.raw_put_s),
        tools::FormatSeconds(r.object.restore_object_s),
        tools::FormatSeconds(r.object.raw_get_s),
        tools::FormatSeconds(r.object.raw_get_anon_s),
        tools::FormatSeconds(r.object.raw_get_fresh_s),
        r.object.restore_matches ? "yes" : "NO", r.object.saves_during_upload);
  return out;
}

}  // namespace ckpt::bench
