// The switching rule of the CUDA device guard, written against an abstract device API so that the
// host can test it without a GPU (bindings.cpp: device_guard_trace; tests/test_backend.py).
//
// As torch's CUDAGuard: switch only when another device is current, and switch back only to a
// device that already has a context. A thread with no current context reports device 0, and
// cudaSetDevice creates a context (hundreds of MiB of GPU memory) on the device it selects, so
// restoring "device 0" unconditionally would put a context on GPU 0 in a process that only ever
// used GPU 1.
#pragma once

namespace fk {

// Api: int current(); void set(int device); void restore(int device) (must not throw);
//      bool has_context(int device).
template <class Api>
class BasicDeviceGuard {
 public:
  BasicDeviceGuard(Api& api, int device) : api_(api) {
    if (device < 0) return;
    const int current = api_.current();
    if (current == device) return;
    api_.set(device);
    prev_ = current;
  }
  ~BasicDeviceGuard() {
    if (prev_ >= 0 && api_.has_context(prev_)) api_.restore(prev_);
  }
  BasicDeviceGuard(const BasicDeviceGuard&) = delete;
  BasicDeviceGuard& operator=(const BasicDeviceGuard&) = delete;

 private:
  Api& api_;
  int prev_ = -1;  // the device to switch back to; -1 = nothing was switched
};

}  // namespace fk
