// CPU drivers for the trajectory engine and batched Lanczos: one trajectory
// (or one point) per OpenMP iteration, scratch allocated once per thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pysharp/engine/bn_linreg_spectral.hpp"
#include "cpu/batched.hpp"
#include "pysharp/core/lanes.hpp"
#include "pysharp/engine/lanczos.hpp"
#include "pysharp/engine/trajectory.hpp"

namespace pysharp::cpu {

// Runs B trajectories; trajectory b uses global index offset + b for its
// random streams and its hyperparameters at index b of h. make_state(w0, scratch)
// builds the trajectory's state in state_reals of scratch.
template <class Model, class Real, class MakeState>
void run_batch_with(const Model& m, const EngineConfig& c, const Real* W0,
                    const Hyperparameters<Real>& h, long long B, long long offset,
                    const BatchRecords<Real>& out, long long state_reals,
                    MakeState&& make_state) {
  const int D = m.dim();
#pragma omp parallel if (B > 1)
  {
    std::vector<Real> state_scratch(state_reals);
    std::vector<Real> scratch(trajectory_scratch_reals(D, c));
    std::vector<Jet<Real, 1>> jets(jet_scratch_size(m));
    // Dynamic: diverging trajectories finish early; the schedule never changes bits.
#pragma omp for schedule(dynamic, 4)
    for (long long b = 0; b < B; ++b) {
      auto state = make_state(W0 + b * D, state_scratch.data());
      run_trajectory(m, c, offset + b, state, h.from(b), out.row(b, B, D),
                     scratch.data(), jets.data());
    }
  }
}

// Lane blocks one thread advances in alternation (run_to_end over runners),
// for a batch of `blocks` blocks. A tiny model's step is one dependency chain
// through sqrt and division, so a lone block leaves the SIMD units idle; three
// chains in flight gave Toy3D 1.5x (1.7e8 -> 2.5e8 trajectory-steps/s, 2-core
// AVX2). Larger models keep the units busy on their own and gain nothing
// measurable; a batch of few blocks is better spread over the threads. The
// choice never changes bits.
template <class Model>
int interleaved_blocks(const Model& m, long long blocks) {
  return m.dim() <= 16 && blocks >= 64 ? 3 : 1;
}

// Any model, any method: the iterate is stored in full, W = kNativeLanes
// trajectories per block advancing in lockstep, lane-interleaved, so that the
// model's loss_grad, the update and the divergence masks run in SIMD across
// trajectories. Every trajectory runs in a lane of a block (the last block is
// padded), never on a scalar path, so its bits do not depend on B, its
// position, the chunking or the thread count.
template <class Model, class Real>
void run_batch(const Model& m, const EngineConfig& c, const Real* W0,
               const Hyperparameters<Real>& h, long long B, long long offset,
               const BatchRecords<Real>& out) {
  constexpr int W = kNativeLanes<Real>;
  using V = Lanes<Real, W>;
  using State = FullSpaceState<Model, V>;
  using Runner = TrajectoryRunner<Model, State, V>;
  const int D = m.dim();
  const long long blocks = (B + W - 1) / W;
  const int G = interleaved_blocks(m, blocks);
  const long long groups = (blocks + G - 1) / G;
#pragma omp parallel if (groups > 1)
  {
    std::vector<V> state_scratch(G * State::scratch_size(m)), w0(D);
    const long long reals = trajectory_scratch_reals(D, c, W);
    std::vector<Real> scratch(G * reals);
    std::vector<Jet<Real, 1>> jets(jet_scratch_size(m));
    std::vector<V> lane_scratch(c.sharpness_every > 0 ? trajectory_scratch_lanes(D, c) : 0);
    std::vector<Jet<V, 1>> lane_jets(c.sharpness_every > 0 ? jet_scratch_size(m) : 0);
    std::vector<State> states;
    std::vector<Runner> runners;
    states.reserve(G);
    runners.reserve(G);
    // Dynamic: diverging blocks finish early; the schedule never changes bits.
#pragma omp for schedule(dynamic, 1)
    for (long long grp = 0; grp < groups; ++grp) {
      states.clear();
      runners.clear();
      for (long long blk = grp * G; blk < std::min(blocks, (grp + 1) * G); ++blk) {
        const long long first = blk * W;
        const int lanes = static_cast<int>(std::min<long long>(W, B - first));
        long long traj[W];
        std::int64_t src[W];
        TrajectoryRecords<Real> rows[W];
        for (int l = 0; l < W; ++l) src[l] = first + l;
        for (int l = 0; l < lanes; ++l) {
          traj[l] = offset + first + l;
          rows[l] = out.row(first + l, B, D);
        }
        const int j = static_cast<int>(runners.size());
        gather_rows(W0, D, src, lanes, w0.data());  // padding lanes repeat the first
        states.emplace_back(m, w0.data(), state_scratch.data() + j * State::scratch_size(m));
        runners.emplace_back(m, c, lanes, traj, states.back(), h.from(first), rows,
                             scratch.data() + j * reals, jets.data(), lane_scratch.data(),
                             lane_jets.data());
      }
      run_to_end(runners.data(), static_cast<int>(runners.size()), c);
    }
  }
}

// Lanes of the reduced engine's lockstep blocks: a step is two short reductions and a sqrt
// and division per lane, and several registers of lanes keep enough independent chains in
// flight to hide their latency, while the two reductions' accumulators stay in registers:
// four registers of doubles, 8 lanes on SSE2 and NEON, 16 on AVX2, 32 on AVX-512 (floats
// take as many lanes). Measured on spectral_gd_wd_lanes (d 40 n 20, one core, 1e8
// trajectory-steps/s at 8 / 16 / 32 / 64 lanes): SSE2 0.89 / 0.86 / 0.72 / 0.69, AVX2
// 1.4 / 1.65 / 1.4 / 1.0, AVX-512 1.1 / 1.9 / 2.3 / 1.5; float at 16 / 32 / 64: AVX2 3.3 /
// 2.6 / 2.9, AVX-512 3.5 / 3.3 / 3.6. Each lane's arithmetic is the same whatever the width.
inline constexpr int kSpectralLanes = 4 * kNativeLanes<double>;

// BN linear regression without jitter: the exact reduced update in the
// singular basis of Xc. Plain GD+WD advances blocks of kSpectralLanes trajectories in
// lockstep between observations (spectral_gd_wd_lanes); scalar RMSprop, whose
// step depends on every gradient norm, runs trajectory by trajectory.
template <class Real>
void run_batch_spectral(const BNLinearRegression<Real>& m, const BNLinRegSpectral<Real>& sp,
                        const EngineConfig& c, const Real* W0, const Hyperparameters<Real>& h,
                        long long B, long long offset, const BatchRecords<Real>& out) {
  using State = SpectralState<Real>;
  if (c.method != Method::gd_wd) {
    run_batch_with(m, c, W0, h, B, offset, out, State::scratch_size(sp),
                   [&sp](const Real* w0, Real* scratch) { return State(sp, w0, scratch); });
    return;
  }
  constexpr int kLanes = kSpectralLanes;
  const int D = m.dim(), r = sp.r;
  const long long blocks = (B + kLanes - 1) / kLanes;
#pragma omp parallel if (blocks > 1)
  {
    std::vector<Real> state_scratch(kLanes * State::scratch_size(sp));
    std::vector<Real> scratch(kLanes * trajectory_scratch_reals(D, c));
    std::vector<Jet<Real, 1>> jets(jet_scratch_size(m));
    std::vector<Real> b(r * kLanes), b_start(r * kLanes), b_try(r * kLanes);
    Real cf[kLanes], cf_start[kLanes], cf_try[kLanes], decay[kLanes], rate[kLanes];
#pragma omp for schedule(dynamic, 1)
    for (long long blk = 0; blk < blocks; ++blk) {
      const long long first = blk * kLanes;
      const int lanes = static_cast<int>(std::min<long long>(kLanes, B - first));
      std::vector<State> states;
      std::vector<TrajectoryRunner<BNLinearRegression<Real>, State, Real>> runners;
      states.reserve(kLanes);
      runners.reserve(kLanes);
      bool alive[kLanes];
      for (int l = 0; l < kLanes; ++l) {
        // Padding lanes repeat the block's first trajectory and are never read back.
        const long long j = first + (l < lanes ? l : 0);
        states.emplace_back(sp, W0 + j * D, state_scratch.data() + l * State::scratch_size(sp));
        decay[l] = Real(1) - h.lr[j] * h.wd[j];
        rate[l] = h.lr[j];
        alive[l] = l < lanes;
      }
      for (int l = 0; l < lanes; ++l)
        runners.emplace_back(m, c, offset + first + l, states[l], h.from(first + l),
                             out.row(first + l, B, D),
                             scratch.data() + l * trajectory_scratch_reals(D, c), jets.data());
      auto gather = [&](Real* dst, Real* cdst) {
        for (int l = 0; l < kLanes; ++l) {
          for (int k = 0; k < r; ++k) dst[k * kLanes + l] = states[l].b[k];
          cdst[l] = states[l].c;
        }
      };
      long long t = 0;
      while (true) {
        for (int l = 0; l < lanes; ++l)
          if (alive[l] && !runners[l].observe(t)) alive[l] = false;
        if (t == c.steps) break;
        long long next = t + 1;
        while (!is_event(c, next)) ++next;
        gather(b.data(), cf);
        std::copy(b.begin(), b.end(), b_start.begin());
        std::copy(cf, cf + kLanes, cf_start);
        spectral_gd_wd_lanes<kLanes>(sp, b.data(), cf, decay, rate, next - t);
        for (int l = 0; l < lanes; ++l) {
          if (!alive[l]) continue;
          bool finite = is_finite(cf[l]);
          for (int k = 0; k < r; ++k) finite = finite && is_finite(b[k * kLanes + l]);
          if (finite) {
            for (int k = 0; k < r; ++k) states[l].b[k] = b[k * kLanes + l];
            states[l].c = cf[l];
            continue;
          }
          // Replay the segment one step at a time (the same lane arithmetic) to
          // freeze this lane at its last finite iterate.
          std::copy(b_start.begin(), b_start.end(), b_try.begin());
          std::copy(cf_start, cf_start + kLanes, cf_try);
          for (long long s = t; s < next; ++s) {
            spectral_gd_wd_lanes<kLanes>(sp, b_try.data(), cf_try, decay, rate, 1);
            bool ok = is_finite(cf_try[l]);
            for (int k = 0; k < r; ++k) ok = ok && is_finite(b_try[k * kLanes + l]);
            if (!ok) {
              runners[l].flag(s + 1);
              break;
            }
            for (int k = 0; k < r; ++k) states[l].b[k] = b_try[k * kLanes + l];
            states[l].c = cf_try[l];
          }
          alive[l] = false;
        }
        t = next;
      }
      for (int l = 0; l < lanes; ++l) runners[l].finish();
    }
  }
}

// Top-k eigenpairs of H(w) for each row of W (B, D). start: (B, D) or nullptr.
// k = 1 runs lane blocks of W points in lockstep (lanczos_lanes.hpp); k > 1
// (locking, lanczos.hpp) one point at a time. Point b's random streams are
// keyed by streams[b] (b where streams is null) and o.counter.
template <class Model, class Real>
void lanczos_batch(const Model& m, const LanczosOptions& o, const Real* W, const Real* start,
                   const std::uint64_t* streams, long long B, Real* evals, Real* evecs,
                   Real* resid, int* iterations, std::uint8_t* converged, std::uint8_t* ok) {
  const int D = m.dim();
  const int k = o.k;
  if (k == 1) {
    constexpr int L = kNativeLanes<Real>;
    using V = Lanes<Real, L>;
    const std::int64_t blocks = (B + L - 1) / L;
#pragma omp parallel if (worth_threads(m, B * o.max_iter) && blocks > 1)
    {
      std::vector<V> w(D), s(start ? D : 0), vscratch(lanczos_lanes_scratch_v(D, o.max_iter));
      std::vector<Real> rscratch(lanczos_lanes_scratch_reals(D, o.max_iter, L));
      std::vector<Real> block_evecs(static_cast<std::size_t>(L) * D);
      std::vector<Jet<V, 1>> jets(jet_scratch_size(m));
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        std::int64_t rows[L];
        std::uint64_t stream[L];
        bool warm[L];
        const int lanes = static_cast<int>(std::min<std::int64_t>(L, B - blk * L));
        for (int l = 0; l < L; ++l) {
          rows[l] = blk * L + (l < lanes ? l : 0);
          stream[l] = streams ? streams[rows[l]] : static_cast<std::uint64_t>(rows[l]);
          warm[l] = start != nullptr;
        }
        gather_rows(W, D, rows, lanes, w.data());
        if (start) gather_rows(start, D, rows, lanes, s.data());
        const V* wp = w.data();
        Jet<V, 1>* jp = jets.data();
        auto apply = [&](const V* x, V* y) {
          const mask_t<V> defined = hvp(m, wp, x, y, jp);
          if (o.smallest)
            for (int i = 0; i < D; ++i) y[i] = -y[i];
          return defined;
        };
        Real ev[L], rs[L];
        LanczosReport rep[L];
        lanczos_lanes(apply, D, o, stream, start ? s.data() : nullptr, warm, ev, block_evecs.data(),
                      rs, rep, vscratch.data(), rscratch.data());
        for (int l = 0; l < lanes; ++l) {
          const std::int64_t b = rows[l];
          evals[b] = o.smallest ? -ev[l] : ev[l];
          resid[b] = rs[l];
          std::copy(block_evecs.begin() + static_cast<long long>(l) * D,
                    block_evecs.begin() + static_cast<long long>(l + 1) * D, evecs + b * D);
          iterations[b] = rep[l].iterations;
          converged[b] = rep[l].converged;
          ok[b] = rep[l].ok;
        }
      }
    }
    return;
  }
#pragma omp parallel if (worth_threads(m, B * o.max_iter))
  {
    std::vector<Real> scratch(lanczos_scratch_size(D, o));
    std::vector<Jet<Real, 1>> jets(jet_scratch_size(m));
#pragma omp for schedule(dynamic, 4)
    for (long long b = 0; b < B; ++b) {
      LanczosOptions ob = o;
      ob.stream = streams ? streams[b] : static_cast<std::uint64_t>(b);
      const Real* w = W + b * D;
      auto apply = [&](const Real* x, Real* y) { return hvp(m, w, x, y, jets.data()); };
      const LanczosReport rep = lanczos(apply, D, ob, start ? start + b * D : nullptr,
                                        evals + b * k, evecs + b * k * D, resid + b * k,
                                        scratch.data());
      iterations[b] = rep.iterations;
      converged[b] = rep.converged;
      ok[b] = rep.ok;
    }
  }
}

}  // namespace pysharp::cpu
