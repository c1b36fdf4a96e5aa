// Human-readable output for the tools: an aligned text table, byte and
// duration formatting, and a progress line on stderr for long operations
// (drawn only when stderr is a terminal or Progress::Force is on, at most a
// few times per second).
// Not thread-safe; one object per output.
#ifndef CKPT_TOOLS_TEXT_OUTPUT_H_
#define CKPT_TOOLS_TEXT_OUTPUT_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ckpt::tools {

// "1.50 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);
// "1.234 s", "12.3 ms".
std::string FormatSeconds(double seconds);

class Table {
 public:
  explicit Table(std::vector<std::string> headers)
      : headers_(std::move(headers)) {}
  // Rows shorter than the header are padded with empty cells.
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  // Columns separated by two spaces, headers in upper case as given.
  void Print(std::FILE* out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

class Progress {
 public:
  // total: bytes the operation will process; label: what it is doing.
  Progress(std::string label, uint64_t total);
  ~Progress();  // Clears the line if one was drawn.
  void Add(uint64_t bytes);
  void Finish();
  bool enabled() const { return enabled_; }
  // Draw progress lines even when stderr is not a terminal (ckptctl
  // --progress). Call before creating Progress objects.
  static void Force(bool on);

 private:
  void Draw();
  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_TEXT_OUTPUT_H_
