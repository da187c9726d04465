// The public functions of remat/torch.h, over the process's one Backend.
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>

#include "pytorch/detail/backend.h"
#include "remat/torch.h"

namespace remat::torch_backend {
namespace {

std::unique_lock<std::recursive_mutex> locked() {
  return std::unique_lock<std::recursive_mutex>(detail::Backend::get().mutex());
}

}  // namespace

c10::Device device() { return detail::device(); }

// Note [Moving modules in place]
// A C++ module holds its parameters in members (Linear::weight) as well as in its list, so a
// move must change the same TensorImpl: `set_data`, which the device allows (Note [Moves keep
// identity], pytorch/shallow_copy.cc), as `Module::to` does. `move_module` also moves the
// gradients, which `Module::to` leaves where they are.
namespace {

void move_in_place(at::Tensor& t, c10::Device to) {
  if (!t.defined() || t.device() == to) return;
  t.set_data(t.to(to));
}

}  // namespace

void move_module(torch::nn::Module& module, c10::Device device) {
  at::NoGradGuard no_grad;
  for (at::Tensor& p : module.parameters()) {
    move_in_place(p, device);
    if (p.grad().defined()) move_in_place(p.mutable_grad(), device);
  }
  for (at::Tensor& b : module.buffers()) move_in_place(b, device);
}

void set_budget(std::size_t bytes) {
  auto lock = locked();
  detail::Backend::get().set_budget(bytes);
}

std::size_t budget() {
  auto lock = locked();
  return detail::Backend::get().runtime().budget();
}

void set_policy(const std::string& policy) {
  auto lock = locked();
  detail::Backend::get().set_policy(policy);
}

void set_host_memory(std::size_t bytes) {
  auto lock = locked();
  detail::Backend::get().set_host_memory(bytes);
}

void set_costs(const std::string& costs) {
  if (costs != "estimated" && costs != "measured")
    throw std::invalid_argument("remat_torch: costs are \"estimated\" or \"measured\", not \"" +
                                costs + "\"");
  auto lock = locked();
  detail::Backend::get().set_estimated_costs(costs == "estimated");
}

void set_execution(const std::string& name) {
  auto lock = locked();
  detail::Backend::get().set_execution(name);
}

std::string execution() {
  auto lock = locked();
  return std::string(detail::Backend::get().execution().name());
}

std::vector<std::string> executions() { return detail::execution_names(); }

std::vector<std::string> execution_problems() {
  auto lock = locked();
  return detail::Backend::get().execution().problems();
}

void clear_execution_problems() {
  auto lock = locked();
  detail::Backend::get().execution().clear_problems();
}

void side_read(const at::Tensor& t, bool record_stream) {
  auto lock = locked();
  detail::RematStorage* s = detail::remat_storage_of(t.storage());
  if (s == nullptr)
    throw std::invalid_argument("remat_torch: side_read of a tensor off the device");
  detail::Backend& backend = detail::Backend::get();
  backend.execution().side_read(backend.runtime(), s->tensor, record_stream);
}

std::size_t host_waits() {
  auto lock = locked();
  return detail::Backend::get().execution().host_waits();
}

std::string costs() {
  auto lock = locked();
  return detail::Backend::get().estimated_costs() ? "estimated" : "measured";
}

std::string policy() {
  auto lock = locked();
  return detail::Backend::get().policy();
}

PlanReport plan_report() {
  auto lock = locked();
  return detail::Backend::get().plan_report();
}

RuntimeStats stats() {
  auto lock = locked();
  return detail::Backend::get().runtime().stats();
}

std::vector<HeldTensors> held_tensors() {
  auto lock = locked();
  return detail::Backend::get().runtime().held_tensors();
}

void reset_peaks() {
  auto lock = locked();
  detail::Backend::get().runtime().reset_peaks();
}

std::size_t evict_all() {
  auto lock = locked();
  return detail::Backend::get().evict_all();
}

StepScope::StepScope() {
  auto lock = locked();
  detail::Backend::get().begin_step();
}

void StepScope::end() {
  if (ended_) return;
  ended_ = true;  // an ending that fails is not tried again
  auto lock = locked();
  detail::Backend::get().end_step();
}

StepScope::~StepScope() {
  try {
    end();
  } catch (const std::exception& e) {
    TORCH_WARN("remat_torch: ending the step failed: ", e.what(),
               " (StepScope::end() raises this as an exception)");
  } catch (...) {
    TORCH_WARN("remat_torch: ending the step failed (StepScope::end() raises the error)");
  }
}

}  // namespace remat::torch_backend
