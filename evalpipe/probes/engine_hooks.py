"""Where the probes attach to vLLM and torch: model creation, forward passes, collectives.

- ``vllm.model_executor.model_loader.utils.initialize_model``: every model vLLM builds
  (the main model, a drafter), through whichever loader. The outermost call's model is
  recorded (class, decoder layers, attention backends), the switches are read from the
  ``vllm_config`` it was built with and from ``vllm.distributed`` (ranks), and its
  ``forward`` is wrapped to delimit forward passes.
- Collectives, each counted once at its outermost call (:mod:`evalpipe.probes.record`):
  torch.distributed's, vLLM's ``GroupCoordinator`` methods (named by their group: tp,
  dp, ep, pp, world; a group of one rank communicates nothing and counts as a call only)
  and the ``tensor_model_parallel_*`` wrappers.

Calls inside a compiled graph are not seen (a graph replay runs no Python); the configs
that shipped with evalpipe run eagerly. Standard library only: torch and vLLM are
reached through the modules they pass in.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

from evalpipe.probes.capture import TensorCapture, layers_module
from evalpipe.probes.collectives import GROUP_COLLECTIVES, TORCH_COLLECTIVES, TORCH_GROUP
from evalpipe.probes.patching import PostImportHooks, counting, resolve, wrap
from evalpipe.probes.record import ModelRecord, ProcessRecord, class_name, jsonable

# Switches every record holds: name -> attribute path in vllm_config.
STANDARD_SWITCHES = {
    "tensor_parallel_size": "parallel_config.tensor_parallel_size",
    "pipeline_parallel_size": "parallel_config.pipeline_parallel_size",
    "data_parallel_size": "parallel_config.data_parallel_size",
    # a dense model's DP ranks run as independent engines that each resolve data_parallel_size 1;
    # the index still says which DP rank an engine is
    "data_parallel_index": "parallel_config.data_parallel_index",
    "enable_expert_parallel": "parallel_config.enable_expert_parallel",
    "all2all_backend": "parallel_config.all2all_backend",
    "use_sequence_parallel_moe": "parallel_config.use_sequence_parallel_moe",
    "distributed_executor_backend": "parallel_config.distributed_executor_backend",
    "dtype": "model_config.dtype",
    "architectures": "model_config.hf_config.architectures",
    "quantization": "model_config.quantization",
    "enforce_eager": "model_config.enforce_eager",
    "max_num_seqs": "scheduler_config.max_num_seqs",
    "max_num_batched_tokens": "scheduler_config.max_num_batched_tokens",
    "enable_chunked_prefill": "scheduler_config.enable_chunked_prefill",
    "enable_prefix_caching": "cache_config.enable_prefix_caching",
    "compilation_mode": "compilation_config.mode",
    "cudagraph_mode": "compilation_config.cudagraph_mode",
    "additional_config": "additional_config",
    # how the engine samples (what a sampled comparison's common random numbers rest on,
    # docs/sampling.md): the model runner generation, what its logprobs are, speculation
    "use_v2_model_runner": "use_v2_model_runner",
    "logprobs_mode": "model_config.logprobs_mode",
    "speculative_config": "speculative_config",
    "seed": "model_config.seed",
}
# Read from the built model rather than the config. cpu_kernels: the kernels vLLM's CPU
# build chose by processor (attention ISA, GEMM), read at the first forward pass, once the
# attention metadata builder has set them; the same config picks AMX kernels on one x86
# kind and vector ones on another (docs/sp-moe.md#the-kernels-follow-the-processor).
MODEL_SWITCHES = ("attention_backends", "cpu_kernels")
# Ranks as vLLM's parallel state knows them: name -> (group getter, attribute).
RANKS = {
    "tp_rank": ("get_tp_group", "rank_in_group"),
    "pp_rank": ("get_pp_group", "rank_in_group"),
    "dp_rank": ("get_dp_group", "rank_in_group"),
    "ep_rank": ("get_ep_group", "rank_in_group"),
    "ep_size": ("get_ep_group", "world_size"),
    "world_rank": ("get_world_group", "rank_in_group"),
}

TP_WRAPPERS = {
    "tensor_model_parallel_all_reduce": "all_reduce",
    "tensor_model_parallel_all_gather": "all_gather",
    "tensor_model_parallel_reduce_scatter": "reduce_scatter",
    "tensor_model_parallel_gather": "gather",
}
INIT_MODULE = "vllm.model_executor.model_loader.utils"
GROUP_MODULE = "vllm.distributed.parallel_state"
TP_MODULE = "vllm.distributed.communication_op"
TORCH_MODULES = ("torch.distributed.distributed_c10d", "torch.distributed")


def attribute_path(root: Any, path: str) -> Any:
    value = root
    for part in path.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


class EngineHooks:
    def __init__(self, record: ProcessRecord, hooks: PostImportHooks, functions: list[dict[str, str]],
                 predicates: list[dict[str, str]], config_paths: list[str], capture: TensorCapture | None = None):
        self.record = record
        self.capture = capture
        self.hooks = hooks
        self.functions = functions
        self.predicates = predicates
        self.config_paths = config_paths
        self._building = 0

    def install(self) -> None:
        self.hooks.when_loaded("vllm", self._vllm_loaded)
        self.hooks.when_loaded(INIT_MODULE, self._hook_model_creation)
        self.hooks.when_loaded(GROUP_MODULE, self._hook_groups)
        self.hooks.when_loaded(TP_MODULE, self._hook_tp_wrappers)
        for module in TORCH_MODULES:
            self.hooks.when_loaded(module, self._hook_torch)
        for entry in self.functions:
            self.hooks.when_loaded(entry["module"], functools.partial(self._hook_function, entry=entry))

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def compiling() -> bool:
        torch = sys.modules.get("torch")
        compiler = getattr(torch, "compiler", None)
        check = getattr(compiler, "is_compiling", None)
        return bool(check()) if check is not None else False

    def _counted(self, owner: Any, attr: str, name: str, collective: Callable[[tuple], str | None] | None) -> None:
        record = self.record

        def enter(args: tuple, kwargs: dict) -> bool:
            return record.enter(name, collective(args) if collective else None, args, kwargs)

        try:
            wrap(owner, attr, lambda fn: counting(fn, enter, record.leave, self.compiling))
        except (AttributeError, TypeError) as err:
            record.absent[name] = str(err)

    def _vllm_loaded(self, _module: Any) -> None:
        self.record.vllm_loaded = True
        self.record.dirty = True

    # ------------------------------------------------------------------ configured functions

    def _hook_function(self, module: Any, entry: dict[str, str]) -> None:
        try:
            owner, attr = resolve(module, entry["attr"])
            getattr(owner, attr)
        except AttributeError as err:
            self.record.absent[entry["canonical"]] = f"{entry['module']} has no {entry['attr']} ({err})"
            return
        self._counted(owner, attr, entry["canonical"], None)

    # ------------------------------------------------------------------ collectives

    def _hook_torch(self, module: Any) -> None:
        for fn, kind in TORCH_COLLECTIVES.items():
            if hasattr(module, fn):
                self._counted(module, fn, f"{TORCH_MODULES[0]}.{fn}", functools.partial(_torch_collective, kind))

    def _hook_groups(self, module: Any) -> None:
        coordinator = getattr(module, "GroupCoordinator", None)
        if coordinator is None:
            self.record.errors.append(f"{GROUP_MODULE} has no GroupCoordinator: vLLM's group collectives are not counted")
            return
        for method, kind in GROUP_COLLECTIVES.items():
            if hasattr(coordinator, method):
                self._counted(coordinator, method, f"{GROUP_MODULE}.GroupCoordinator.{method}",
                              functools.partial(_group_collective, kind))

    def _hook_tp_wrappers(self, module: Any) -> None:
        for fn in TP_WRAPPERS:
            if hasattr(module, fn):
                self._counted(module, fn, f"{TP_MODULE}.{fn}", None)

    # ------------------------------------------------------------------ models

    def _hook_model_creation(self, module: Any) -> None:
        def make(initialize: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(initialize)
            def initialize_model(*args: Any, **kwargs: Any) -> Any:
                self._building += 1
                try:
                    model = initialize(*args, **kwargs)
                finally:
                    self._building -= 1
                if self._building == 0:  # a sub-model (a multimodal model's language model) is part of its parent
                    config = kwargs.get("vllm_config", args[0] if args else None)
                    try:
                        self.model_built(model, config)
                    except Exception as err:  # noqa: BLE001 - the engine goes on; the record says what failed
                        self.record.errors.append(f"recording the model failed: {type(err).__name__}: {err}")
                return model

            return initialize_model

        try:
            wrap(module, "initialize_model", make)
        except (AttributeError, TypeError) as err:
            self.record.errors.append(f"{INIT_MODULE}.initialize_model cannot be watched ({err}): no model recorded")

    def model_built(self, model: Any, vllm_config: Any) -> None:
        layers = decoder_layers(model)
        backends = sorted({_backend_name(m) for m in model.modules() if getattr(m, "attn_backend", None) is not None})
        entry = ModelRecord(class_name(type(model)), layers, backends)
        with self.record.lock:
            self.record.models.append(entry)
            self.record.switches["attention_backends"] = backends
        self._read_switches(vllm_config)
        if self.capture is not None and not getattr(type(model), "evalpipe_captures", False):
            switches = self.record.switches
            missing = self.capture.hook_model(model, int(switches.get("tp_rank") or 0),
                                              int(switches.get("tensor_parallel_size") or 1))
            self.record.errors.extend(f"capture: {m}" for m in missing)
        self._watch_forward(model, entry)
        self.record.write()

    def _read_switches(self, vllm_config: Any) -> None:
        found: dict[str, Any] = {}
        errors: dict[str, str] = {}
        paths = {**STANDARD_SWITCHES, **{p: p for p in self.config_paths}}
        for name, path in paths.items():
            try:
                found[name] = jsonable(attribute_path(vllm_config, path))
            except Exception as err:  # noqa: BLE001 - a field this vLLM does not have
                errors[name] = f"{type(err).__name__}: {err}"
        state = sys.modules.get(GROUP_MODULE)
        for name, (getter, attr) in RANKS.items():
            try:
                found[name] = int(getattr(getattr(state, getter)(), attr))
            except Exception:  # noqa: BLE001 - a group this deployment has not set up (EP without experts)
                pass
        for entry in self.predicates:
            key = entry["canonical"]
            try:
                owner, attr = resolve(importlib.import_module(entry["module"]), entry["attr"])
                found[key] = jsonable(getattr(owner, attr)())
            except Exception as err:  # noqa: BLE001 - recorded, judged by the expectation that names it
                errors[key] = f"{type(err).__name__}: {err}"
        with self.record.lock:
            self.record.switches.update(found)
            for name, why in errors.items():
                if name not in self.record.switches:
                    self.record.switch_errors[name] = why
            self.record.dirty = True

    def _watch_forward(self, model: Any, entry: ModelRecord) -> None:
        record = self.record
        capture = self.capture
        forward = model.forward

        kernels_read = False

        def probed_forward(*args: Any, **kwargs: Any) -> Any:
            nonlocal kernels_read
            if self.compiling():
                return forward(*args, **kwargs)
            if not kernels_read:
                kernels_read = True
                found = cpu_kernels(model)
                if found:
                    with record.lock:
                        record.switches["cpu_kernels"] = found
                        record.dirty = True
            snapshot = record.forward_started(entry, _tokens(args, kwargs))
            if capture is not None:
                capture.forward_started(_argument(args, kwargs, "input_ids", 0), _argument(args, kwargs, "positions", 1))
            try:
                out = forward(*args, **kwargs)
            except BaseException:
                record.forward_failed(entry, snapshot)
                raise
            finally:
                if capture is not None:
                    capture.forward_finished()
            record.forward_finished(entry, snapshot)
            return out

        model.forward = probed_forward  # nn.Module.__call__ looks the instance attribute up first


def _torch_collective(kind: str, _args: tuple) -> str:
    return f"{kind}@{TORCH_GROUP}"


def _group_collective(kind: str, args: tuple) -> str | None:
    group = args[0] if args else None
    if getattr(group, "world_size", 2) <= 1:
        return None  # vLLM returns the input unchanged: no communication
    name = str(getattr(group, "unique_name", "group")).partition(":")[0]
    return f"{kind}@{name}"


def _argument(args: tuple, kwargs: dict, name: str, index: int) -> Any:
    return kwargs.get(name, args[index] if len(args) > index else None)


def _tokens(args: tuple, kwargs: dict) -> int | None:
    """Tokens in this forward pass: the fewest that input_ids, positions and inputs_embeds
    (those given) hold, so a pass whose inputs are empty counts as empty; None: unknown."""
    lengths = []
    for key, index, axis in (("input_ids", 0, -1), ("positions", 1, -1), ("inputs_embeds", 3, 0)):
        value = kwargs.get(key, args[index] if len(args) > index else None)
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape):
            lengths.append(int(shape[axis]))
    return min(lengths) if lengths else None


def decoder_layers(model: Any) -> dict[str, int]:
    """Class -> count of the decoder layers: the children of the first ModuleList named
    ``layers`` (vLLM's convention), pipeline-parallel placeholders left out."""
    module = layers_module(model)
    counts: dict[str, int] = {}
    for layer in module if module is not None else ():
        if type(layer).__name__ != "PPMissingLayer":
            key = class_name(type(layer))
            counts[key] = counts.get(key, 0) + 1
    return counts


def _backend_name(module: Any) -> str:
    backend = module.attn_backend
    get_name = getattr(backend, "get_name", None)
    try:
        return str(get_name()) if callable(get_name) else str(backend)
    except Exception:  # noqa: BLE001
        return getattr(backend, "__name__", str(backend))


def cpu_kernels(model: Any) -> dict[str, list[str]]:
    """The processor-chosen kernels of vLLM's CPU build in ``model``: the attention layers'
    ISA (``amx``, ``vec``, ``vec16``, ...) and the GEMM each linear layer dispatches to
    (``onednn_mm``, ``weight_packed_linear_cpu`` ...); empty on other platforms."""
    isa: set[str] = set()
    linear: set[str] = set()
    for module in model.modules():
        value = getattr(module, "isa", None)
        if isinstance(value, str):
            isa.add(value)
        gemm = getattr(module, "cpu_linear", None)
        if callable(gemm):
            linear.add(_kernel_name(gemm))
    return {key: sorted(names) for key, names in (("attention_isa", isa), ("linear", linear)) if names}


def _kernel_name(fn: Any) -> str:
    name = str(getattr(fn, "__name__", type(fn).__name__))
    code = getattr(fn, "__code__", None)
    if name == "<lambda>" and code is not None:
        # vLLM binds each layer's GEMM as a lambda over one op: name the op it calls
        called = [n for n in code.co_names if n != "ops"]
        return called[-1] if called else name
    return name
