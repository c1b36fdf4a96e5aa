// JsonWriter: a small streaming JSON encoder for the tools' `--json` output
// (one object per run, read by scripts). Keys and values are appended in
// call order; strings are escaped per RFC 8259 and non-finite doubles are
// written as null. Misuse (a value without a key inside an object) is a
// programming error and is not checked beyond debug assertions.
// Not thread-safe; one writer per output.
#ifndef CKPT_TOOLS_JSON_WRITER_H_
#define CKPT_TOOLS_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::tools {

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);

  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  // Key + value in one call.
  JsonWriter& Field(std::string_view key, std::string_view value) {
    return Key(key).String(value);
  }
  JsonWriter& Field(std::string_view key, const char* value) {
    return Key(key).String(value);
  }
  JsonWriter& Field(std::string_view key, const std::string& value) {
    return Key(key).String(value);
  }
  JsonWriter& Field(std::string_view key, bool value) {
    return Key(key).Bool(value);
  }
  JsonWriter& Field(std::string_view key, double value) {
    return Key(key).Double(value);
  }
  JsonWriter& Field(std::string_view key, int64_t value) {
    return Key(key).Int(value);
  }
  JsonWriter& Field(std::string_view key, uint64_t value) {
    return Key(key).Uint(value);
  }
  JsonWriter& Field(std::string_view key, int value) {
    return Key(key).Int(value);
  }
  JsonWriter& Field(std::string_view key, uint32_t value) {
    return Key(key).Uint(value);
  }

  const std::string& str() const { return out_; }

 private:
  void BeforeValue();
  std::string out_;
  // One entry per open container: true once it holds an element.
  std::vector<bool> has_element_;
  bool after_key_ = false;
};

// `s` as a quoted, escaped JSON string.
std::string JsonQuote(std::string_view s);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_JSON_WRITER_H_
