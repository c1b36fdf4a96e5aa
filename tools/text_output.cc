#include "tools/text_output.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace ckpt::tools {

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

std::string FormatSeconds(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.1f us", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.1f ms", seconds * 1e3);
  return absl::StrFormat("%.3f s", seconds);
}

void Table::Print(std::FILE* out) const {
  std::vector<size_t> width(headers_.size(), 0);
  for (size_t c = 0; c < headers_.size(); ++c) width[c] = headers_[c].size();
  for (const auto& row : rows_)
    for (size_t c = 0; c < row.size() && c < width.size(); ++c)
      width[c] = std::max(width[c], row[c].size());
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < headers_.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      line += cell;
      if (c + 1 < headers_.size())
        line += std::string(width[c] - cell.size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  };
  print_row(headers_);
  for (const auto& row : rows_) print_row(row);
}

namespace {
bool force_progress = false;
}  // namespace

void Progress::Force(bool on) { force_progress = on; }

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)),
      total_(total),
      enabled_(force_progress || isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { Finish(); }

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  Draw();
}

void Progress::Draw() {
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  double pct =
      total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_)
             : 100.0;
  double rate = secs > 0 ? static_cast<double>(done_) / secs : 0;
  std::fprintf(stderr, "\r\033[K%s: %5.1f%% %s / %s  %s/s", label_.c_str(), pct,
               FormatBytes(done_).c_str(), FormatBytes(total_).c_str(),
               FormatBytes(static_cast<uint64_t>(rate)).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::Finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

}  // namespace ckpt::tools
