/* A compute limiter refill that follows the load, for HAMi-core's utilisation watcher.
 *
 * HAMi-core refills each process's budget of thread blocks every tick (120 ms) and corrects the refill by a
 * fixed step from the utilisation NVML reports for the last second. A block costs the same whatever it does,
 * so a load of short blocks (a copy kernel, a graph of short kernels) needs many times the refill of a load
 * of long ones for the same share of the GPU, and a fixed step takes tens of seconds to get there.
 *
 * Here the refill is set from what the last second's refills gave: NVML's utilisation is that second's, so
 * the refill that meets the limit is the second's mean refill times limit / utilisation. The refill moves
 * half-way there each tick, grows at most twice in one tick (the utilisation seen before the load shows is
 * near zero), and is never under the floor (the fixed step's smallest, linear in the SM count). Under the
 * limit it is raised only when the process waited for tokens in every tick of that second (the change
 * idle-hold's flag): otherwise the second's utilisation is not what the refill gave (the process idled part of
 * it, or its load is lighter than its cap), and raising it would let a resumed load past its cap.
 *
 * The change share-model (device_plugin/hami_build/watcher_edits.py) puts this in
 * src/multiprocess/multiprocess_utilization_watcher.c after idle-hold's declarations and calls it in place of
 * delta(). Standard C only: tests/device_plugin/test_hami_share_model.py drives it, compiled alone, against a
 * simulated GPU. */
#include <stdint.h>

#define TF_WINDOW 8 /* ticks in the second NVML's utilisation covers (120 ms each) */
#define TF_GROWTH 2 /* the most a refill grows in one tick */

typedef struct {
    int64_t refills[TF_WINDOW];
    int waited[TF_WINDOW];
    int next;
    int filled;
} tf_window_t;

/* The refill for the next tick, after `refill` was this one's; `utilisation` is the last second's, in
 * percent of the GPU, and `waited` says whether the process waited for tokens since the last tick. */
int64_t tf_next_refill(tf_window_t *window, int64_t refill, int limit, int utilisation, int waited, int64_t floor,
                       int64_t most) {
    window->refills[window->next] = refill;
    window->waited[window->next] = waited;
    window->next = (window->next + 1) % TF_WINDOW;
    if (window->filled < TF_WINDOW) {
        window->filled++;
    }
    int64_t sum = 0;
    int held_back = 0;
    for (int i = 0; i < window->filled; i++) {
        sum += window->refills[i];
        held_back += window->waited[i];
    }
    if (utilisation <= limit && held_back < window->filled) {
        return refill < floor ? floor : refill;
    }
    int64_t mean = sum / window->filled;
    int64_t want = utilisation > 0 ? mean * limit / utilisation : refill * TF_GROWTH;
    int64_t next = refill + (want - refill) / 2;
    if (next > refill * TF_GROWTH) {
        next = refill * TF_GROWTH;
    }
    if (next < floor) {
        next = floor;
    }
    return next > most ? most : next;
}
