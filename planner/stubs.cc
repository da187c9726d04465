#include "internal.h"
namespace remat::internal {
}
