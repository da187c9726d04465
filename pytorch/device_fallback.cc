// The boxed fallback of the PrivateUse1 key: every torch operator on remat's device.
//
// A call is one of four kinds, by its schema (Note [Running torch operators as remat ops]):
//   views     every result aliases an argument and nothing is written: torch metadata only,
//             from the operator's meta kernel, on the argument's storage;
//   compute   fresh results and/or written arguments: one remat op (call_with, update or
//             call_accumulate), the layouts from the meta kernel;
//   eager     results that are not tensors (`item`, `equal`), results whose shape depends on
//             the data (`nonzero`), written CPU tensors, or no meta kernel: the CPU kernel runs
//             once inside a remat op that holds the inputs, and tensor results become a remat
//             op whose first run takes them and whose recomputations run the kernel again;
//   metadata  in-place views and `_to_copy` between the CPU and the device (device_ops.cc).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "pytorch/detail/cpu_allocator_bridge.h"
#include "pytorch/detail/device_ops.h"
#include "pytorch/detail/op_work.h"
#include "pytorch/detail/torch_call.h"

namespace remat::torch_backend::detail {
namespace {

// An operator or a use of one remat cannot run: Python's NotImplementedError, naming it.
[[noreturn]] void unsupported(const std::string& what) { TORCH_CHECK_NOT_IMPLEMENTED(false, what); }

enum class ReturnKind { kFresh, kWritten, kView, kValue };
struct ReturnPlan {
  ReturnKind kind = ReturnKind::kValue;
  int arg = -1;  // kWritten, kView: the argument it aliases
};

bool holds_tensors(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) return holds_tensors(opt->getElementType());
  if (auto list = type->cast<c10::ListType>()) return holds_tensors(list->getElementType());
  return false;
}

// Note [Views the schema does not declare]
// `_unsafe_view` returns a tensor on its argument's storage, but its schema declares no
// alias, so that autograd treats the result as a tensor of its own (matmul ends with it, on
// a result nobody else holds). Taken at its schema's word it would be a fresh result: a copy
// of every linear layer's output, made and kept beside it. It is run as the view it is, on
// the argument's storage, as the CPU runs it; autograd still sees no view.
bool is_undeclared_view(const c10::FunctionSchema& schema) {
  return schema.name() == "aten::_unsafe_view";
}

std::vector<ReturnPlan> plan_returns(const c10::FunctionSchema& schema) {
  if (is_undeclared_view(schema)) return {ReturnPlan{ReturnKind::kView, 0}};
  std::vector<ReturnPlan> plans;
  for (const c10::Argument& r : schema.returns()) {
    ReturnPlan plan;
    if (!holds_tensors(r.type())) {
      plans.push_back(plan);
      continue;
    }
    plan.kind = ReturnKind::kFresh;
    if (const c10::AliasInfo* info = r.alias_info(); info != nullptr) {
      // A list of views (`split`) carries its alias set on its elements.
      if (info->beforeSets().empty() && !info->containedTypes().empty())
        info = &info->containedTypes()[0];
      for (std::size_t a = 0; a < schema.arguments().size() && plan.arg < 0; ++a) {
        const c10::AliasInfo* arg = schema.arguments()[a].alias_info();
        if (arg == nullptr) continue;
        for (const c10::Symbol& set : info->beforeSets())
          if (arg->beforeSets().count(set) != 0) plan.arg = static_cast<int>(a);
      }
      plan.kind = info->isWrite() ? ReturnKind::kWritten : ReturnKind::kView;
      if (plan.arg < 0)
        unsupported("remat_torch: " + schema.name() + " returns an alias of no argument");
    }
    plans.push_back(plan);
  }
  return plans;
}

bool any_of(const std::vector<ReturnPlan>& plans, ReturnKind kind) {
  for (const ReturnPlan& p : plans)
    if (p.kind == kind) return true;
  return false;
}

std::string op_name(const c10::OperatorHandle& op) {
  return qualified_name(op.schema().operator_name());
}

// Note [Meta results are remembered]
// The layouts of a call's results come from the operator's meta kernel, which for many
// operators is Python (torch._meta_registrations) and costs as much as a small kernel. What it
// returns depends on the call's signature only (the operator, its tensors' layouts and its
// other arguments; data-dependent operators never get here), so it is kept per signature:
// a training loop's later steps make the same calls and skip it.
//
// Runs the operator on meta tensors; nullopt where it has no meta kernel.
std::optional<torch::jit::Stack> run_on_meta(const TorchCall& call) {
  Backend& backend = Backend::get();
  if (const auto* known = backend.meta_results(call.signature)) return *known;
  torch::jit::Stack stack = call.meta_arguments();
  try {
    call.op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const c10::Error&) {  // NotImplementedError among them: no meta kernel
    return std::nullopt;
  }
  backend.remember_meta_results(call.signature, stack);
  return stack;
}

void set_fresh_layouts(TorchCall& call, const std::vector<at::Tensor>& results) {
  for (const at::Tensor& t : results) {
    if (t.defined() && t.layout() != c10::kStrided)
      unsupported("remat_torch: " + op_name(call.op) + " makes a " + c10::str(t.layout()) +
                  " tensor; remat keeps strided tensors only");
    if (!t.defined()) {
      call.fresh.push_back(Layout{});
      call.fresh_bytes.push_back(1);
      continue;
    }
    Layout layout = Layout::of(t);
    std::size_t bytes = std::max(layout.extent_bytes(), t.storage().nbytes());
    call.fresh.push_back(std::move(layout));
    call.fresh_bytes.push_back(std::max<std::size_t>(bytes, 1));
  }
}

Outputs fresh_outputs(const TorchCall& call) {
  Outputs outputs;
  for (std::size_t bytes : call.fresh_bytes) outputs.emplace_back(storage_spec(bytes));
  return outputs;
}

// The scratch to declare: what a call of the same signature asked for before; none before
// the first, whose temporaries come from the runtime one by one as the kernel asks.
std::size_t scratch_to_declare(const TorchCall& call) {
  return Backend::get().scratch_estimate(call.signature).value_or(0);
}

// The cost a call's op is registered with: estimated (Note [Costs without a clock]), else
// the one remembered for its signature (Note [Costs are remembered]), else -1: the runtime
// times its first run.
double cost_of(const TorchCall& call) {
  if (Backend::get().estimated_costs()) return Roofline::cpu().price(estimated_work(call));
  return Backend::get().cost_estimate(call.signature).value_or(-1.0);
}

// `cost`: cost_of(*call), which the caller also gives call_with.
OpPtr remat_op(const std::shared_ptr<TorchCall>& call, Outputs fresh, double cost) {
  auto def = std::make_shared<OpDef>();
  def->name = op_name(call->op);
  def->infer = [fresh = std::move(fresh)](SpecList) { return fresh; };
  def->kernel = [call](const KernelContext& ctx) { call->run(ctx); };
  call->declared_scratch = scratch_to_declare(*call);
  if (call->declared_scratch > 0)
    def->scratch_bytes = [bytes = call->declared_scratch](SpecList) { return bytes; };
  // Note [Costs are remembered]
  // Under set_costs("measured") (estimated by default: Note [Costs without a clock]), an op
  // the runtime times itself costs what its first run took, and that varies by tens
  // of percent between steps on a loaded CPU; DTR's scores, and so its evictions, would vary
  // with it. A signature's cost is the median of its first three runs (Backend::note_run),
  // then fixed: the same price for every call of it, step after step.
  if (cost >= 0) def->cost = [cost](SpecList) { return cost; };
  return def;
}

// The meta results with each fresh tensor in the layout `call` now has for it (Note [Results
// take the CPU kernel's layouts]).
torch::jit::Stack relaid_meta(const TorchCall& call, const torch::jit::Stack& meta) {
  torch::jit::Stack out;
  const auto& returns = call.op.schema().returns();
  std::size_t next = 0;
  for (std::size_t r = 0; r < meta.size(); ++r) {
    if (r < returns.size() && returns[r].alias_info() != nullptr) {
      out.push_back(meta[r]);
      continue;
    }
    out.push_back(map_tensors(
        meta[r],
        [&](const at::Tensor& t) {
          const std::size_t i = next++;
          return t.defined() ? call.fresh[i].on_meta(call.fresh_bytes[i]) : t;
        },
        c10::Device(c10::kMeta)));
  }
  return out;
}

// Pushes the results: fresh tensors from `made` (in order), written arguments as they were.
void push_results(const TorchCall& call, const std::vector<ReturnPlan>& plans,
                  const std::vector<c10::IValue>& arguments, const std::vector<Tensor>& made,
                  bool pinned, const std::vector<c10::IValue>& like, torch::jit::Stack& stack) {
  std::size_t next = 0;
  for (std::size_t r = 0; r < plans.size(); ++r) {
    if (plans[r].kind == ReturnKind::kWritten) {
      stack.push_back(arguments[static_cast<std::size_t>(plans[r].arg)]);
      continue;
    }
    if (plans[r].kind == ReturnKind::kValue) {
      stack.push_back(like[r]);
      continue;
    }
    stack.push_back(map_tensors(
        like[r],
        [&](const at::Tensor& t) {
          const std::size_t i = next++;
          if (!t.defined()) return at::Tensor();
          return device_tensor(make_storage(made[i], call.fresh_bytes[i], pinned), call.fresh[i]);
        },
        c10::Device(c10::kCPU)));
  }
}

std::vector<int> written_inputs(const TorchCall& call) {
  std::vector<int> written;
  for (const TensorArg& arg : call.tensors) {
    if (!arg.written || arg.kind != TensorArg::Kind::kDevice) continue;
    if (std::find(written.begin(), written.end(), arg.input) == written.end())
      written.push_back(arg.input);
  }
  return written;
}

bool writes_cpu_tensor(const TorchCall& call) {
  for (const TensorArg& arg : call.tensors)
    if (arg.written && arg.kind == TensorArg::Kind::kLiteral) return true;
  return false;
}

// Note [State is pinned]
// An activation written in place (`relu_`, a residual `add_`) gets a new version
// (copy-on-write), so that what read the old one recomputes from it. Optimizer state cannot
// work that way: a momentum buffer written every step would chain each step's version to
// the last, and a buffer made by an op (`clone` of a gradient) would keep that gradient, and
// through it the step, alive for as long as the buffer lives. Nothing made outside autograd
// is recomputed in a training loop anyway. So outside autograd (grad mode off, and not
// inside a backward pass, whose gradients are activations of their own) a call's fresh
// results are new constants of the runtime, pinned, which the call writes as an update, and
// a storage it writes is made a constant first (one copy, at its first such write) and then
// written in place, as parameters and buffers moved to the device are.
bool outside_autograd(bool in_backward) { return !in_backward && !c10::GradMode::is_enabled(); }

void pin_written(TorchCall& call, Runtime& rt) {
  for (int i : call.written_inputs) {
    RematStorage* s = call.input_storages[static_cast<std::size_t>(i)];
    if (s->pinned) continue;
    pin_storage(*s, rt);
    call.inputs[static_cast<std::size_t>(i)] = s->tensor;
  }
}

// Outside autograd: the fresh results are new constants, written with the others in place.
std::vector<Tensor> run_as_update(const std::shared_ptr<TorchCall>& call, const OpPtr& def,
                                  Runtime& rt) {
  pin_written(*call, rt);
  std::vector<int> mutated;
  std::vector<Tensor> made;
  for (std::size_t bytes : call->fresh_bytes) {
    mutated.push_back(static_cast<int>(call->inputs.size()));
    made.push_back(rt.constant(storage_spec(bytes)));
    call->inputs.push_back(made.back());
  }
  mutated.insert(mutated.end(), call->written_inputs.begin(), call->written_inputs.end());
  rt.update(def, call->inputs, mutated);
  return made;
}

// Runs the call as a remat op: fresh results, and writes copy-on-write or in place (or,
// `outside` autograd, as an update).
std::vector<Tensor> run_compute(const std::shared_ptr<TorchCall>& call, bool outside, Runtime& rt) {
  Outputs outputs = fresh_outputs(*call);
  const double cost = cost_of(*call);
  OpPtr def = remat_op(call, outputs, cost);
  if (outside) return run_as_update(call, def, rt);
  if (call->written_inputs.empty()) return rt.call_with(def, call->inputs, outputs, cost);
  std::size_t pinned = 0;
  for (int i : call->written_inputs)
    pinned += call->input_storages[static_cast<std::size_t>(i)]->pinned ? 1 : 0;
  if (pinned == call->written_inputs.size()) {
    if (call->fresh.empty()) {
      rt.update(def, call->inputs, call->written_inputs);
      return {};
    }
    return rt.call_accumulate(def, call->inputs, call->written_inputs);
  }
  if (pinned != 0)
    unsupported("remat_torch: " + def->name +
                " writes a parameter or buffer and an activation in one call");
  for (int i : call->written_inputs) {
    OutputSpec version(call->inputs[static_cast<std::size_t>(i)].spec());
    version.copy_of = i;
    outputs.push_back(std::move(version));
  }
  std::vector<Tensor> made = rt.call_with(def, call->inputs, outputs, cost);
  for (std::size_t k = 0; k < call->written_inputs.size(); ++k) {
    const auto i = static_cast<std::size_t>(call->written_inputs[k]);
    call->input_storages[i]->tensor = made[call->fresh.size() + k];
  }
  made.resize(call->fresh.size());
  return made;
}

// Runs the CPU kernel once inside a remat op that holds the inputs resident; returns what
// it returned.
std::vector<c10::IValue> run_held(const std::shared_ptr<TorchCall>& call, Runtime& rt) {
  struct Run {
    std::vector<c10::IValue> results;
    bool ran = false;
  };
  auto run = std::make_shared<Run>();
  auto holder = std::make_shared<OpDef>();
  holder->name = op_name(call->op);
  holder->kernel = [call, run](const KernelContext& ctx) {
    if (run->ran) return;  // its results were taken; nothing reads its output
    run->results = call->run_eagerly(ctx);
    run->ran = true;
  };
  Backend::get().note_runs_when_called(holder->name);
  const Outputs one_byte{OutputSpec(storage_spec(1))};
  const std::vector<Tensor> held = rt.call_with(holder, call->inputs, one_byte, cost_of(*call));
  if (!run->ran) rt.materialize(held.front());  // deferred by a followed plan: run it now
  return std::move(run->results);
}

// Note [Random operators run when called]
// A followed plan may defer an op until the plan's schedule reaches it (Note [Following a
// schedule]). A random operator draws from torch's generator, whose state is what the
// program's earlier draws left; run later, it would draw what a later operator should. So a
// deferred random operator runs as soon as it is called; its recomputations replay the
// generator's state from its call.
void run_now_if_random(const TorchCall& call, const std::vector<Tensor>& made, Runtime& rt) {
  if (!call.rng.has_value() || call.ran) return;
  if (!made.empty()) {
    rt.materialize(made.front());
  } else if (!call.written_inputs.empty()) {  // an in-place draw: the new version
    rt.materialize(call.input_storages[static_cast<std::size_t>(call.written_inputs[0])]->tensor);
  }
}

void run_eager(const std::shared_ptr<TorchCall>& call, const std::vector<ReturnPlan>& plans,
               const std::vector<c10::IValue>& arguments, Runtime& rt, torch::jit::Stack& stack) {
  if (!call->written_inputs.empty())
    unsupported("remat_torch: " + op_name(call->op) +
                " writes a device tensor and has no meta kernel, or returns "
                "values that depend on the data; not supported on remat");
  std::vector<c10::IValue> results = run_held(call, rt);
  std::vector<Tensor> made;
  if (any_of(plans, ReturnKind::kFresh)) {
    set_fresh_layouts(*call, fresh_results(call->op.schema(), results));
    call->first_results = results;
    Outputs outputs = fresh_outputs(*call);
    const double cost = cost_of(*call);
    made = rt.call_with(remat_op(call, outputs, cost), call->inputs, outputs, cost);
  }
  call->forget_inputs();
  push_results(*call, plans, arguments, made, /*pinned=*/false, results, stack);
}

void run_views(const TorchCall& call, const std::vector<ReturnPlan>& plans,
               const std::vector<c10::IValue>& arguments, torch::jit::Stack& stack) {
  std::optional<torch::jit::Stack> meta = run_on_meta(call);
  if (!meta.has_value())
    unsupported("remat_torch: the view " + op_name(call.op) +
                " has no meta kernel; not supported on remat");
  for (std::size_t r = 0; r < plans.size(); ++r) {
    const c10::IValue& base = arguments[static_cast<std::size_t>(plans[r].arg)];
    if (!base.isTensor())
      unsupported("remat_torch: the view " + op_name(call.op) +
                  " aliases a list; not supported on remat");
    const c10::Storage& storage = base.toTensor().storage();
    stack.push_back(map_tensors(
        (*meta)[r], [&](const at::Tensor& t) { return device_tensor(storage, Layout::of(t)); },
        c10::Device(c10::kCPU)));
  }
}

// Note [Hidden writes]
// A few schemas do not say what they write: native_batch_norm in training updates
// running_mean and running_var in place. Left unsaid, a recomputation would update them a
// second time; marked, they are written as constants are (Runtime::call_accumulate), which a
// recomputation writes into scratch instead.
void mark_hidden_writes(TorchCall& call) {
  if (call.op.schema().name() != "aten::native_batch_norm" || !call.values[5].toBool()) return;
  for (TensorArg& arg : call.tensors)
    if (arg.argument == 3 || arg.argument == 4) arg.written = arg.kind == TensorArg::Kind::kDevice;
}

// `outside`: outside_autograd, where fresh results are pinned constants.
void run_call(const c10::OperatorHandle& op, torch::jit::Stack& stack, bool outside, Runtime& rt) {
  const std::vector<ReturnPlan> plans = plan_returns(op.schema());
  auto call = std::make_shared<TorchCall>(op);
  std::vector<c10::IValue> arguments = call->capture(stack, rt);
  mark_hidden_writes(*call);
  call->written_inputs = written_inputs(*call);
  if (op.hasTag(at::Tag::nondeterministic_seeded)) {
    at::Generator gen = Backend::get().execution().generator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    call->rng = gen.clone();
    Backend::get().note_runs_when_called(op_name(op));
  }
  const bool views_only = !plans.empty() && !any_of(plans, ReturnKind::kFresh) &&
                          !any_of(plans, ReturnKind::kWritten) &&
                          !any_of(plans, ReturnKind::kValue);
  if (views_only && call->written_inputs.empty()) return run_views(*call, plans, arguments, stack);
  if (any_of(plans, ReturnKind::kView))
    unsupported("remat_torch: " + op_name(op) +
                " returns a view beside other results; not supported on remat");
  std::optional<torch::jit::Stack> meta;
  if (!any_of(plans, ReturnKind::kValue) && !op.hasTag(at::Tag::dynamic_output_shape) &&
      !writes_cpu_tensor(*call))
    meta = run_on_meta(*call);
  if (!meta.has_value()) return run_eager(call, plans, arguments, rt, stack);
  set_fresh_layouts(*call, fresh_results(op.schema(), *meta));
  std::vector<Tensor> made = run_compute(call, outside, rt);
  run_now_if_random(*call, made, rt);
  if (call->relaid) {
    meta = relaid_meta(*call, *meta);
    Backend::get().remember_meta_results(call->signature, *meta);
  }
  call->published = true;
  call->forget_inputs();
  push_results(*call, plans, arguments, made, outside, *meta, stack);
}

}  // namespace

void device_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  Backend& backend = Backend::get();
  std::lock_guard<std::recursive_mutex> lock(backend.mutex());
  install_cpu_allocator_bridge();
  const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
  const bool outside = outside_autograd(in_backward);
  backend.note_call(in_backward, outside);
  if (op.schema().name() == "aten::_to_copy" && run_to_copy(op, *stack)) return;
  if (op.schema().name() == "aten::set_") return run_set(op, *stack);
  if (op.schema().name() == "aten::is_set_to") return run_is_set_to(op, *stack);
  if (op.hasTag(at::Tag::inplace_view) || op.schema().name() == "aten::resize_")
    return run_inplace_view(op, *stack);
  run_call(op, *stack, outside, backend.runtime());
}

}  // namespace remat::torch_backend::detail

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(
      torch::CppFunction::makeFromBoxedFunction<&remat::torch_backend::detail::device_fallback>());
}
