// remat/timeline_file.h: a memory timeline written as a file a viewer opens: JSON in Chrome's
// trace event format, for Perfetto (ui.perfetto.dev) or chrome://tracing. Part of remat::trace.
//
// Usage:
//   remat::Runtime rt({.backend = remat::Backend::kSimulated, .record_timeline = true});
//   ... run a step ...
//   std::ofstream out("step.trace.json");
//   absl::Status s = remat::write_timeline_file(rt.timeline(), "gpt step 0 @ 0.5", out);
#ifndef REMAT_TIMELINE_FILE_H_
#define REMAT_TIMELINE_FILE_H_

#include <absl/status/status.h>

#include <iosfwd>
#include <string_view>

#include "remat/timeline.h"

namespace remat {

// Writes `timeline` as one JSON object {"traceEvents": [...], "displayTimeUnit": "ns", ...}:
// op slices ("ph": "X") on one track, recomputations on a second, evictions as instants
// ("ph": "i"), and counters ("ph": "C") for allocated, reserved and the budget. Timestamps
// are microseconds (clock / 1000) as the format requires. `title` names the process track.
absl::Status write_timeline_file(const Timeline& timeline, std::string_view title,
                                 std::ostream& out);

}  // namespace remat

#endif  // REMAT_TIMELINE_FILE_H_
