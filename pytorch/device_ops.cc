// The operators the fallback does not run as remat ops: moves between the CPU and the
// device, in-place changes of metadata, and the device's registration with torch.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_to_copy.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cstring>
#include <stdexcept>

#include "pytorch/detail/device_ops.h"
#include "pytorch/detail/torch_call.h"

namespace remat::torch_backend::detail {
namespace {

std::optional<c10::Device> device_argument(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toDevice();
}

// A CPU tensor's bytes as a pinned storage on the device (parameters, buffers, inputs).
at::Tensor to_device(const at::Tensor& cpu) {
  Runtime& rt = Backend::get().runtime();
  const std::size_t bytes = cpu.storage().nbytes();
  Tensor constant = rt.constant(storage_spec(bytes), bytes == 0 ? nullptr : cpu.storage().data());
  return device_tensor(make_storage(std::move(constant), bytes, /*pinned=*/true), Layout::of(cpu));
}

// A device tensor's bytes on the CPU: its storage read whole, seen with its layout.
at::Tensor read_to_cpu(const at::Tensor& t) {
  RematStorage* s = remat_storage_of(t.storage());
  at::Tensor bytes = at::empty({static_cast<std::int64_t>(std::max<std::size_t>(s->nbytes, 1))},
                               at::TensorOptions().dtype(at::kByte));
  Backend::get().runtime().read(s->tensor, bytes.data_ptr());
  at::Tensor view = Layout::of(t).on_cpu(bytes.data_ptr());
  return view.clone(at::MemoryFormat::Preserve);
}

}  // namespace

bool run_to_copy(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  // _to_copy(Tensor self, *, dtype?, layout?, device?, pin_memory?, non_blocking, memory_format?)
  const std::size_t n = op.schema().arguments().size();
  const std::size_t first = stack.size() - n;
  const at::Tensor self = stack[first].toTensor();
  const std::optional<c10::Device> target = device_argument(stack[first + 3]);
  const bool from_device = remat_storage_of(self.storage()) != nullptr;
  const bool to_device = !target.has_value() || target->type() == c10::DeviceType::PrivateUse1;
  if (from_device == to_device) return false;
  const auto dtype = stack[first + 1].toOptional<c10::ScalarType>();
  const auto format = stack[first + 6].toOptional<c10::MemoryFormat>();
  at::Tensor source = from_device ? read_to_cpu(self) : self;
  at::Tensor cpu = at::_to_copy(source, at::TensorOptions().dtype(dtype).device(c10::kCPU),
                                /*non_blocking=*/false, format);
  if (from_device && cpu.data_ptr() == source.data_ptr()) cpu = cpu.clone();
  torch::jit::drop(stack, n);
  stack.push_back(to_device ? detail::to_device(cpu) : cpu);
  return true;
}

void run_inplace_view(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  const std::size_t n = op.schema().arguments().size();
  at::Tensor self = stack[stack.size() - n].toTensor();
  RematStorage* s = remat_storage_of(self.storage());
  TorchCall call(op);
  call.capture(stack, Backend::get().runtime());
  torch::jit::Stack meta = call.meta_arguments();
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  const Layout layout = Layout::of(meta.at(0).toTensor());
  if (s != nullptr && layout.extent_bytes() > s->nbytes)
    TORCH_CHECK_NOT_IMPLEMENTED(false, "remat_torch: ", op.schema().name(), " grows a tensor to ",
                                layout.extent_bytes(), " bytes beyond its ", s->nbytes,
                                "-byte storage; not supported");
  self.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides, layout.offset);
  stack.push_back(self);
}

void run_set(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  const std::string& overload = op.schema().overload_name();
  const std::size_t n = op.schema().arguments().size();
  const std::size_t first = stack.size() - n;
  at::Tensor self = stack[first].toTensor();
  c10::Storage storage;
  Layout layout{{0}, {1}, 0, self.scalar_type()};
  if (overload == "source_Tensor") {
    const at::Tensor& source = stack[first + 1].toTensor();
    storage = source.storage();
    layout = Layout::of(source);
  } else if (overload == "source_Storage" || overload == "source_Storage_storage_offset") {
    storage = stack[first + 1].toStorage();
    const auto item = static_cast<std::int64_t>(self.element_size());
    layout.sizes = {static_cast<std::int64_t>(storage.nbytes()) / item};
    if (overload == "source_Storage_storage_offset") {
      layout.offset = stack[first + 2].toInt();
      layout.sizes = stack[first + 3].toIntVector();
      layout.strides = stack[first + 4].toIntVector();
      if (layout.strides.empty()) {
        layout.strides.assign(layout.sizes.size(), 1);
        for (std::size_t d = layout.sizes.size(); d-- > 1;)
          layout.strides[d - 1] = layout.strides[d] * std::max<std::int64_t>(layout.sizes[d], 1);
      }
    }
  } else {
    storage = make_storage(Tensor(), 0, false);  // set_(): an empty storage
  }
  TORCH_CHECK_NOT_IMPLEMENTED(remat_storage_of(storage) != nullptr || storage.nbytes() == 0,
                              "remat_torch: ", op.schema().name(),
                              " gives a device tensor a storage that is not on the device");
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(storage);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides, layout.offset);
  torch::jit::drop(stack, n);
  stack.push_back(self);
}

void run_is_set_to(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  // A question about identity, not bytes: run on copies it would always say no.
  const std::size_t n = op.schema().arguments().size();
  const at::Tensor self = stack[stack.size() - n].toTensor();
  const at::Tensor other = stack[stack.size() - n + 1].toTensor();
  const bool same =
      self.storage().unsafeGetStorageImpl() == other.storage().unsafeGetStorageImpl() &&
      self.storage_offset() == other.storage_offset() && self.sizes() == other.sizes() &&
      self.strides() == other.strides();
  torch::jit::drop(stack, n);
  stack.emplace_back(same);
}

namespace {

// The device's allocator (UntypedStorage(n, device="remat"), storage copies): a new storage,
// the output of an op that writes nothing (its bytes are undefined until written, as
// torch.empty's are).
class RematAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    Backend& backend = Backend::get();
    std::lock_guard<std::recursive_mutex> lock(backend.mutex());
    static const OpPtr empty = make_op(
        "empty", [](SpecList) -> Outputs { return {}; }, [](const KernelContext&) {});
    const Outputs outputs{OutputSpec(storage_spec(n))};
    Tensor t = backend.runtime().call_with(empty, {}, outputs, 0).at(0);
    return make_data_ptr(std::move(t), n, false);
  }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "remat_torch: device storages are copied by operators");
  }
};

class RematGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device) const override { return device(); }
  c10::Device getDevice() const override { return device(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // Kernels run synchronously on the calling thread: events are complete when recorded.
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
};

class RematHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
};

// Operators with a CompositeExplicitAutograd kernel would run it on the device's tensors,
// which have no memory; they go to the fallback too (`detach`, `_to_copy`, `copy_`...).
void route_composite_operators() {
  static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                            c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op.has_value() || !op->hasSchema() || name.name.rfind("aten::", 0) != 0) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      continue;
    library->impl(qualified_name(name).c_str(),
                  torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
  }
}

struct Registration {
  Registration() {
    // The name torch prints and parses ("remat:0"); registering it also makes the device
    // the process's accelerator, which the autograd engine asks for.
    c10::register_privateuse1_backend("remat");
    at::RegisterPrivateUse1HooksInterface(new RematHooks());
    route_composite_operators();
  }
};
const Registration registration;
RematAllocator allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator);

}  // namespace
}  // namespace remat::torch_backend::detail

C10_REGISTER_GUARD_IMPL(PrivateUse1, remat::torch_backend::detail::RematGuardImpl);
