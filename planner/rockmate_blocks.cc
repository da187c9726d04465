// Rockmate's block detection (rk-GB) on remat-graph-v1: the forward graph cut at its
// separators into a sequence of blocks, each backward node attached to a block, identical
// blocks found by a canonical signature.
#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <set>

#include "rockmate.h"

namespace remat::detail::rockmate {
namespace {

constexpr int kRest = -1, kShared = -2;  // block_of of nodes outside the blocks

// Note [Parameter-like values]
// Rockmate lets parameters cross block boundaries: they exist before the step and are held
// by the framework. Here that is every `input` node, the values made from them at no cost
// (views such as transposed weights), and constants: values that read no input at all
// (arange, a causal mask), through at most a 0-byte token such as hold_inputs()'s
// `inputs_ready`. They are cheap to hold or to remake anywhere. A value made from inputs
// by real work (an embedding, the first convolution) is an activation, not a parameter:
// data inputs are inputs too, and treating everything computed from inputs alone as
// parameters would hold every activation of the forward pass.
std::vector<char> parameter_like(const Graph& g) {
  std::vector<char> p(g.size(), 0), constant(g.size(), 0);
  for (const Node& v : g.nodes) {
    // A tangent is an input of the step too (hold_inputs() makes every node wait for it).
    if (v.kind == NodeKind::kInput || v.kind == NodeKind::kTangent) {
      p[v.id] = 1;
      continue;
    }
    if (v.phase != Phase::kForward || !v.can_recompute()) continue;
    bool params = true, constants = true, token = v.bytes == 0 && v.cost == 0;
    for (int u : v.inputs) {
      const bool input = !g.nodes[u].can_recompute();
      params = params && p[u];
      constants = constants && constant[u];
      token = token && input;
    }
    constant[v.id] = constants || token;
    p[v.id] = params && (v.cost == 0 || constant[v.id]);
  }
  return p;
}

// Note [The backward side]
// AOTAutograd's joint graphs tag as "forward" the backward's work that does not depend on
// the loss gradient (transposes of saved activations and weights, placed among the
// backward nodes). Cutting the forward graph with them would see every saved activation
// read at the end of the forward pass, and find no separator. A forward view (cost 0)
// belongs to the backward side when it has readers and all of them are on the backward
// side; it then joins a block's backward like the backward nodes. Only views: the last
// activations of the forward pass are read by the backward alone too, and every node
// before them would follow.
std::vector<char> backward_side(const Graph& g, const std::vector<char>& param) {
  const auto users = g.users();
  std::vector<char> late(g.size(), 0);
  for (int v = g.size() - 1; v >= 0; --v) {
    const Node& n = g.nodes[v];
    if (param[v]) continue;
    if (n.phase == Phase::kBackward) {
      late[v] = 1;
      continue;
    }
    bool all = !users[v].empty() && n.cost == 0;
    for (int w : users[v]) all = all && late[w];
    late[v] = all;
  }
  return late;
}

// Why the graph cannot be a sequence of forward blocks mirrored by backward ones, or "".
std::string not_a_sequence(const Graph& g, const std::vector<char>& param,
                           const std::vector<char>& late) {
  bool backward = false;
  for (const Node& v : g.nodes) {
    if (late[v.id]) backward = true;
    if (late[v.id] || param[v.id]) continue;
    for (int u : v.inputs)
      if (late[u]) return "a forward node reads a backward one";
  }
  return backward ? "" : "no backward phase";
}

// Cuts the chain (forward nodes that are not parameter-like, ascending) after each node v
// such that every other chain value made before v and read after it is at most 1/16 of v:
// v is then nearly all that crosses (Rotor's and Rockmate's 1-separators).
std::vector<std::vector<int>> cut_at_separators(const Graph& g, const std::vector<int>& chain) {
  std::vector<int> pos(g.size(), -1);
  for (size_t k = 0; k < chain.size(); ++k) pos[chain[k]] = static_cast<int>(k);
  std::vector<int> far(chain.size());
  for (size_t k = 0; k < chain.size(); ++k) far[k] = static_cast<int>(k);
  for (int v : chain)
    for (int u : g.nodes[v].inputs)
      if (pos[u] >= 0) far[pos[u]] = std::max(far[pos[u]], pos[v]);
  std::vector<std::vector<int>> blocks;
  std::vector<std::vector<int>> expire(chain.size() + 1);
  std::multiset<int64_t> active;  // bytes of the values made so far and read later
  std::vector<int> cur;
  for (size_t k = 0; k < chain.size(); ++k) {
    for (int u : expire[k]) active.erase(active.find(g.nodes[u].bytes));
    const int v = chain[k];
    cur.push_back(v);
    if (active.empty() || *active.rbegin() * 16 <= g.nodes[v].bytes) {
      blocks.push_back(cur);
      cur.clear();
    }
    if (far[k] > static_cast<int>(k)) {
      active.insert(g.nodes[v].bytes);
      expire[far[k]].push_back(v);
    }
  }
  if (!cur.empty()) blocks.push_back(cur);
  return blocks;
}

// Attaches each backward node to a block: the latest block whose forward values it reads,
// but no later than the blocks of the backward values it reads (backward blocks run in
// reverse). A node that reads no block value joins the latest block of its readers (it
// runs just before them), or block 0 (the end of the step) when nothing reads it.
void assign_backward(const Graph& g, const std::vector<char>& late, std::vector<int>* block_of) {
  const int nb = 1 + *std::max_element(block_of->begin(), block_of->end());
  std::vector<char> pending(g.size(), 0);
  for (const Node& v : g.nodes) {
    if (!late[v.id]) continue;
    // Small forward values (a mask, statistics) do not pull a node back to their block:
    // they are held across blocks instead.
    int64_t largest = 0;
    for (int u : v.inputs)
      if ((*block_of)[u] >= 0 && !late[u]) largest = std::max(largest, g.nodes[u].bytes);
    int mx = -1, mn = nb;
    for (int u : v.inputs) {
      const int bu = (*block_of)[u];
      if (bu < 0) continue;
      if (late[u])
        mn = std::min(mn, bu);
      else if (g.nodes[u].bytes * 16 > largest)
        mx = std::max(mx, bu);
    }
    if (mx < 0 && mn == nb)
      pending[v.id] = 1;
    else
      (*block_of)[v.id] = mx < 0 ? mn : std::min(mx, mn);
  }
  const auto users = g.users();
  for (int v = g.size() - 1; v >= 0; --v) {
    if (!pending[v]) continue;
    int b = -1;
    for (int w : users[v]) b = std::max(b, (*block_of)[w]);
    (*block_of)[v] = std::max(b, 0);
  }
}

// Note [Shared views of parameters]
// A parameter-like value that is not an input joins the block of its readers when they all
// lie in one block, or the first of two neighbouring ones (a transposed weight read by a
// layer's forward and, transposed again, by the backward of the block before it): the
// crossing then merges the two, so that the block can keep the view or remake it from the
// weight, whichever its strategies prefer. A free one (a view) read by blocks further apart
// is shared: every block that reads it makes its own copy (free recomputations), instead of
// holding it from the start of the step. Others read by several blocks stay in the rest:
// made first and held.
void attach_parameter_like(const Graph& g, const std::vector<char>& param,
                           std::vector<int>* block_of) {
  const auto users = g.users();
  for (int v = g.size() - 1; v >= 0; --v) {
    if (!param[v] || !g.nodes[v].can_recompute()) continue;
    int lo = std::numeric_limits<int>::max(), hi = -1;
    bool outside = false, by_rest = false;  // read by the rest or by a shared value
    for (int w : users[v]) {
      const int bw = (*block_of)[w];
      outside = outside || bw < 0;
      by_rest = by_rest || bw == kRest;
      lo = std::min(lo, bw);
      hi = std::max(hi, bw);
    }
    if (!outside && hi >= 0 && hi - lo <= 1)
      (*block_of)[v] = lo;
    else
      (*block_of)[v] = (hi < 0 || by_rest || g.nodes[v].cost > 0) ? kRest : kShared;
  }
}

// An attached parameter-like value that only the backward side reads (a weight transposed
// for a gradient) runs in its block's backward too, not in the forward where it would be
// held until then.
void late_parameter_like(const Graph& g, const std::vector<char>& param,
                         const std::vector<int>& block_of, std::vector<char>* late) {
  const auto users = g.users();
  for (int v = g.size() - 1; v >= 0; --v) {
    if (!param[v] || block_of[v] < 0 || users[v].empty()) continue;
    bool all = true;
    for (int w : users[v]) all = all && (*late)[w];
    (*late)[v] = all;
  }
}

// The last chain node of each block.
std::vector<int> separators(const std::vector<int>& block_of, const std::vector<char>& chain,
                            int nb) {
  std::vector<int> out(nb, -1);
  for (size_t v = 0; v < block_of.size(); ++v)
    if (block_of[v] >= 0 && chain[v]) out[block_of[v]] = static_cast<int>(v);
  return out;
}

// Whether the value u (block bu) may be read by a node of block bv; marks it pinned when it
// is small enough to hold across blocks. False: the blocks between must be merged.
bool crossing_allowed(const Graph& g, const std::vector<char>& late, const std::vector<int>& out,
                      int u, int bu, int bv, bool reader_forward, std::vector<char>* pinned) {
  if (bu == bv) return true;
  if (late[u]) return !reader_forward && bv < bu;  // gradients flow to earlier blocks
  if (bv == bu + 1 && out[bu] == u) return true;   // the next block's input
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (int b = std::min(bu, bv); b < std::max(bu, bv); ++b)
    smallest = std::min(smallest, g.nodes[out[b]].bytes);
  if (g.nodes[u].bytes * 16 > smallest) return false;
  (*pinned)[u] = 1;
  return true;
}

// One pass over the edges: the ranges of blocks that must become one, as a map from each
// block to the last block of its group (identity when nothing crosses).
std::vector<int> merge_targets(const Graph& g, const std::vector<char>& late,
                               const std::vector<int>& block_of, const std::vector<int>& out,
                               std::vector<char>* pinned) {
  const int nb = static_cast<int>(out.size());
  std::vector<int> reach(nb);
  for (int b = 0; b < nb; ++b) reach[b] = b;
  std::fill(pinned->begin(), pinned->end(), 0);
  for (const Node& v : g.nodes) {
    const int bv = block_of[v.id];
    if (bv < 0) continue;
    for (int u : v.inputs) {
      const int bu = block_of[u];
      if (bu < 0) continue;
      if (!crossing_allowed(g, late, out, u, bu, bv, !late[v.id], pinned)) {
        const int lo = std::min(bu, bv), hi = std::max(bu, bv);
        reach[lo] = std::max(reach[lo], hi);
      }
    }
  }
  return reach;
}

// Renumbers blocks through `group` (old block -> new block, non-decreasing).
void renumber(const std::vector<int>& group, std::vector<int>* block_of) {
  for (int& b : *block_of)
    if (b >= 0) b = group[b];
}

// Merges crossing ranges until every crossing is allowed; returns the number of blocks.
int merge_crossings(const Graph& g, const std::vector<char>& chain, const std::vector<char>& late,
                    std::vector<int>* block_of, std::vector<char>* pinned, int* merges) {
  for (;;) {
    const int nb = 1 + *std::max_element(block_of->begin(), block_of->end());
    const std::vector<int> out = separators(*block_of, chain, nb);
    std::vector<int> reach = merge_targets(g, late, *block_of, out, pinned);
    std::vector<int> group(nb);
    int next = -1, end = -1;
    for (int b = 0; b < nb; ++b) {
      if (b > end) ++next;
      end = std::max(end, reach[b]);
      group[b] = next;
    }
    if (next + 1 == nb) return nb;
    *merges += nb - (next + 1);
    renumber(group, block_of);
  }
}

// Merges the adjacent pair with the fewest nodes until at most max_blocks remain. Ties go to
// the leftmost pair, so that a repeated pattern merges the same way in every repetition.
int merge_smallest(int nb, int max_blocks, std::vector<int>* block_of) {
  std::vector<int64_t> count(nb, 0);
  for (int b : *block_of)
    if (b >= 0) ++count[b];
  std::vector<int> group(nb);
  for (int b = 0; b < nb; ++b) group[b] = b;
  std::vector<int64_t> size = count;  // per current group
  int groups = nb;
  while (groups > max_blocks) {
    int best = 0;
    for (int k = 1; k + 1 < groups; ++k)
      if (size[k] + size[k + 1] < size[best] + size[best + 1]) best = k;
    size[best] += size[best + 1];
    size.erase(size.begin() + best + 1);
    for (int& x : group)
      if (x > best) --x;
    --groups;
  }
  renumber(group, block_of);
  return groups;
}

void fill_blocks(const Graph& g, const std::vector<char>& chain, int nb, BlockSequence* b) {
  b->fwd.assign(nb, {});
  b->bwd.assign(nb, {});
  b->rerunnable.assign(nb, 1);
  for (const Node& v : g.nodes) {
    const int k = b->block_of[v.id];
    if (k == kRest) b->rest.push_back(v.id);
    if (k < 0) continue;
    (b->late[v.id] ? b->bwd : b->fwd)[k].push_back(v.id);
    if (!b->late[v.id] && !v.can_recompute()) b->rerunnable[k] = 0;
  }
  b->out = separators(b->block_of, chain, nb);
}

// Groups blocks by signature.
void find_kinds(const Graph& g, BlockSequence* b) {
  std::map<std::vector<int64_t>, int> kinds;
  b->kind.assign(b->size(), 0);
  b->representative.clear();
  for (int i = 0; i < b->size(); ++i) {
    auto [it, added] = kinds.emplace(block_signature(g, build_block_problem(g, *b, i)),
                                     static_cast<int>(kinds.size()));
    if (added) b->representative.push_back(i);
    b->kind[i] = it->second;
  }
}

BlockSequence single_block(const Graph& g, const std::string& why) {
  BlockSequence b;
  b.note = why;
  b.block_of.assign(g.size(), 0);
  b.pinned.assign(g.size(), 0);
  b.late.assign(g.size(), 0);
  for (const Node& v : g.nodes) b.late[v.id] = v.phase == Phase::kBackward;
  b.fwd.assign(1, {});
  b.bwd.assign(1, {});
  for (const Node& v : g.nodes) (v.phase == Phase::kForward ? b.fwd : b.bwd)[0].push_back(v.id);
  b.out.assign(1, b.fwd[0].empty() ? -1 : b.fwd[0].back());
  b.rerunnable.assign(1, 0);
  b.kind.assign(1, 0);
  b.representative.assign(1, 0);
  return b;
}

}  // namespace

BlockSequence detect_blocks(const Graph& g, int max_blocks) {
  const std::vector<char> param = parameter_like(g);
  BlockSequence b;
  b.late = backward_side(g, param);
  if (std::string why = not_a_sequence(g, param, b.late); !why.empty()) return single_block(g, why);
  std::vector<int> chain;
  std::vector<char> in_chain(g.size(), 0);
  for (const Node& v : g.nodes) {
    if (b.late[v.id] || param[v.id]) continue;
    chain.push_back(v.id);
    in_chain[v.id] = 1;
  }
  if (chain.empty()) return single_block(g, "no forward chain");
  b.block_of.assign(g.size(), -1);
  b.pinned.assign(g.size(), 0);
  const auto cut = cut_at_separators(g, chain);
  for (size_t i = 0; i < cut.size(); ++i)
    for (int v : cut[i]) b.block_of[v] = static_cast<int>(i);
  assign_backward(g, b.late, &b.block_of);
  attach_parameter_like(g, param, &b.block_of);
  late_parameter_like(g, param, b.block_of, &b.late);
  int nb = merge_crossings(g, in_chain, b.late, &b.block_of, &b.pinned, &b.merges);
  if (nb > max_blocks) {
    nb = merge_smallest(nb, max_blocks, &b.block_of);
    nb = merge_crossings(g, in_chain, b.late, &b.block_of, &b.pinned, &b.merges);
  }
  if (nb < 2) return single_block(g, "no block structure: the forward graph has no separator");
  fill_blocks(g, in_chain, nb, &b);
  find_kinds(g, &b);
  return b;
}

namespace {

// The block's external inputs: values of other blocks read by its nodes, forward ones or
// backward-side ones, ascending.
std::vector<int> external_inputs(const Graph& g, const BlockSequence& b, int block, bool late) {
  std::set<int> ext;
  for (const auto* list : {&b.fwd[block], &b.bwd[block]}) {
    for (int v : *list) {
      for (int u : g.nodes[v].inputs) {
        const int bu = b.block_of[u];
        if (bu >= 0 && bu != block && b.late[u] == late) ext.insert(u);
      }
    }
  }
  return {ext.begin(), ext.end()};
}

}  // namespace

// The block's forward nodes and its own copies of the shared values its nodes read
// (Note [Shared views of parameters]), ascending.
std::vector<int> forward_with_shared(const Graph& g, const BlockSequence& b, int block) {
  std::set<int> nodes(b.fwd[block].begin(), b.fwd[block].end());
  std::vector<int> stack;
  for (const auto* list : {&b.fwd[block], &b.bwd[block]})
    for (int v : *list) stack.push_back(v);
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    for (int u : g.nodes[v].inputs)
      if (b.block_of[u] == kShared && nodes.insert(u).second) stack.push_back(u);
  }
  return {nodes.begin(), nodes.end()};
}

BlockProblem build_block_problem(const Graph& g, const BlockSequence& b, int block) {
  BlockProblem p;
  const std::vector<int> ext_fwd = external_inputs(g, b, block, false);
  const std::vector<int> ext_bwd = external_inputs(g, b, block, true);
  std::vector<int> local(g.size(), -1);
  auto add = [&](int v, bool external) {
    Node n = g.nodes[v];
    n.id = static_cast<int>(p.sub.nodes.size());
    local[v] = n.id;
    if (external) {
      n.kind = NodeKind::kInput;
      n.cost = 0;
      n.inputs.clear();
      n.group.reset();
      if (!b.late[v]) n.bytes = 0;  // the DP holds the block's input
    } else {
      std::vector<int> in;
      for (int u : n.inputs)
        if (local[u] >= 0) in.push_back(local[u]);
      n.inputs = std::move(in);
    }
    p.sub.nodes.push_back(std::move(n));
    p.global.push_back(v);
    p.external.push_back(external);
  };
  for (int v : ext_fwd) add(v, true);
  for (int v : forward_with_shared(g, b, block)) add(v, false);
  p.boundary = p.sub.size();
  for (int v : ext_bwd) {
    add(v, true);
    p.grad_in_bytes += g.nodes[v].bytes;
  }
  for (int v : b.bwd[block]) add(v, false);
  p.sub.name = g.name + "/block" + std::to_string(block);
  p.exported.assign(p.sub.size(), 0);
  const auto users = g.users();
  for (int v : b.fwd[block])
    for (int w : users[v])
      if (b.block_of[w] != block) p.exported[local[v]] = 1;
  if (b.out[block] >= 0) p.exported[local[b.out[block]]] = 1;
  return p;
}

std::vector<int64_t> block_signature(const Graph& g, const BlockProblem& p) {
  std::vector<int64_t> sig = {p.sub.size(), p.boundary};
  for (const Node& n : p.sub.nodes) {
    const Node& orig = g.nodes[p.global[n.id]];
    // Costs compared to about 9 significant digits, so that float noise does not split
    // identical blocks.
    const int64_t cost_bits = std::bit_cast<int64_t>(n.cost) & ~int64_t{0xfffff};
    sig.insert(sig.end(),
               {static_cast<int64_t>(n.kind), static_cast<int64_t>(n.phase), orig.bytes, cost_bits,
                n.can_recompute(), p.exported[n.id], static_cast<int64_t>(n.inputs.size())});
    sig.insert(sig.end(), n.inputs.begin(), n.inputs.end());
  }
  return sig;
}

}  // namespace remat::detail::rockmate
