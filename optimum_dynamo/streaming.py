"""Weights streamed from the checkpoint, for models bigger than the memory at hand.

The model is loaded with its parameters on the meta device, in the export dtype, and accelerate's disk-offload
hooks (transformers' `device_map` with every top-level module on "disk"; a safetensors checkpoint is read in
place, nothing is copied)
load each module's weights from the checkpoint just before the module runs and drop them after: the capture and
PyTorch's side of the validation run the real model one module's weights at a time. torch.export traces the
model with the hooks taken off (`hooks_off`: the weights are not read), and every ONNX initializer that is a
parameter becomes an `onnx_ir.LazyTensor` that reads its tensor from the checkpoint, in the export dtype, when
the save stage writes it: the weights are never all in memory.

When: the weights in the export dtype would take more than half the memory available to this process (the
cgroup's limit or the kernel's MemAvailable, whichever is smaller), or `OPTIMUM_DYNAMO_STREAM_WEIGHTS=1`
(`=0`: never).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Iterator

import onnx_ir as ir
import torch

from .errors import ExportError

ENV = "OPTIMUM_DYNAMO_STREAM_WEIGHTS"
SHARE = 0.5  # of the available memory the export-dtype weights may take before they are streamed
DISK = "every module on disk"  # `loading`'s device map, made per model class by `device_map`
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def available_memory() -> int:
    """Bytes this process may still use: the smaller of MemAvailable and its cgroup's limit (v1 or v2)."""
    found = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        found.append(int(Path("/proc/meminfo").read_text().split("MemAvailable:")[1].split()[0]) * 1024)
    for limit, usage in (("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
                         ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current")):
        with contextlib.suppress(OSError, ValueError):
            group = _own_cgroup(limit)
            found.append(int(Path(group[0]).read_text()) - int(Path(group[1]).read_text()))
    return min(found) if found else 0


def _own_cgroup(limit: str) -> tuple[str, str]:
    """(limit file, usage file) of the cgroup this process is in (v1 memory controller or v2)."""
    root = Path(limit).parent
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controllers == "memory" and "memory" in root.parts) or (controllers == "" and root == Path("/sys/fs/cgroup")):
            group = root / path.lstrip("/")
            return str(group / Path(limit).name), str(group / Path(_usage_name(limit)).name)
    raise ValueError("no memory cgroup")


def _usage_name(limit: str) -> str:
    return "memory.usage_in_bytes" if limit.endswith("limit_in_bytes") else "memory.current"


def checkpoint_parameters(model_id: str) -> dict[str, int]:
    """{safetensors dtype: elements} of a local checkpoint's weights, from the files' headers (nothing loaded);
    empty if the checkpoint is not a local safetensors one."""
    from safetensors import SafetensorError, safe_open

    counts: dict[str, int] = {}
    for path in sorted(Path(model_id).glob("*.safetensors")) if Path(model_id).is_dir() else ():
        with contextlib.suppress(OSError, SafetensorError), safe_open(str(path), "np") as f:
            for key in f.keys():
                tensor = f.get_slice(key)
                counts[tensor.get_dtype()] = counts.get(tensor.get_dtype(), 0) + math.prod(tensor.get_shape())
    return counts


def wanted(model_id: str, dtype: torch.dtype) -> bool:
    """Whether this export streams its weights (see the module's doc)."""
    forced = os.environ.get(ENV)
    if forced not in (None, "", "0", "1"):
        raise ExportError(f"invalid {ENV}={forced!r}: expected 1 or 0")
    if forced:
        return forced == "1"
    counts = checkpoint_parameters(model_id)
    floats = sum(n for k, n in counts.items() if k in ("F32", "F16", "BF16", "F64"))
    needed = floats * dtype.itemsize
    available = available_memory()
    return bool(needed and available and needed > SHARE * available)


def loading(dtype: torch.dtype, offload: Path) -> dict[str, Any]:
    """`from_pretrained` keywords of a streamed load (accelerate reads a safetensors checkpoint in place;
    `offload` holds what it cannot: other formats, weights transformers converts on load)."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise ExportError("streaming the weights of a model this big needs accelerate: pip install accelerate") from None
    offload.mkdir(parents=True, exist_ok=True)
    return_freed_blocks()
    return {"device_map": DISK, "offload_folder": str(offload), "dtype": dtype}


def return_freed_blocks() -> None:
    """glibc's malloc raises its mmap threshold each time a big block is freed, so the next weights (cast ones:
    a few MB to tens of MB) come from the heap, which fragments and keeps them: +900 MB measured over a 0.84B
    fp16 capture. A fixed threshold (4 MB) gives every streamed weight its own mapping, returned when freed."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c")).mallopt(M_MMAP_THRESHOLD, 4 * 2**20)


def device_map(model_class, config) -> dict[str, str]:
    """Every top-level module of the model on "disk" (transformers 4.57 refuses {"": "disk"} for a checkpoint
    of one file), from a skeleton built without weights."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        skeleton = model_class.from_config(config) if hasattr(model_class, "from_config") else model_class(config)
    names = [n for n, _ in skeleton.named_children()]
    names += [n for n, _ in skeleton.named_parameters(recurse=False)]
    return dict.fromkeys(names, "disk")


def is_streamed(model: torch.nn.Module) -> bool:
    return any(hasattr(m, "_hf_hook") for m in model.modules()) and any(p.is_meta for p in model.parameters())


@contextlib.contextmanager
def hooks_off(model: torch.nn.Module) -> Iterator[None]:
    """For torch.export: the offload hooks taken off, and each parameter on the meta device replaced by an
    uninitialized CPU tensor (never written: the kernel gives it no memory; the trace reads shapes only, and
    on the meta device the hidden states would meet the CPU's cache and masks); all put back after.
    A hook is accelerate's attributes on the instance (its wrapper `forward` over the `_old_forward` it saved):
    they are set aside, not detached, so the module runs its class's forward, with the export's patches."""
    if not is_streamed(model):
        yield
        return
    added = ("_hf_hook", "_old_forward", "forward")
    hooked = [(m, {k: m.__dict__.pop(k) for k in added if k in m.__dict__}) for m in model.modules() if hasattr(m, "_hf_hook")]
    swapped = [(m, name, p) for m in model.modules() for name, p in m._parameters.items() if p is not None and p.is_meta]
    for module, name, param in swapped:
        module._parameters[name] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype), requires_grad=False)
    try:
        yield
    finally:
        for module, name, param in swapped:
            module._parameters[name] = param
        for module, attributes in hooked:
            module.__dict__.update(attributes)


def alias_tied(model: torch.nn.Module) -> None:
    """A tied parameter (the head sharing the embedding's weight) is one tensor under two names; the checkpoint
    stores one of them (transformers 4.57 offloads the other with no entry: a KeyError when the head runs).
    The missing names read the stored one."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    loaders = {id(w.dataset): w.dataset for w in (getattr(getattr(m, "_hf_hook", None), "weights_map", None)
                                                 for m in model.modules()) if w is not None}
    for loader in loaders.values():
        index = getattr(loader, "index", None)
        for group in (g for g in names.values() if len(g) > 1 and index is not None):
            stored = [n for n in group if n in index or n in loader.state_dict]
            for name in (n for n in group if stored and n not in index and n not in loader.state_dict):
                if stored[0] in index:
                    index[name] = index[stored[0]]
                else:
                    loader.state_dict[name] = loader.state_dict[stored[0]]
                loader.all_keys.append(name)


def sources(model: torch.nn.Module) -> dict[str, Any]:
    """Parameter name -> the offload loader's key and loader, for every streamed parameter."""
    found = {}
    for prefix, module in model.named_modules():
        weights = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
        if weights is None:
            continue
        for name, param in module.named_parameters(recurse=False):
            if param.is_meta:
                found[f"{prefix}.{name}" if prefix else name] = (weights, name)
    return found


def attach(model: ir.Model, torch_model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Every initializer that is a streamed parameter reads its tensor from the checkpoint when written
    (in `dtype`); returns how many."""
    found = sources(torch_model)
    count = 0
    for name, value in model.graph.initializers.items():
        if name not in found or value.const_value is None:
            continue
        weights, key = found[name]
        shape = ir.Shape(value.const_value.shape)

        def read(weights=weights, key=key, shape=shape):
            tensor = weights[key].to(dtype).contiguous()
            if tuple(tensor.shape) != tuple(shape):
                raise ExportError(f"the checkpoint's {key} has shape {tuple(tensor.shape)}, the graph {tuple(shape)}")
            return ir.tensor(tensor.numpy() if dtype != torch.bfloat16 else tensor)

        value.const_value = ir.LazyTensor(read, dtype=value.const_value.dtype, shape=shape, name=name)
        count += 1
    return count


def cast_buffers(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Floating buffers in the export dtype, as `model.to(dtype)` makes them (parameters are cast on load)."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point() and not buffer.is_meta:
                module._buffers[name] = buffer.to(dtype)


__all__ = ["DISK", "ENV", "alias_tied", "attach", "available_memory", "cast_buffers", "checkpoint_parameters",
           "device_map", "hooks_off", "is_streamed", "loading", "return_freed_blocks", "sources", "wanted"]
