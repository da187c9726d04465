// Helpers shared by the planner tests.
#ifndef REMAT_PLANNER_TEST_UTIL_H_
#define REMAT_PLANNER_TEST_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "remat/graph.h"

namespace remat::testing {

// Directory of ../shared/graphs, or empty when it is absent.
std::string SharedGraphsDir();
// Checkmate's gen_linear_graph(n): 2n+1 unit nodes, i -> i+1 and i -> 2n-i for i < n.
Graph LinearGraph(int n);
// A random DAG of n nodes (edge probability p), sizes in [1, max_bytes], costs in [1, 5].
Graph RandomDag(int n, double p, int max_bytes, uint64_t seed);
// A random graph with a forward chain of n nodes mirrored by a backward chain (like a
// training step), random sizes and costs.
Graph RandomTrainingGraph(int n, uint64_t seed);
int64_t NoRematPeak(const Graph& g);

}  // namespace remat::testing

#endif
