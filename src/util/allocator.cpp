// glibc malloc tuning for step-repetitive allocation patterns.
#include "tessera/util/allocator.h"

#include <malloc.h>

namespace tessera::util {

void configure_host_allocator() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);  // never trim (mallopt(3): -1 disables trimming completely)
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace tessera::util
