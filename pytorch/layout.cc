#include "pytorch/detail/layout.h"

#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/TensorImpl.h>

#include "pytorch/detail/backend.h"

namespace remat::torch_backend::detail {

Layout Layout::of(const at::Tensor& t) {
  return Layout{t.sizes().vec(), t.strides().vec(), t.storage_offset(), t.scalar_type()};
}

at::Tensor Layout::over(const void* base, c10::Device device) const {
  const std::size_t item = c10::elementSize(dtype);
  auto* data =
      static_cast<char*>(const_cast<void*>(base)) + offset * static_cast<std::int64_t>(item);
  return at::from_blob(
      data, sizes, strides, [](void*) {}, at::TensorOptions().dtype(dtype).device(device));
}

at::Tensor Layout::on_meta(std::size_t storage_bytes) const {
  const auto item = static_cast<std::int64_t>(c10::elementSize(dtype));
  const auto elements = static_cast<std::int64_t>(storage_bytes) / item;
  at::Tensor storage = at::empty({elements}, at::TensorOptions().dtype(dtype).device(c10::kMeta));
  return at::as_strided(storage, sizes, strides, offset);
}

std::size_t Layout::extent_bytes() const {
  std::int64_t last = offset;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    last += (sizes[d] - 1) * strides[d];
  }
  return static_cast<std::size_t>(last + 1) * c10::elementSize(dtype);
}

at::Tensor device_tensor(const c10::Storage& storage, const Layout& layout) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(layout.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides, layout.offset);
  return t;
}

}  // namespace remat::torch_backend::detail
