// Choosing what to evict: the policy's best victim, or a contiguous window of blocks.
#include "runtime/core/runtime_impl.h"

#include <algorithm>
#include "runtime/core/wall_clock.h"

#include <chrono>
#include <cmath>

#include "runtime/alloc/detail/allocator_hooks.h"
#include "runtime/alloc/detail/blocks.h"

namespace remat::detail {

// With sampling on, a random sqrt(n) subset is scored (DTR's own option), which bounds the
// cost of one decision at the price of sometimes missing the best victim; otherwise the
// candidate index finds the best one (see Note [Candidate index]).
Id RuntimeImpl::choose_victim() {
  const std::size_t n = candidates_->size();
  if (n == 0) return kNone;
  if (!options.sample_candidates || n <= 64) return candidates_->best(clock);
  const std::size_t k = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  Id best = kNone;
  double best_score = 0;
  candidates_->sample(sampler_, k, [&](Id s) {
    const double score = storages[s].lingering ? 0.0 : policy->score(s);
    if (best == kNone || score < best_score) {
      best = s;
      best_score = score;
    }
  });
  return best != kNone ? best : candidates_->best(clock);
}

// The timer covers choosing what to evict; evicting it (freeing, lineage) is not the search.
bool RuntimeImpl::reclaim(std::size_t bytes) {
  const auto start = SteadyClock::now();
  evicting_.clear();
  const Id victim = choose_victim();
  if (caching != nullptr && options.contiguous_eviction && victim != kNone &&
      !AllocatorHooks::release_would_serve(*caching, storages[victim].ptr, bytes))
    choose_window(bytes);
  // A window of free blocks alone frees nothing new (the allocator would have used them).
  if (evicting_.empty() && victim != kNone) evicting_.push_back(victim);
  if (evicting_.empty()) {
    const bool compacted = compact(bytes) || evacuate(bytes) || offload_coldest();
    stats.search_seconds += seconds_since(start);
    if (!compacted) {
      failed_breakdown_ = resident_breakdown();
      failed_breakdown_->moves_refused = moves_refused_;
    }
    return compacted;
  }
  stats.search_seconds += seconds_since(start);
  for (Id s : evicting_) evict_or_offload(s);
  return true;
}

// Note [Compaction]
// When nothing is left to evict, a request can still fail with much of the budget free in
// pieces: the blocks between the pieces are pinned (parameters, frozen gradients) or locked
// by ops waiting for their inputs to be recomputed. Such a block can move: nothing holds its
// address across runtime calls (a kernel's pointers are taken when it launches, data()
// pointers live until the next call), except a kernel running now, which may be asking for
// scratch memory (then nothing moves), and other streams (their blocks stay). So before
// giving up, the runtime looks for the window, or the segments to empty, that would serve
// the request at the least bytes moved (the same search as Note [Contiguous eviction], with
// a block's size as its cost, barriers where it cannot move), checks that the free blocks of
// the other segments hold what it would move, and moves it there: a copy on the runtime's
// stream, the storage's pointer and block tag updated. The allocator then serves the request
// from the freed window, or releases the emptied segments and reserves one. Each request
// compacts a bounded number of times, so two layouts cannot trade blocks forever.
const char* RuntimeImpl::move_refusal() const {
  if (kernel_running_) return "a kernel was running (it may hold pointers: nothing moves)";
  if (!options.compaction) return "compaction is off (RuntimeOptions::compaction)";
  return nullptr;
}

bool RuntimeImpl::refuse_moves(const char* why) {
  moves_refused_ = why;
  return false;
}

bool RuntimeImpl::compact(std::size_t bytes) {
  if (caching == nullptr) return false;
  if (const char* why = move_refusal()) return refuse_moves(why);
  int& compactions = compactions_.in(request_);
  if (compactions >= kMaxCompactionsPerRequest)
    return refuse_moves("this request made the most compactions one request may");
  moves_refused_ = nullptr;  // tried: what it cannot join, no move could
  WindowSearch& w = window_search_;
  const std::size_t need = caching->rounded_size(bytes);
  price_windows(bytes, [this](std::size_t, std::uint32_t tag) {
    if (tag == BlockLayout::kFree) return 0.0;
    if (!movable_block(tag)) return WindowSearch::kBarrier;
    return static_cast<double>(movable_bytes(tag));
  });
  if (!w.choose(need, AllocatorHooks::unreserved(*caching)) || w.chosen().empty()) return false;
  std::vector<std::uint32_t> moving;
  std::vector<std::size_t> sizes;
  for (std::size_t i : w.chosen()) {
    moving.push_back(w.tags()[i]);
    sizes.push_back(movable_bytes(w.tags()[i]));
  }
  AvoidedMemory avoid = chosen_segments();
  if (!AllocatorHooks::places_outside(*caching, sizes, avoid)) {
    if (w.chosen_window().first == WindowSearch::kNone) return false;
    avoid = chosen_window_range();
    if (!AllocatorHooks::places_outside(*caching, sizes, avoid)) return false;
  }
  bool moved = false;
  for (std::uint32_t tag : moving) {
    const std::size_t b = movable_bytes(tag);
    void* to = AllocatorHooks::allocate_outside(*caching, b, avoid);
    if (to == nullptr) break;
    move_block(tag, to);
    stats.compaction_bytes += b;
    moved = true;
  }
  if (moved) {
    ++stats.compactions;
    ++compactions;
  }
  return moved;
}

// What the blocks a compaction moves keep out of: first the segments of the blocks it chose
// (the segments it empties, or the one holding the window it clears), so that the moved
// blocks go to other segments and the rest of the window's own segment stays free (moving
// into it fragments it: more compactions, then more evictions). Where the other segments
// have no room (the expandable arena is one segment), only the window itself, from its first
// block to its last (the free blocks at its ends included).
AvoidedMemory RuntimeImpl::chosen_segments() const {
  AvoidedMemory avoid;
  for (std::size_t i : window_search_.chosen()) {
    const std::uint64_t serial =
        AllocatorHooks::segment_serial(*caching, movable_ptr(window_search_.tags()[i]));
    if (std::find(avoid.segments.begin(), avoid.segments.end(), serial) == avoid.segments.end())
      avoid.segments.push_back(serial);
  }
  return avoid;
}

AvoidedMemory RuntimeImpl::chosen_window_range() const {
  const WindowSearch& w = window_search_;
  const auto [begin, end] = w.chosen_window();
  const std::size_t first = w.chosen().front(), last = w.chosen().back();
  AvoidedMemory avoid;
  avoid.window_begin = reinterpret_cast<std::uintptr_t>(movable_ptr(w.tags()[first]));
  for (std::size_t j = begin; j < first; ++j) avoid.window_begin -= w.sizes()[j];
  avoid.window_end = reinterpret_cast<std::uintptr_t>(movable_ptr(w.tags()[last]));
  for (std::size_t j = last; j <= end; ++j) avoid.window_end += w.sizes()[j];
  return avoid;
}

bool RuntimeImpl::movable_block(std::uint32_t tag) const {
  static_assert(kNoTag > BlockLayout::kFree && BlockLayout::kFree > kFirstScratchTag);
  if (is_storage_tag(tag)) {
    if (!storages[tag].resident) return false;
  } else if (tag >= BlockLayout::kFree || preparing_ == nullptr ||
             tag - kFirstScratchTag >= preparing_->scratch.size()) {
    return false;
  }
  return !AllocatorHooks::used_by_other_streams(*caching, movable_ptr(tag));
}

std::size_t RuntimeImpl::movable_bytes(std::uint32_t tag) const {
  return is_storage_tag(tag) ? storages[tag].bytes
                             : preparing_->scratch[tag - kFirstScratchTag].second;
}

void* RuntimeImpl::movable_ptr(std::uint32_t tag) const {
  return is_storage_tag(tag) ? storages[tag].ptr
                             : preparing_->scratch[tag - kFirstScratchTag].first;
}

void RuntimeImpl::move_block(std::uint32_t tag, void* to) {
  if (is_storage_tag(tag))
    move_storage(tag, to, /*copy_bytes=*/true);
  else
    move_op_scratch(tag - kFirstScratchTag, to);  // nothing written yet: no bytes to copy
}

// Note [Contiguous eviction]
// In allocator accounting, evicting the best-scored tensors one at a time frees bytes that
// are scattered over segments: a large request may need many evictions before two freed
// blocks happen to be adjacent. Following Coop (Zhang et al., NeurIPS 2023), the runtime
// instead looks at each segment of the request's pool in address order and finds the window
// of adjacent blocks, each free or held by an evictable storage, whose bytes cover the
// request at the least total eviction cost (the policy's score times the size, i.e. the
// cost of the evicted neighbourhood over staleness for the DTR family; scores come from the
// candidate index's stored keys, so weighing a block costs O(1) rather than a walk). Costs are
// non-negative, so a two-pointer sweep finds each segment's best window in linear time
// (`WindowSearch`, Note [Window sweep] in window_search.cc). The other way to make room is
// to empty whole segments, of either pool, so that they can be returned and a new one
// reserved; the cheaper of the two wins.
// The window search weighs every block, which is too dear to do on every decision when ops
// take microseconds (the recorded tree LSTM). So it runs only where fragmentation is the
// problem: when freeing the policy's own best victim would not serve the request (its block
// and free neighbours are too small, and its segment would not empty into enough room),
// which the allocator answers in O(1) (`release_would_serve`). Otherwise the runtime evicts
// that victim, as in logical accounting, whose per-byte choices are what the policies are
// tuned for; the window search is left to the decisions where fragmentation is the problem.

// Prices every window of the allocator's segments for a request of `bytes` (WindowSearch),
// each block weighed by cost_of(position, tag).
template <typename CostOf>
void RuntimeImpl::price_windows(std::size_t bytes, CostOf cost_of) {
  window_search_.price(
      caching->rounded_size(bytes), AllocatorBlocks(*caching),
      [&](const SegmentView& segment, std::size_t segment_bytes) {
        return AllocatorHooks::window_serves(*caching, segment, segment_bytes, bytes);
      },
      cost_of);
}

void RuntimeImpl::choose_window(std::size_t bytes) {
  candidates_->with_pricing(clock, [&](auto score) { choose_window(bytes, score); });
}

// Window costs come from stored keys, lower bounds of the true ones (keys lag behind keys
// that grew, and a lowered key is only its floor); like the candidate index, the search
// checks the window it chose: it refreshes its victims' keys and chooses again while any of
// them turns out dearer than stored, so the window it evicts is priced right and no other
// can be cheaper. Nothing is evicted in between, so the blocks are scanned once, each key
// is refreshed at most once, and a refreshed block reprices only the windows that hold it.
template <typename Score>
void RuntimeImpl::choose_window(std::size_t bytes, Score score) {
  WindowSearch& w = window_search_;
  const std::size_t need = caching->rounded_size(bytes);
  // What evicting the storage in a block costs: 0 for a free block, a barrier where the
  // block cannot be evicted (the candidate index holds exactly the evictable storages). It
  // runs for every block, so the arrays it reads are fetched once, not once a block.
  auto block_cost = [recs = storages.data(), score](std::uint32_t tag) {
    static_assert(kNoTag > BlockLayout::kFree && BlockLayout::kFree > kFirstScratchTag);
    if (!is_storage_tag(tag)) return tag == BlockLayout::kFree ? 0 : WindowSearch::kBarrier;
    const StorageRec& r = recs[tag];
    if (r.candidate_slot == kNone) return WindowSearch::kBarrier;
    // Sizes are far below 2^63, and a signed conversion is one instruction.
    return score(r.candidate_slot) * static_cast<double>(static_cast<std::int64_t>(r.bytes));
  };
  price_windows(bytes, [block_cost](std::size_t, std::uint32_t tag) { return block_cost(tag); });
  const std::vector<std::uint32_t>& tags = w.tags();
  const std::size_t unreserved = AllocatorHooks::unreserved(*caching);
  window_refreshed_.assign(tags.size(), false);
  for (int round = 0; round < 8; ++round) {
    if (!w.choose(need, unreserved)) return;
    bool stale = false;
    for (std::size_t i : w.chosen()) {
      if (window_refreshed_[i]) continue;
      window_refreshed_[i] = true;
      candidates_->refresh(storages[tags[i]].candidate_slot);
      stale |= w.reprice(i, block_cost(tags[i]));
    }
    if (!stale) break;
  }
  for (std::size_t i : w.chosen()) evicting_.push_back(tags[i]);
}

}  // namespace remat::detail
