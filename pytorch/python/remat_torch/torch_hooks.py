"""What remat_torch.compile needs of the torch it runs on, checked when it is first used.

The partitioner reaches into Inductor and AOTAutograd internals (the custom partitioner
option, a post-fusion scheduler pass, PyTorch's own extraction of the two graphs, the
scheduler's memory timeline, the wrapper's planned buffer reuse). A torch without one of
them fails here, naming each missing piece and the torch version, instead of with an
AttributeError deep inside a compilation.
"""
import torch

# module -> the names the partitioner and the kernel check use from it
REQUIRED = {
    "torch._inductor.config": (
        "custom_partitioner_fn", "_post_fusion_custom_pass", "layout_optimization",
        "allow_buffer_reuse", "reorder_for_peak_memory", "fallback_random", "cpu_backend"),
    "torch._inductor.custom_graph_pass": ("CustomPartitionerFn", "CustomSchedulerPass"),
    "torch._inductor.memory": (
        "prepare_planning_info", "compute_memory_timeline", "reorder_for_peak_memory"),
    "torch._inductor.scheduler": (
        "SchedulerNode", "ExternKernelSchedulerNode", "NopKernelSchedulerNode"),
    "torch._inductor.codegen.wrapper": (
        "PythonWrapperCodegen.memory_plan_reuse", "EfficientPeakEstimate.peak_between",
        "EfficientPeakEstimate.update_peak_between", "EfficientPeakEstimate._get_size",
        "FreeIfNotReusedLine", "ReuseLine"),
    "torch._inductor.graph": ("get_donated_idxs",),
    "torch._inductor.ir": ("NonOwningLayout",),
    "torch._functorch.config": (
        "force_non_lazy_backward_lowering", "activation_memory_budget", "donated_buffer"),
    "torch._functorch._aot_autograd.graph_compile": ("collect_fw_donated_buffer_idxs",),
    "torch._functorch.partitioners": (
        "_extract_fwd_bwd_modules", "_extract_fwd_bwd_outputs", "classify_nodes",
        "default_partition", "min_cut_rematerialization_partition", "cleanup_recompute_tags",
        "has_recomputable_ops", "force_save_collectives", "force_save_effectful_ops",
        "force_save_bw_mutation_src", "is_rng_op", "_must_be_in_forward",
        "is_not_collective", "is_sym_node"),
}


class TorchTooOld(ImportError):
    """The torch in use lacks what remat_torch.compile needs."""


def missing_hooks(modules):
    """The `module.name`s of REQUIRED that `modules` (module name -> module, or None where
    it does not import) lack."""
    missing = []
    for module_name, names in REQUIRED.items():
        module = modules.get(module_name)
        missing += [f"{module_name}.{name}" for name in names
                    if module is None or not _has(module, name)]
    return missing


def _has(owner, dotted):
    """Whether `owner` has the attribute path `dotted` ('Class.method')."""
    for part in dotted.split("."):
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def require_compile_hooks(modules=None, version=None):
    """Raises TorchTooOld unless every piece in REQUIRED is there."""
    import importlib
    if modules is None:
        modules = {}
        for name in REQUIRED:
            try:
                modules[name] = importlib.import_module(name)
            except ImportError:
                modules[name] = None
    missing = missing_hooks(modules)
    if missing:
        raise TorchTooOld(
            "remat_torch.compile needs a torch whose Inductor takes a custom partitioner "
            "and a post-fusion pass (the tested torch is 2.15); torch "
            f"{version or torch.__version__} lacks {', '.join(missing)}")
