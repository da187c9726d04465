// Where a torch tensor sits in its storage: what it takes to see a remat storage's bytes as
// that tensor on the CPU, or as a meta tensor for shape inference.
#ifndef REMAT_PYTORCH_DETAIL_LAYOUT_H_
#define REMAT_PYTORCH_DETAIL_LAYOUT_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat::torch_backend::detail {

struct Layout {
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t offset = 0;  // in elements, as torch counts a storage offset
  c10::ScalarType dtype = c10::ScalarType::Float;

  static Layout of(const at::Tensor& t);
  // A tensor on `device` over the storage bytes starting at `base` (memory of that device),
  // owning nothing; on_cpu(base) is over(base, kCPU).
  at::Tensor over(const void* base, c10::Device device) const;
  at::Tensor on_cpu(const void* base) const { return over(base, c10::Device(c10::kCPU)); }
  // A meta tensor with this layout in a storage of `storage_bytes`.
  at::Tensor on_meta(std::size_t storage_bytes) const;
  // Bytes from the storage's start to one past the tensor's last element (0 if empty).
  std::size_t extent_bytes() const;
  bool operator==(const Layout&) const = default;
};

// A tensor on the device: `storage` (a remat storage) seen with `layout`.
at::Tensor device_tensor(const c10::Storage& storage, const Layout& layout);

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_LAYOUT_H_
