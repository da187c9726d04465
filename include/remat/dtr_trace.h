// A recorded training step in the DTR log format (one JSON object per line; see
// docs/formats.md, "DTR log"), parsed into typed instructions.
//
//   absl::StatusOr<remat::DtrTrace> trace = remat::read_dtr_trace_file("resnet32.log");
//   if (!trace.ok()) std::cerr << trace.status();   // names the offending line
//
// Handles are interned: `args`, `results`, `dst` and `src` index `handle_names`.
//
// A trace that parses is one the replay can run: the parser checks the trace's semantics as it
// reads (validate_dtr_trace below), so a bad file is an error naming its line, never a failure
// inside the runtime.
#ifndef REMAT_DTR_TRACE_H_
#define REMAT_DTR_TRACE_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace remat {

struct DtrInstruction {
  enum class Kind : std::uint8_t {
    kConstant,
    kCall,
    kMutate,
    kCopy,
    kCopyFrom,
    kRelease,
    kBackward
  };
  Kind kind = Kind::kCall;
  int line = 0;                        // 1-based line in the file
  std::string op;                      // operator name (CALL, MUTATE)
  std::vector<std::uint32_t> args;     // handles read (CALL, MUTATE)
  std::vector<std::uint32_t> results;  // handles written (CALL); the constant (CONSTANT)
  std::vector<std::uint64_t> bytes;    // per result / for the constant
  std::vector<int> alias;              // per result: -1 own storage, k: view of args[k]
  std::vector<int> mutate;             // argument indices overwritten (MUTATE)
  std::uint64_t time_ns = 0;           // CALL, MUTATE
  std::uint32_t dst = 0, src = 0;      // COPY, COPY_FROM; RELEASE uses dst
};

// The largest size in bytes a trace may give a tensor, and the largest total of the bytes it
// creates: 2^62 (4 EiB), far past any device, so that sums of live bytes in the runtime and the
// caching allocator's rounding stay inside 64 bits.
inline constexpr std::uint64_t kMaxTraceBytes = std::uint64_t{1} << 62;

struct DtrTrace {
  std::string name;
  std::vector<DtrInstruction> instructions;  // from after START
  std::vector<std::string> handle_names;
  std::uint64_t total_time_ns = 0;  // sum of TIME over CALL and MUTATE
};

// Errors name `name` (read_dtr_trace_file: the path) and the line: "t.log:12: ...".
absl::StatusOr<DtrTrace> parse_dtr_trace(std::istream& in, const std::string& name);
absl::StatusOr<DtrTrace> read_dtr_trace_file(const std::string& path);

// Checks what the parser checks, for a trace built in code: handle indices in range, sizes,
// aliases and MUTATE indices consistent with each instruction, every handle read (ARGS, SRC,
// RELEASE) live (defined and not released since), no live handle defined again (a CONSTANT,
// a RESULT or a COPY's DST; COPY_FROM rebinds DST by definition), no handle listed twice in one
// RESULT, every size at most kMaxTraceBytes, the bytes the trace creates (every MEMORY, and a
// copy per mutated argument) at most kMaxTraceBytes in all, and the sum of TIME within 64 bits
// and equal to total_time_ns. Errors name the instruction's line.
absl::Status validate_dtr_trace(const DtrTrace& trace);

// Writes `trace` in the DTR log format (START, then one line per instruction with its MEMORY
// and ALIAS lines); parse_dtr_trace reads it back to an equal trace. An instruction naming a
// handle with no name is an error naming the instruction, and nothing is written.
absl::Status write_dtr_trace(const DtrTrace& trace, std::ostream& out);
absl::Status write_dtr_trace_file(const DtrTrace& trace, const std::string& path);

}  // namespace remat

#endif  // REMAT_DTR_TRACE_H_
