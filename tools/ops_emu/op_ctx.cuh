// Host stand-in for ops/op_ctx.cuh (same struct, same functions): the group
// barrier is the emulator's 128-fiber barrier.
#pragma once
#include "simt.h"
#include "../isa/gvm_isa.h"

struct gvm_ctx {
    const gvm_instr* ins;
    const gvm_tensor* desc;
    unsigned tid;
    unsigned bar_id;
    unsigned step;
    unsigned char* smem;
    unsigned smem_bytes;
    unsigned again;
};

#define GVM_AGAIN (-1)
#define GVM_SIGNAL_N(n) (-2 - (int)(n))

inline void gvm_group_sync(const gvm_ctx& c) {
    if (c.bar_id < 1 || c.bar_id > 15) emu::fail("group barrier id outside 1..15");
    emu::wait(emu::machine()->group);
}

inline const gvm_tensor& gvm_t(const gvm_ctx& c, int slot) { return c.desc[slot]; }

inline float gvm_argf(const gvm_ctx& c, int i) { return __int_as_float(c.ins->arg[i]); }
