#include "remat/tensor.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <limits>
#include <stdexcept>

namespace remat {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

std::int64_t TensorSpec::numel() const {
  return static_cast<std::int64_t>(bytes() / dtype_size(dtype));
}

std::size_t TensorSpec::bytes() const {
  std::size_t n = dtype_size(dtype);
  for (std::int64_t d : shape) {
    if (d < 0)
      throw std::overflow_error(absl::StrCat("remat: negative dimension in ", to_string()));
    const auto ud = static_cast<std::size_t>(d);
    if (ud != 0 && n > std::numeric_limits<std::size_t>::max() / ud)
      throw std::overflow_error(absl::StrCat("remat: size of ", to_string(), " overflows"));
    n *= ud;
  }
  return n;
}

std::string TensorSpec::to_string() const {
  return absl::StrCat(dtype_name(dtype), "[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace remat
