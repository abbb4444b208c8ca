// The writability probe. It used to read() each byte's own value back into it from a thread_local
// pipe: the pipe survived fork(), so forked workers read each other's bytes into their tensors, it
// leaked two descriptors per exiting thread, and the read-then-write-back raced with other threads
// writing the same byte. Now nothing is written and nothing is kept:
//
//   Linux >= 5.14: madvise(MADV_POPULATE_WRITE) on the byte's page faults it in writable, exactly
//   as the kernel's first write would, without writing (it fails for a page that cannot be
//   written). About 0.5 us, the cost of the old probe.
//   Otherwise (older kernels, or a mapping madvise declines, e.g. device memory): the permissions
//   of the mapping in /proc/self/maps, read with a descriptor opened and closed by this call.
//   Slower (tens of us) but exact.
//   Not Linux: assume writable (as before).
#include "writable.h"

#if defined(__linux__)
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#endif

namespace fk {

#if defined(__linux__)
namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// Permissions of the mapping containing addr, from /proc/self/maps: 1 writable, 0 not (or not
// mapped), -1 the file could not be read.
int maps_writable(uintptr_t addr) {
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    // "start-end perms offset dev inode path"
    const char* line = text.c_str() + pos;
    char* rest = nullptr;
    const unsigned long long lo = std::strtoull(line, &rest, 16);
    if (rest && *rest == '-') {
      const unsigned long long hi = std::strtoull(rest + 1, &rest, 16);
      if (rest && addr >= lo && addr < hi) return rest[0] == ' ' && rest[2] == 'w' ? 1 : 0;
    }
    pos = eol + 1;
  }
  return 0;
}

bool byte_writable(uintptr_t addr) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(addr & ~(page - 1));
  for (;;) {
    if (madvise(start, page, MADV_POPULATE_WRITE) == 0) return true;
    const int err = errno;
    if (err == EINTR) continue;
    if (err == ENOMEM || err == EFAULT) return false;  // unmapped, or a write would fault
#ifdef EHWPOISON
    if (err == EHWPOISON) return false;
#endif
    break;  // EINVAL: a read-only mapping, or advice this kernel or mapping does not support
  }
  const int w = maps_writable(addr);
  return w != 0;  // -1 (cannot tell): assume writable, as the probe always did
}

}  // namespace

bool is_writable(uintptr_t ptr, int64_t nbytes) {
  if (nbytes <= 0 || ptr == 0) return true;
  return byte_writable(ptr) && (nbytes == 1 || byte_writable(ptr + static_cast<uintptr_t>(nbytes) - 1));
}

#else

bool is_writable(uintptr_t, int64_t) { return true; }

#endif

}  // namespace fk
