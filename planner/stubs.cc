#include "internal.h"
namespace remat::internal {
absl::StatusOr<RawPlan> PlanTwremat(const Graph& g, const PlanOptions& o) { return PlanNoRemat(g, o); }
absl::StatusOr<RawPlan> PlanMoccasin(const Graph& g, const PlanOptions& o) { return PlanNoRemat(g, o); }
}
