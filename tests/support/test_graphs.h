// Helpers shared by the planner tests.
#ifndef REMAT_TESTS_SUPPORT_TEST_GRAPHS_H_
#define REMAT_TESTS_SUPPORT_TEST_GRAPHS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "remat/graph.h"
#include "remat/schedule.h"

namespace remat::testing {

// Directory of ../shared/graphs, or empty when it is absent.
std::string shared_graphs_dir();
// Checkmate's gen_linear_graph(n): 2n+1 unit nodes, i -> i+1 and i -> 2n-i for i < n.
Graph linear_graph(int n);
// Node 0 (100 bytes, cost 7) feeds 1 and 3; 1 -> 2 -> 3; the others 1 byte, cost 1.
Graph diamond_graph();
// A random DAG of n nodes (edge probability p), sizes in [1, max_bytes], costs in [1, 5].
Graph random_dag(int n, double p, int max_bytes, uint64_t seed);
// A random graph with a forward chain of n nodes mirrored by a backward chain (like a
// training step), random sizes and costs.
Graph random_training_graph(int n, uint64_t seed);
// A DenseNet-like training graph (Huang et al. 2017), shaped like an AOTAutograd joint graph:
// dense blocks of block_layers[b] layers (BN, ReLU, 1x1 conv, BN, ReLU, 3x3 conv), each layer
// reading the concatenation of the block input and every earlier layer's output; transitions
// between blocks; then the backward pass autograd records, where each concatenation's
// gradient is sliced and accumulated into the gradients of all the layers it read. Parameters
// are inputs, the loss gradient a tangent. {6, 12, 24, 16} is DenseNet-121's shape (2,418
// nodes), {6, 12, 32, 32} DenseNet-169's (4,186). seed jitters bytes and costs.
Graph dense_net_graph(const std::vector<int>& block_layers, uint64_t seed);
// Random offloads (Schedule::offloads) for a valid `order`: about half of the instances read
// twice or more, each across a random gap between two of its touches.
std::vector<Offload> random_offloads(const Graph& g, const std::vector<int>& order, uint64_t seed);

}  // namespace remat::testing

#endif
