// How a call into the core shares the cores with the other calls of this process.
//
// Each call that releases the GIL (a Dask worker's threads, a ThreadPoolExecutor, JAX's or
// torch's threads calling pysharp) starts its own OpenMP team. Two such calls at once on P
// cores would start 2 P threads, each team waiting for its slowest member while the cores are
// shared out among all of them. CoreShare gives the k-th concurrent call P / k threads
// (at least one) for its duration: the calling thread's own setting, restored on exit. The
// number of threads never changes a bit of a result (cpu/batched.hpp, cpu/engine.hpp).
// One counter per compiled module: calls into different run-time compiled models do not
// see each other.
#pragma once

#include <algorithm>
#include <atomic>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pysharp::cpu {

class CoreShare {
 public:
  CoreShare() {
    const int running = active().fetch_add(1) + 1;
#ifdef _OPENMP
    threads_ = omp_get_max_threads();
    if (running > 1) omp_set_num_threads(std::max(1, threads_ / running));
#else
    (void)running;
#endif
  }
  ~CoreShare() {
#ifdef _OPENMP
    omp_set_num_threads(threads_);
#endif
    active().fetch_sub(1);
  }
  CoreShare(const CoreShare&) = delete;
  CoreShare& operator=(const CoreShare&) = delete;

  // Calls of this module running now (tests and diagnostics).
  static int running() { return active().load(); }

 private:
  static std::atomic<int>& active() {
    static std::atomic<int> count{0};
    return count;
  }
  int threads_ = 1;
};

}  // namespace pysharp::cpu
