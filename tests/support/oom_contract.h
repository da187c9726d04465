// Issue 53's contract for an out-of-memory error: an allocation fails only where the bytes
// the runtime must keep at that moment (pinned, locked by running ops, kept for the request's
// recomputation, kernel scratch and workspaces) plus the request exceed the budget less a
// slack. The property tests check it at every out-of-memory error they catch.
#ifndef REMAT_TESTS_SUPPORT_OOM_CONTRACT_H_
#define REMAT_TESTS_SUPPORT_OOM_CONTRACT_H_

#include <gtest/gtest.h>

#include <cstddef>

#include "remat/errors.h"

namespace remat::testing {

// The bytes an error says the runtime could not let go of when it failed.
inline std::size_t must_keep(const OutOfMemoryInfo& i) {
  return i.pinned + i.locked + i.kept + i.untracked;
}

// The contract's slack: a granule for each segment and one for the request (what rounding
// reservations to granules may leave unusable however the blocks move).
inline std::size_t contract_slack(const OutOfMemoryInfo& i) { return (i.segments + 1) * i.granule; }

// Whether `e` shows that the bytes did not exist: must_keep + requested > budget - slack.
inline ::testing::AssertionResult failed_for_want_of_bytes(const OutOfMemoryError& e) {
  const OutOfMemoryInfo& i = e.info();
  const std::size_t slack = contract_slack(i);
  const std::size_t usable = i.budget > slack ? i.budget - slack : 0;
  if (must_keep(i) + i.requested > usable) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "out of memory with the bytes there: must keep " << must_keep(i) << " + request "
         << i.requested << " <= budget " << i.budget << " - slack " << slack << " (" << i.segments
         << " segments, granule " << i.granule << "; " << e.what() << ")";
}

}  // namespace remat::testing

#endif  // REMAT_TESTS_SUPPORT_OOM_CONTRACT_H_
