// Whether a CPU buffer can be written in place (a read-only memory map, a constant): asked before a
// kernel writes, so a read-only tensor gives a Python error instead of a segfault.
#pragma once

#include <cstdint>

namespace fk {

// True if the bytes at ptr and ptr + nbytes - 1 lie in writable memory. Writes nothing, keeps no
// state: safe from any thread, after fork(), and while other threads write the same bytes.
bool is_writable(uintptr_t ptr, int64_t nbytes);

}  // namespace fk
