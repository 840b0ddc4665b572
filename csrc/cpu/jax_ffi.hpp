// The kernels of one model as XLA FFI handlers (jax.ffi), for pysharp.jax: compiled
// at run time against jaxlib's headers (pysharp/models/_compiler.py, compile_jax_ffi),
// one module per model type and real type, so JAX needs no jaxlib at pysharp's build.
//
// The generated translation unit is
//
//   #include "/path/to/the/model.hpp"
//   #include "cpu/jax_ffi.hpp"
//   PYSHARP_JAX_FFI_MODULE(_pysharp_jax_<key>, BNLinearRegression, double)
//
// A call names the model instance by the address of its POD view (the `model` member
// of a holder of pysharp._core or of a loaded model's module, `model_address` there):
// the handlers only read it. The holder must outlive every call; pysharp.jax keeps it.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "cpu/batched.hpp"
#include "xla/ffi/api/ffi.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pysharp::jax_ffi {

namespace ffi = ::xla::ffi;

template <class Real>
constexpr ffi::DataType kDataType = std::is_same_v<Real, double> ? ffi::F64 : ffi::F32;

// Runs f(first_row, rows) over [0, B) in chunks of whole lane blocks, on the calling
// thread and XLA's intra-op pool together, each chunk on one thread: an OpenMP team
// started inside an XLA program competes for the cores with XLA's own threads. The caller
// and num_threads() - 1 pool tasks claim chunks (eight per participant) until none is
// left, the caller from the front of the batch and the tasks from the back: each thread's
// rows are then contiguous and about the same from one call to the next, so they are still
// in its cache (and the caller's match the first part of XLA's own parallel loops, such as
// the update between two calls of a GD loop). Against one counter claimed from the front,
// that cut a jit-compiled GD step (BN linear regression, B 4096, 2 cores) from 217-233 to
// 186-211 us (medians). The caller then waits only for the tasks that are running a chunk,
// never for one that has not started: where the pool's threads are all busy (other custom
// calls running at the same time), the caller does the whole batch itself instead of
// waiting on a task that cannot start. A task that starts after the last chunk was claimed
// finds nothing and returns, touching only the shared counters it holds a reference to.
// The chunks are whole lane blocks, so the bits are those of one call on the whole batch.
// The caller spins briefly before it sleeps on that wait (join_spin).
struct PoolShare {
  explicit PoolShare(std::int64_t chunks) : chunks(chunks) {}
  const std::int64_t chunks;
  std::atomic<std::int64_t> claimed{0};  // chunks claimed from either end: at most `chunks`
  std::atomic<std::int64_t> front{0};    // chunks claimed from the front (the caller)
  std::atomic<std::int64_t> back{0};     // chunks claimed from the back (the pool tasks)
  std::atomic<int> running{0};           // pool tasks inside their claiming loop
  std::mutex mu;
  std::condition_variable idle;
};

// f is dereferenced only for a claimed chunk: a task that starts after the caller returned
// holds a pointer to a function object that is gone.
template <class F>
void claim_chunks(PoolShare& share, bool from_front, std::int64_t B, std::int64_t per, F* f) {
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);  // this thread's setting only, restored below
#endif
  while (share.claimed.fetch_add(1) < share.chunks) {
    const std::int64_t c =
        from_front ? share.front.fetch_add(1) : share.chunks - 1 - share.back.fetch_add(1);
    (*f)(c * per, std::min(per, B - c * per));
  }
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
}

// Spins until no pool task is running a chunk, for at most `limit`, and says whether none
// is. A running task is at most one chunk from done, and waking a caller that went to
// sleep on the condition variable cost about 15 us of a 175 us call in a jit-compiled
// GD loop (BN linear regression, B 4096, 2 cores); spinning instead cut the step by 10-15
// us. The spin holds only the caller's own core, which has no chunk left to run.
inline bool join_spin(const PoolShare& share, std::chrono::microseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int i = 1;; ++i) {
    if (share.running.load() == 0) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
}

template <int L, class F>
void on_pool(ffi::ThreadPool& pool, std::int64_t B, F&& f) {
  const std::int64_t blocks = (B + L - 1) / L;
  const std::int64_t helpers = std::clamp<std::int64_t>(pool.num_threads() - 1, 0, blocks - 1);
  const std::int64_t most = std::min<std::int64_t>(blocks, 8 * (helpers + 1));
  const std::int64_t per = (blocks + most - 1) / most * L;  // rows per chunk
  auto share = std::make_shared<PoolShare>((B + per - 1) / per);
  auto* run = &f;  // called only for a chunk claimed before the caller stops waiting
  for (std::int64_t h = 0; h < helpers; ++h)
    pool.Schedule([share, run, B, per] {
      share->running.fetch_add(1);
      claim_chunks(*share, false, B, per, run);
      {
        std::lock_guard<std::mutex> lock(share->mu);
        share->running.fetch_sub(1);
      }
      share->idle.notify_one();
    });
  claim_chunks(*share, true, B, per, &f);
  if (join_spin(*share, std::chrono::microseconds(500))) return;
  std::unique_lock<std::mutex> lock(share->mu);
  share->idle.wait(lock, [&] { return share->running.load() == 0; });
}

template <class Model, class Real>
struct Handlers {
  using Buf = ffi::Buffer<kDataType<Real>>;
  using Out = ffi::ResultBuffer<kDataType<Real>>;

  static const Model& model(std::uint64_t address) {
    return *reinterpret_cast<const Model*>(static_cast<std::uintptr_t>(address));
  }
  // Rows of a (..., D) buffer; an error unless its size is a multiple of D.
  static ffi::Error rows(const Model& m, std::size_t count, std::int64_t* B) {
    const std::size_t D = static_cast<std::size_t>(m.dim());
    if (count % D != 0)
      return ffi::Error::InvalidArgument("pysharp: an input's last axis must be D = " +
                                         std::to_string(D));
    *B = static_cast<std::int64_t>(count / D);
    return ffi::Error::Success();
  }
  // The kernels' row codes (cpu/batched.hpp): 1 computed, 0 the loss undefined there,
  // 2 a row outside the kernels' safe range (a zero, non-finite or extreme-norm w or v).
  // As pysharp's Python layer does (models/_base.py), such a row is refused when zero or
  // not finite, else recomputed on w 2^-e (and v 2^-f), exact by scale invariance, and
  // its output scaled back by 2^(q f - p e) (output ~ ||w||^-p ||v||^q).
  static int exponent(const Real* x, int D, bool* finite, bool* zero) {
    Real top = Real(0);
    *finite = true;
    for (int k = 0; k < D; ++k) {
      *finite = *finite && x[k] - x[k] == Real(0);
      top = std::max(top, std::abs(x[k]));
    }
    *zero = top == Real(0);
    int e = 0;
    std::frexp(top, &e);
    return e;
  }
  static std::string at(std::size_t b) {
    return " at point " + std::to_string(b) + " of the batch";
  }
  static ffi::Error undefined(std::size_t b) {
    return ffi::Error::InvalidArgument("pysharp: the loss is undefined" + at(b) +
                                       " (a normaliser of the model vanishes there)");
  }
  // Row b of the kernel `run(w, v, outs, ok)` (one row) again, scaled; outs[i] has
  // size[i] entries per row and power (p, q).
  template <class Run>
  static ffi::Error rescaled(std::size_t b, int D, const Real* W, const Real* V,
                             std::initializer_list<std::pair<Real*, int>> outs,
                             std::initializer_list<std::pair<int, int>> powers, Run run) {
    bool finite = true, zero = true;
    const int e = exponent(W + b * D, D, &finite, &zero);
    if (!finite) return ffi::Error::InvalidArgument("pysharp: w is not finite" + at(b));
    if (zero)
      return ffi::Error::InvalidArgument("pysharp: w is zero" + at(b) +
                                         ", where the loss is undefined");
    int f = 0;
    std::vector<Real> ws(D), vs(V ? D : 0);
    for (int k = 0; k < D; ++k) ws[k] = std::ldexp(W[b * D + k], -e);
    if (V) {
      bool vfinite = true, vzero = true;
      f = exponent(V + b * D, D, &vfinite, &vzero);
      if (!vfinite) return ffi::Error::InvalidArgument("pysharp: v is not finite" + at(b));
      if (vzero) f = 0;
      for (int k = 0; k < D; ++k) vs[k] = std::ldexp(V[b * D + k], -f);
    }
    std::uint8_t ok = 0;
    run(ws.data(), V ? vs.data() : nullptr, b, &ok);
    if (ok != 1) return undefined(b);
    auto power = powers.begin();
    for (const auto& [out, size] : outs) {
      const int shift = power->second * f - power->first * e;
      for (int i = 0; i < size; ++i) out[b * size + i] = std::ldexp(out[b * size + i], shift);
      ++power;
    }
    return ffi::Error::Success();
  }

  static ffi::Error loss_grad(ffi::ThreadPool pool, std::uint64_t address, Buf w, Out loss,
                              Out grad) {
    const Model& m = model(address);
    std::int64_t B = 0;
    if (ffi::Error e = rows(m, w.element_count(), &B); e.failure()) return e;
    const int D = m.dim();
    const Real* W = w.typed_data();
    Real *L = loss->typed_data(), *G = grad->typed_data();
    std::vector<std::uint8_t> ok(B);
    // One chunk a thread: claim_chunks sets OpenMP to one thread while it runs them.
    const cpu::PreparedLossGrad<Model, Real> chunk(m, B);
    on_pool<kNativeLanes<Real>>(pool, B, [&](std::int64_t r, std::int64_t n) {
      chunk(W + r * D, n, L + r, G + r * D, ok.data() + r);
    });
    for (std::size_t b = 0; b < ok.size(); ++b) {
      if (ok[b] == 1) continue;
      if (ok[b] == 0) return undefined(b);
      ffi::Error e = rescaled(b, D, w.typed_data(), nullptr, {{L, 1}, {G, D}}, {{0, 0}, {1, 0}},
                              [&](const Real* ws, const Real*, std::size_t r, std::uint8_t* k) {
                                cpu::loss_grad(m, ws, 1, L + r, G + r * D, k);
                              });
      if (e.failure()) return e;
    }
    return ffi::Error::Success();
  }
  template <int Order>
  static ffi::Error directional(ffi::ThreadPool pool, std::uint64_t address, Buf w, Buf v,
                                Out out) {
    const Model& m = model(address);
    std::int64_t B = 0;
    if (ffi::Error e = rows(m, w.element_count(), &B); e.failure()) return e;
    if (v.element_count() != w.element_count())
      return ffi::Error::InvalidArgument("pysharp: w and v must have the same shape");
    const int D = m.dim();
    const Real *W = w.typed_data(), *V = v.typed_data();
    Real* O = out->typed_data();
    std::vector<std::uint8_t> ok(B);
    on_pool<kNativeLanes<Real>>(pool, B, [&](std::int64_t r, std::int64_t n) {
      cpu::directional<Order>(m, W + r * D, V + r * D, n, O + r * D, ok.data() + r);
    });
    for (std::size_t b = 0; b < ok.size(); ++b) {
      if (ok[b] == 1) continue;
      if (ok[b] == 0) return undefined(b);
      // H v ~ ||w||^-2 ||v||, D^3L[v, v] ~ ||w||^-3 ||v||^2
      ffi::Error e = rescaled(b, D, w.typed_data(), v.typed_data(), {{O, D}}, {{Order + 1, Order}},
                              [&](const Real* ws, const Real* vs, std::size_t r, std::uint8_t* k) {
                                cpu::directional<Order>(m, ws, vs, 1, O + r * D, k);
                              });
      if (e.failure()) return e;
    }
    return ffi::Error::Success();
  }

  // The XLA_FFI_Handler entry points (what XLA_FFI_DEFINE_HANDLER writes, per template).
  static XLA_FFI_Error* loss_grad_handler(XLA_FFI_CallFrame* frame) {
    static auto* h = ffi::Ffi::Bind()
                         .template Ctx<ffi::ThreadPool>()
                         .Attr<std::uint64_t>("model")
                         .template Arg<Buf>()
                         .template Ret<Buf>()
                         .template Ret<Buf>()
                         .To(loss_grad)
                         .release();
    return h->Call(frame);
  }
  template <int Order>
  static XLA_FFI_Error* directional_handler(XLA_FFI_CallFrame* frame) {
    static auto* h = ffi::Ffi::Bind()
                         .template Ctx<ffi::ThreadPool>()
                         .Attr<std::uint64_t>("model")
                         .template Arg<Buf>()
                         .template Arg<Buf>()
                         .template Ret<Buf>()
                         .To(directional<Order>)
                         .release();
    return h->Call(frame);
  }
};

// The handlers as PyCapsules, by kernel name, for jax.ffi.register_ffi_target.
template <class Model, class Real>
pybind11::dict capsules() {
  using H = Handlers<Model, Real>;
  pybind11::dict d;
  d["loss_and_grad"] = pybind11::capsule(reinterpret_cast<void*>(&H::loss_grad_handler));
  d["hvp"] = pybind11::capsule(reinterpret_cast<void*>(&H::template directional_handler<1>));
  d["third"] = pybind11::capsule(reinterpret_cast<void*>(&H::template directional_handler<2>));
  return d;
}

}  // namespace pysharp::jax_ffi

#define PYSHARP_JAX_FFI_MODULE(module_name, Model, Real)                      \
  PYBIND11_MODULE(module_name, m) {                                           \
    m.attr("HANDLERS") = ::pysharp::jax_ffi::capsules<Model<Real>, Real>();   \
  }
