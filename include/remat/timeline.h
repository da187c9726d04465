// remat/timeline.h: a memory timeline of a run, as the runtime records it
// (RuntimeOptions::record_timeline); remat/timeline_file.h writes it for a viewer.
//
// Times are the runtime's clock (the summed cost of the ops run so far, in the cost unit of
// the ops: nanoseconds for measured and recorded costs), so a timeline of the simulated
// backend shows where time would go on the device, recomputations included.
#ifndef REMAT_TIMELINE_H_
#define REMAT_TIMELINE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace remat {

struct TimelineEvent {
  enum class Kind : std::uint8_t {
    kCompute,    // an op's first run: a slice [start, start + duration)
    kRecompute,  // a rerun of an op whose output had been evicted: a slice
    kEvict,      // a storage evicted (by the policy or by a hint): an instant at `start`
  };
  Kind kind = Kind::kCompute;
  std::string name;       // the op's name (for kEvict: the op that made the evicted storage)
  double start = 0;       // runtime clock at the start
  double duration = 0;    // the op's cost (0 for instants)
  std::size_t bytes = 0;  // bytes the op's outputs take, or the bytes evicted
};

// Memory after an event: bytes held by live tensors (allocated) and reserved from the
// device by the caching allocator (equal to allocated in logical accounting).
struct MemorySample {
  double time = 0;
  std::size_t allocated = 0;
  std::size_t reserved = 0;
};

struct Timeline {
  std::vector<TimelineEvent> events;  // in the order they happened
  std::vector<MemorySample> memory;   // one per event, same order, non-decreasing time
  std::size_t budget = SIZE_MAX;      // SIZE_MAX: none
};

}  // namespace remat

#endif  // REMAT_TIMELINE_H_
