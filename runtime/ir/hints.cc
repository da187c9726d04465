// A schedule as hints for the dynamic runtime (see Note [Hints by position] in remat/hints.h).
#include <algorithm>

#include "remat/hints.h"
#include "runtime/ir/instances.h"

namespace remat {
namespace {

// The schedule itself, for Note [Following a schedule]: one entry per step that runs an op
// of the program (inputs are the runtime's constants), each with the instances whose last
// read it is. A program's outputs are only dropped (the program may read them after the
// plan's last use, so they are not evicted); frees at a step that is not the
// program's (the last node hold_inputs adds) go to the entry before it. A step that makes
// nothing anyone reads (an optimizer's update) is left out: where a plan puts it does not
// change memory, the program issues it where it must (an update after the backward pass
// that reads the old parameters), and a runtime waiting for it would defer everything
// between. What such a step reads last is only dropped, not freed: the entry before it
// comes before the read (Note [Reads by updates]).
//
// Note [Reads by updates]
// An optimizer's update reads the gradients, which the program holds until the update has
// run. Evicting them at the entry before the update (the last gradient op) would have the
// update recompute them, and with them most of the backward pass: on a tanh MLP whose loop
// let go of its gradients before end_step(), following even the schedule DTR itself
// realized recomputed 1.39 of a step. Dropped instead, they stay resident while the program
// holds them and are freed with their last handle, as an update-free schedule would have
// them.
void append_schedule_steps(const Graph& g, const Schedule& s, const std::vector<StepSite>& sites,
                           const Instances& instances, const std::vector<bool>& is_output,
                           StepHints& hints) {
  const std::size_t steps = s.order.size();
  std::vector<bool> read(g.nodes.size(), false);
  for (const Node& node : g.nodes)
    for (int u : node.inputs)
      if (u >= 0 && u < g.size()) read[static_cast<std::size_t>(u)] = true;
  std::vector<std::vector<int>> dies_after(steps);
  for (std::size_t i = 0; i < steps; ++i)
    dies_after[static_cast<std::size_t>(instances.last_read[i])].push_back(static_cast<int>(i));
  for (std::size_t j = 0; j < steps; ++j) {
    const int v = s.order[j];
    const StepSite& at = sites[static_cast<std::size_t>(v)];
    const bool makes_nothing =
        g.nodes[static_cast<std::size_t>(v)].bytes == 0 && !read[static_cast<std::size_t>(v)];
    if (at.position >= 0 && !makes_nothing) hints.schedule.push_back({at, {}, {}});
    if (hints.schedule.empty()) continue;
    const bool read_by_update = at.position >= 0 && makes_nothing;
    std::vector<StepSite>& frees = hints.schedule.back().free_after;
    for (int i : dies_after[j]) {
      const int v = s.order[static_cast<std::size_t>(i)];
      const StepSite& dying = sites[static_cast<std::size_t>(v)];
      if (dying.position < 0 || dying.output < 0) continue;
      const bool result = instances.next_instance[static_cast<std::size_t>(i)] < 0 &&
                          is_output[static_cast<std::size_t>(v)];
      (result || read_by_update ? hints.schedule.back().drop_after : frees).push_back(dying);
    }
  }
}

// The schedule's offloads on its entries: an instance's copy out after the entry of the step
// that made it, its offload before the first entry at or after `free`, its copy back before
// the first at or after `fetch`. Offloads of instances without a site (constants) are left
// out. Entry k of hints.schedule is the step that first pushed it (entries are in order).
void append_offloads(const Schedule& s, const std::vector<StepSite>& sites, StepHints& hints) {
  if (s.offloads.empty()) return;
  const std::size_t steps = s.order.size();
  std::vector<int> entry_of(steps, -1);  // the entry schedule step j made, or -1
  std::size_t k = 0;
  for (std::size_t j = 0; j < steps && k < hints.schedule.size(); ++j) {
    if (sites[static_cast<std::size_t>(s.order[j])] == hints.schedule[k].site)
      entry_of[j] = static_cast<int>(k++);
  }
  std::vector<int> first_from(steps + 1, -1);  // the first entry at a step >= j
  for (std::size_t j = steps; j-- > 0;)
    first_from[j] = entry_of[j] >= 0 ? entry_of[j] : first_from[j + 1];
  for (const Offload& o : s.offloads) {
    const StepSite& site =
        sites[static_cast<std::size_t>(s.order[static_cast<std::size_t>(o.step)])];
    const int made = entry_of[static_cast<std::size_t>(o.step)];
    const int leaves = first_from[static_cast<std::size_t>(o.free)];
    const int returns = first_from[static_cast<std::size_t>(o.fetch)];
    if (site.position < 0 || site.output < 0 || made < 0 || leaves < 0 || returns < 0) continue;
    hints.schedule[static_cast<std::size_t>(made)].copy_after.push_back(site);
    hints.schedule[static_cast<std::size_t>(leaves)].offload_before.push_back(site);
    hints.schedule[static_cast<std::size_t>(returns)].prefetch_before.push_back(site);
  }
}

}  // namespace

StepHints hints_from_schedule(const Graph& g, const Schedule& s, const std::vector<StepSite>& sites,
                              std::string source) {
  StepHints hints;
  hints.source = std::move(source);
  const int n = g.size();
  const std::size_t steps = s.order.size();
  if (static_cast<int>(sites.size()) != n) return hints;
  auto site = [&](int v) -> const StepSite& { return sites[static_cast<std::size_t>(v)]; };
  auto valid = [&](int v) { return v >= 0 && v < n && site(v).position >= 0; };

  const Instances instances = compute_instances(g, s.order);
  if (!instances.error.empty()) return hints;  // not a valid schedule of g: no advice
  const std::vector<int>& last_read = instances.last_read;
  const std::vector<int>& next_instance = instances.next_instance;
  std::vector<int> count(static_cast<std::size_t>(n), 0);
  std::vector<bool> program_step(steps, false);
  for (std::size_t j = 0; j < steps; ++j) {
    const int v = s.order[j];
    // A first run: the step's op at that position runs here.
    if (count[static_cast<std::size_t>(v)]++ == 0) program_step[j] = valid(v);
  }
  // For each step, the first program step at or after it.
  std::vector<int> next_program(steps + 1, -1);
  for (std::size_t j = steps; j-- > 0;)
    next_program[j] = program_step[j] ? static_cast<int>(j) : next_program[j + 1];

  int positions = 0;
  for (int v = 0; v < n; ++v)
    if (valid(v)) positions = std::max(positions, site(v).position + 1);
  hints.ops.resize(static_cast<std::size_t>(positions));
  for (int v = 0; v < n; ++v) {
    if (!valid(v)) continue;
    OpHint& op = hints.ops[static_cast<std::size_t>(site(v).position)];
    const Node& node = g.nodes[static_cast<std::size_t>(v)];
    op.op = node.op.empty() ? node.name : node.op;
    if (site(v).output < 0) continue;  // an op with no result: nothing to keep or evict
    const auto k = static_cast<std::size_t>(site(v).output);
    if (op.outputs.size() <= k) op.outputs.resize(k + 1);
    op.outputs[k].keep = count[static_cast<std::size_t>(v)] == 1;
    op.outputs[k].recomputed = count[static_cast<std::size_t>(v)] > 1;
  }
  std::vector<bool> is_output(static_cast<std::size_t>(n), false);
  for (int v : g.outputs)
    if (v >= 0 && v < n) is_output[static_cast<std::size_t>(v)] = true;
  for (std::size_t i = 0; i < steps; ++i) {
    const int v = s.order[i];
    if (!valid(v) || site(v).output < 0) continue;
    const int next = next_instance[i];
    if (next < 0 && is_output[static_cast<std::size_t>(v)]) continue;
    const int at = next_program[static_cast<std::size_t>(last_read[i])];
    if (at < 0) continue;                   // freed at the very end: nothing left to save
    if (next >= 0 && next <= at) continue;  // recomputed before that op: it stays
    std::vector<StepSite>& list =
        hints.ops[static_cast<std::size_t>(site(s.order[static_cast<std::size_t>(at)]).position)]
            .evict_after;
    if (std::find(list.begin(), list.end(), site(v)) == list.end()) list.push_back(site(v));
  }
  append_schedule_steps(g, s, sites, instances, is_output, hints);
  append_offloads(s, sites, hints);
  return hints;
}

}  // namespace remat
