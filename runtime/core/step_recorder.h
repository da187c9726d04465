// Records a step as it runs: a remat-graph-v1 graph (every op output a node, with its site),
// the same step as a DTR log, and the positions of every op run (RecordedStep).
#ifndef REMAT_RUNTIME_CORE_STEP_RECORDER_H_
#define REMAT_RUNTIME_CORE_STEP_RECORDER_H_

#include <string>
#include <utility>
#include <vector>

#include "remat/runtime.h"
#include "runtime/core/step_hooks.h"

namespace remat::detail {

class Step;

class StepRecorder {
 public:
  StepRecorder(StepHost& rt, const Step& step, const std::string& name);

  void on_constant(Id tensor) { recorded_node(tensor); }
  void record_call(Id op_id, int position);
  void record_update(const OpDef& op, const std::vector<Id>& args, double cost, int position,
                     const std::vector<Id>& frozen);
  // A run of the step's op; a first run also gives the recorded nodes the op's cost, which
  // is known (measured) only once it has run.
  void note_run(const OpRec& op, bool first_run);
  void on_host_read(Id tensor);
  void on_handles_gone(Id tensor);
  void mark_backward();
  // Moves the graph, the trace and the executed positions into `out`.
  void finish(RecordedStep& out);

 private:
  int recorded_node(Id tensor);

  StepHost& rt_;
  const Step& step_;
  Graph graph_;
  DtrTrace trace_;
  std::vector<std::pair<Id, int>> made_;  // (tensor, node) of the step's op outputs
  std::vector<int> executed_;             // positions of every op run, recomputations too
  std::vector<int> host_read_;            // nodes the program read back (data(), read())
  // Per position: the op's CALL in the trace and its first node (-1: none).
  std::vector<std::pair<int, int>> call_at_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_STEP_RECORDER_H_
