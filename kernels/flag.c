/* Flags of the transfer layer on the CPU: the release store that signals and the bounded spin that
 * waits (the C twins of kernels/flag.cu; common/xfer's host backend spins with st_flag_wait before it
 * sleeps on a futex). Not a queue: one 32-bit sequence word, compared modulo 2^32. */
#include "strata/kernels.h"

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

static inline uint32_t flag_target(uint32_t seq, const uint32_t *epoch) {
    return seq + (epoch ? __atomic_load_n(epoch, __ATOMIC_ACQUIRE) : 0u);
}

void st_flag_signal(uint32_t *flag, uint32_t seq, const uint32_t *epoch) {
    /* NOTE: seq_cst, not only release: common/xfer's futex protocol reads the waiter count after this
     * store (a store-load pair that release/acquire does not order) */
    __atomic_store_n(flag, flag_target(seq, epoch), __ATOMIC_SEQ_CST);
}

bool st_flag_met(const uint32_t *flag, uint32_t seq, const uint32_t *epoch) {
    return (int32_t)(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - flag_target(seq, epoch)) >= 0;
}

bool st_flag_wait(const uint32_t *flag, uint32_t seq, const uint32_t *epoch, uint64_t timeout_ns, uint32_t *err) {
    uint32_t target = flag_target(seq, epoch);
    uint64_t t0 = 0;
    for (uint32_t i = 0;; i++) {
        if ((int32_t)(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - target) >= 0) return true;
        if (err && __atomic_load_n(err, __ATOMIC_ACQUIRE)) return false;
        if ((i & 63) == 0) { /* the clock every 64 pauses (a clock read costs ~20 ns, a pause 10-150 cycles) */
            uint64_t now = st_time_ns();
            if (i == 0) t0 = now;
            else if (now - t0 >= timeout_ns) {
                if (err) __atomic_store_n(err, ST_FLAG_ERR_TIMEOUT, __ATOMIC_RELEASE);
                return false;
            }
        }
        cpu_relax();
    }
}
