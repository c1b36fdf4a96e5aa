// Test helper shared by every test folder: a fresh directory under /var/tmp
// (a real disk, so O_DIRECT is exercised; /dev/shm would silently take the
// buffered path), mode 0755 because tests run clients as other uids too,
// removed with everything in it when the object goes away. Aborts if no
// directory can be made: no test can run without one. Header-only; not
// thread-safe.
#ifndef CKPT_TESTS_TEMP_DIR_H_
#define CKPT_TESTS_TEMP_DIR_H_

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

namespace ckpt::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/var/tmp/ckpt-test-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) abort();
    path_ = tmpl;
    chmod(path_.c_str(), 0755);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TEMP_DIR_H_
