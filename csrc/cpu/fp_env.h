// The calling thread's denormal handling, applied on every OpenMP worker of a parallel region.
//
// torch.set_flush_denormal(True) sets the FTZ (flush results to zero) and DAZ (read denormal inputs
// as zero) bits of the MXCSR register of the calling thread only; OpenMP workers are other threads
// with their own MXCSR. Without this, the elements a worker computes would keep denormals while
// those the calling thread computes flush them, and results would depend on the thread count.
// Each parallel region therefore reads the caller's two bits before it starts (CallerFpMode) and
// every thread sets them on entry and restores its own register on exit (WorkerFpMode).
#pragma once

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace fk {

#if defined(__SSE__)
constexpr unsigned kFtzDazBits = 0x8040u;  // MXCSR bit 15 (FTZ) and bit 6 (DAZ)

inline unsigned caller_fp_mode() { return _mm_getcsr() & kFtzDazBits; }

class WorkerFpMode {
 public:
  explicit WorkerFpMode(unsigned mode) : saved_(_mm_getcsr()) {
    const unsigned want = (saved_ & ~kFtzDazBits) | mode;
    if (want != saved_) _mm_setcsr(want);
  }
  ~WorkerFpMode() {
    if (_mm_getcsr() != saved_) _mm_setcsr(saved_);
  }
  WorkerFpMode(const WorkerFpMode&) = delete;
  WorkerFpMode& operator=(const WorkerFpMode&) = delete;

 private:
  unsigned saved_;
};
#else
// torch.set_flush_denormal only acts on x86 (SSE3); elsewhere there is nothing to propagate.
inline unsigned caller_fp_mode() { return 0; }
class WorkerFpMode {
 public:
  explicit WorkerFpMode(unsigned) {}
};
#endif

}  // namespace fk
