// The arrays a trajectory run returns. GENERATED from the record table RECORDS in
// pysharp/_engine/records.py by `python tools/gen_methods.py`: edit the table, not this file
// (CI runs the tool with --check). The engine writes them in TrajectoryRunner::observe
// (trajectory.hpp); the modules allocate them in RunOutputs (bind_model.hpp).
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {

// A record's leading axis (Record.every): none (one per trajectory), or one row per record
// step, sharpness step or theta snapshot step.
enum class RecordEvery : int { none, record, sharpness, theta };
inline constexpr const char* kRecordEveryNames[] = {"", "record", "sharpness", "theta"};
// Its trailing axes per trajectory (Record.item): none, the point (D), one value per
// parameter group (G) or the top-k eigenvalues (k).
enum class RecordItem : int { none, point, groups, top_k };
inline constexpr const char* kRecordItemNames[] = {"", "D", "G", "k"};
// When it is filled (Record.when): always, when sharpness is tracked (else it has no rows),
// for a model of several groups, for top_k >= 2 (the last two absent from the result
// otherwise).
enum class RecordWhen : int { always, sharpness, groups, top_k };
inline constexpr const char* kRecordWhenNames[] = {"", "sharpness", "groups", "top_k"};

// X(name, field, T, every, item, when) per record, in the table's order: its key in the
// result dict, its pointer field of BatchRecords and TrajectoryRecords, its element type
// (Real: the run's precision), and its RecordEvery, RecordItem and RecordWhen codes.
#define PYSHARP_RECORDS(X) \
  X(loss,                loss,                Real,         record,    none,   always)    \
  X(norm2,               norm2,               Real,         record,    none,   always)    \
  X(eff_lr,              eff_lr,              Real,         record,    none,   always)    \
  X(grad_norm,           grad_norm,           Real,         record,    none,   always)    \
  X(top_grad,            top_grad,            Real,         record,    none,   sharpness) \
  X(sharpness,           sharpness,           Real,         sharpness, none,   always)    \
  X(eos_ratio,           eos_ratio,           Real,         sharpness, none,   always)    \
  X(sharpness_converged, sharpness_converged, std::uint8_t, sharpness, none,   always)    \
  X(theta,               theta,               Real,         theta,     point,  always)    \
  X(w,                   w_final,             Real,         none,      point,  always)    \
  X(diverged,            diverged,            std::uint8_t, none,      none,   always)    \
  X(diverged_step,       diverged_step,       long long,    none,      none,   always)    \
  X(group_norm2,         group_norm2,         Real,         record,    groups, groups)    \
  X(top_eigenvalues,     top_eigs,            Real,         sharpness, top_k,  top_k)

// Each record's codes, for loops over the records (its element type is the X-macro's alone).
struct RecordSpec {
  const char* name;
  const char* field;
  RecordEvery every;
  RecordItem item;
  RecordWhen when;
};

#define PYSHARP_RECORD_SPEC(name, field, T, every, item, when) \
  {#name, #field, RecordEvery::every, RecordItem::item, RecordWhen::when},
inline constexpr RecordSpec kRecords[] = {PYSHARP_RECORDS(PYSHARP_RECORD_SPEC)};
#undef PYSHARP_RECORD_SPEC
inline constexpr int kRecordCount = 14;

}  // namespace pysharp
