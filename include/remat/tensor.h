// Tensor metadata and the user-facing tensor handle.
//
//   remat::TensorSpec spec{{4, 8}, remat::DType::kF32};    // shape and dtype, always known
//   remat::Tensor x = rt.constant(spec, host_data.data()); // pinned, never evicted
//   remat::Tensor y = rt.call1(relu, {x});                 // y's memory may be evicted...
//   const float* p = rt.data<float>(y);                    // ...and is recomputed on access
//
// A Tensor is a counted handle owned by the Runtime that made it; the runtime must outlive
// its handles. Dropping the last handle of a tensor frees its memory at once.
#ifndef REMAT_TENSOR_H_
#define REMAT_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace remat {

enum class DType : std::uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64, kU8 };
std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

struct TensorSpec {
  std::vector<std::int64_t> shape;
  DType dtype = DType::kF32;

  std::int64_t numel() const;
  // Bytes of a contiguous tensor of this spec; throws std::overflow_error on overflow or a
  // negative dimension, naming the shape.
  std::size_t bytes() const;
  std::string to_string() const;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

class Runtime;

class Tensor {
 public:
  Tensor() = default;
  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();

  bool defined() const { return runtime_ != nullptr; }
  const TensorSpec& spec() const;
  const std::vector<std::int64_t>& shape() const { return spec().shape; }
  DType dtype() const { return spec().dtype; }
  std::size_t bytes() const { return spec().bytes(); }
  // Whether the tensor's memory is resident now (false once evicted).
  bool resident() const;
  Runtime* runtime() const { return runtime_; }
  std::uint32_t id() const { return id_; }
  void reset();

 private:
  friend class Runtime;
  Tensor(Runtime* runtime, std::uint32_t id) : runtime_(runtime), id_(id) {}
  Runtime* runtime_ = nullptr;
  std::uint32_t id_ = 0;
};

}  // namespace remat

#endif  // REMAT_TENSOR_H_
