// Stands in for gloo's gloo/common/memory.h, which Debian's libgloo-dev
// does not ship although gloo/transport/tcp/pair.h includes it. The worker
// only names tcp::Pair (a dynamic_cast and one call into libgloo), never
// builds or copies one, so these declarations need only make the header
// compile: pointer-sized wrappers of the standard smart pointers, as the
// originals are. Used only when the system header is missing
// (worker/CMakeLists.txt).
#ifndef CKPT_WORKER_GLOO_COMPAT_MEMORY_H_
#define CKPT_WORKER_GLOO_COMPAT_MEMORY_H_

#include <memory>

namespace gloo {

template <typename T>
class NonOwningPtr {
 public:
  NonOwningPtr() = default;
  T* operator->() const { return ptr_.get(); }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  std::shared_ptr<T> ptr_;
};

template <typename T>
class WeakNonOwningPtr {
 public:
  WeakNonOwningPtr() = default;

 private:
  std::weak_ptr<T> ptr_;
};

template <typename T>
class ShareableNonOwningPtr {
 public:
  ShareableNonOwningPtr() = default;

 private:
  std::shared_ptr<T> ptr_;
};

}  // namespace gloo

#endif  // CKPT_WORKER_GLOO_COMPAT_MEMORY_H_
