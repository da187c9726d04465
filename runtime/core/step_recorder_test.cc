// Recording a step (runtime/core/step_recorder.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "remat/runtime.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::add_into_first;
using testing::iota;
using testing::logical;
using testing::vec;

// A recorded step shows the freeze: the update's node reads what it froze, so that a plan of
// the step has it resident there (the program cannot free it before the update).
TEST(RuntimeTest, RecordedUpdateReadsWhatItFroze) {
  Runtime rt(logical(SIZE_MAX));
  auto w = rt.constant(vec(16), iota(16).data());
  auto x = rt.constant(vec(16), iota(16, 0.5f).data());
  StepOptions record;
  record.record = true;
  rt.begin_step(record);
  auto h = rt.call1(testing::combine(), {x, w});
  auto g = rt.call1(testing::affine(0.5f, 2.0f), {h});
  auto unrelated = rt.call1(testing::affine(3.0f, 1.0f), {x});
  h.reset();
  rt.update(add_into_first(), {w, x}, {0});
  const RecordedStep step = rt.end_step();
  const Graph& graph = step.graph;
  auto node_of = [&](const std::string& op) {
    for (const Node& n : graph.nodes)
      if (n.op == op) return n.id;
    return -1;
  };
  const int update = node_of("add_into_first");
  ASSERT_GE(update, 0);
  const std::vector<int>& in = graph.nodes[static_cast<std::size_t>(update)].inputs;
  int g_node = -1, unrelated_node = -1;
  for (const Node& n : graph.nodes) {
    if (n.op != "affine") continue;
    // g reads h (a combine node); unrelated reads the input x.
    const bool reads_combine = graph.nodes[static_cast<std::size_t>(n.inputs[0])].op == "combine";
    (reads_combine ? g_node : unrelated_node) = n.id;
  }
  ASSERT_GE(g_node, 0);
  ASSERT_GE(unrelated_node, 0);
  EXPECT_NE(std::find(in.begin(), in.end(), g_node), in.end()) << "g was frozen by the update";
  EXPECT_EQ(std::find(in.begin(), in.end(), unrelated_node), in.end());
  EXPECT_EQ(std::find(in.begin(), in.end(), node_of("combine")), in.end()) << "nobody held h";
  // The trace's CALL takes the frozen tensor as an argument too.
  bool call_reads_g = false;
  for (const DtrInstruction& i : step.trace.instructions)
    if (i.kind == DtrInstruction::Kind::kCall && i.op == "add_into_first")
      call_reads_g = std::find(i.args.begin(), i.args.end(), static_cast<std::uint32_t>(g_node)) !=
                     i.args.end();
  EXPECT_TRUE(call_reads_g);
}

}  // namespace
}  // namespace remat
