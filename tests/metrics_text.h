// Test support: a parser of the Prometheus text format that finds one
// sample by name and labels (in any order), and the family names of a
// scrape. Header-only; thread-safe (no state).
#ifndef CKPT_TESTS_METRICS_TEXT_H_
#define CKPT_TESTS_METRICS_TEXT_H_

#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>

namespace ckpt::testing {

// The value of the sample `name` whose labels are exactly `labels`.
inline std::optional<double> SampleValue(
    const std::string& text, const std::string& name,
    const std::map<std::string, std::string>& labels = {}) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t end = line.find_first_of("{ ");
    if (end == std::string::npos || line.compare(0, end, name) != 0 ||
        end != name.size())
      continue;
    std::map<std::string, std::string> got;
    size_t pos = end;
    if (line[pos] == '{') {
      ++pos;
      while (pos < line.size() && line[pos] != '}') {
        size_t eq = line.find("=\"", pos);
        if (eq == std::string::npos) break;
        std::string key = line.substr(pos, eq - pos);
        size_t close = eq + 2;
        std::string value;
        while (close < line.size() && line[close] != '"') {
          if (line[close] == '\\' && close + 1 < line.size()) ++close;
          value += line[close++];
        }
        got[key] = value;
        pos = close + 1;
        if (pos < line.size() && line[pos] == ',') ++pos;
      }
      ++pos;
    }
    if (got != labels) continue;
    return std::stod(line.substr(pos));
  }
  return std::nullopt;
}

// The metric family names (`# TYPE` lines) of a scrape.
inline std::set<std::string> Families(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    std::istringstream words(line.substr(7));
    std::string name;
    words >> name;
    out.insert(name);
  }
  return out;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_TEXT_H_
