// Host stand-in for runtime/stamps.cuh: the clocks the ops read (the pacing of
// ops/prefetch.cuh). A nap does nothing: a fiber that yielded without a
// barrier's progress would read as a deadlock, and real time passes anyway.
#pragma once
#include <chrono>

#include "../isa/gvm_isa.h"

inline unsigned long long gvm_globaltimer() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline void gvm_nanosleep(unsigned) {}
