// Test helper: a fresh directory under /var/tmp (a real disk, so O_DIRECT is
// exercised; /dev/shm would silently take the buffered path), removed with
// everything in it when the object goes away. Not thread-safe.
#ifndef CKPT_STORAGE_TEST_TEMPDIR_H_
#define CKPT_STORAGE_TEST_TEMPDIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace ckpt::storage {

class TestTempDir {
 public:
  TestTempDir() {
    std::string tmpl = "/var/tmp/ckpt_storage_test.XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) abort();
    path_ = tmpl;
  }
  ~TestTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_TEST_TEMPDIR_H_
