"""Weights streamed from the checkpoint, for models bigger than the memory at hand.

The model is loaded with its parameters on the meta device, in the export dtype, and accelerate's disk-offload
hooks (transformers' `device_map` with every top-level module on "disk"; a safetensors checkpoint is read in
place, nothing is copied)
load each module's weights from the checkpoint just before the module runs and drop them after: the capture and
PyTorch's side of the validation run the real model one module's weights at a time. torch.export traces the
model with the hooks taken off (`hooks_off`: the weights are not read), and every ONNX initializer that is a
parameter becomes an `onnx_ir.LazyTensor` that reads its tensor from the checkpoint, in the export dtype, when
the save stage writes it: the weights are never all in memory.

When: the weights in the export dtype take 1 GiB or more, or more than half the memory available to this
process (the cgroup's limit or the kernel's MemAvailable, whichever is smaller), read from the checkpoint's
safetensors headers (a local directory, a hub id's snapshot in the local cache, else the hub's headers);
`OPTIMUM_DYNAMO_STREAM_WEIGHTS=1`: always, `=0`: never.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx_ir as ir
import torch

from .errors import ExportError

ENV = "OPTIMUM_DYNAMO_STREAM_WEIGHTS"
SHARE = 0.5  # of the available memory the export-dtype weights may take before they are streamed
SIZE = 2**30  # export-dtype weights that stream whatever the memory (0.84B: 0.34x the memory, no slower)
DISK = "every module on disk"  # `loading`'s device map, made per model class by `device_map`
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
BLOCK = 64 * 2**20  # bytes of a tensor written at once (`CheckpointTensor`)


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


def checkpoint_parameters(model_id: str, hub: dict[str, Any] | None = None) -> dict[str, int]:
    """{safetensors dtype: elements} of a checkpoint's weights, from the files' headers (nothing loaded): a local
    directory, a hub id's snapshot in the local cache, else the hub's headers (`hub`: `from_pretrained`'s download
    options); empty if none can be read."""
    from safetensors import SafetensorError, safe_open

    hub = {k: v for k, v in (hub or {}).items() if k in ("cache_dir", "revision", "token", "subfolder")}
    directory = local_checkpoint(model_id, hub)
    files = weight_files(directory) if directory is not None else []
    if not files and not Path(model_id).is_dir():  # not cached yet, or only its config (read first)
        return _hub_parameters(model_id, hub)
    counts: dict[str, int] = {}
    for path in files:
        with contextlib.suppress(OSError, SafetensorError), safe_open(str(path), "np") as f:
            for key in f.keys():
                tensor = f.get_slice(key)
                counts[tensor.get_dtype()] = counts.get(tensor.get_dtype(), 0) + math.prod(tensor.get_shape())
    return counts


def local_checkpoint(model_id: str, hub: dict[str, Any]) -> Path | None:
    """The directory of a local checkpoint or of a hub id's cached snapshot (None if not cached)."""
    if Path(model_id).is_dir():
        return Path(model_id) / hub.get("subfolder", "")
    from huggingface_hub import snapshot_download

    try:
        snapshot = snapshot_download(model_id, revision=hub.get("revision"), cache_dir=hub.get("cache_dir"),
                                     local_files_only=True)
    except Exception:  # not in the cache (or not a hub id)
        return None
    return Path(snapshot) / hub.get("subfolder", "")


def _hub_parameters(model_id: str, hub: dict[str, Any]) -> dict[str, int]:
    """The hub's count from the safetensors headers (a few small range requests); empty offline or on error."""
    from huggingface_hub import get_safetensors_metadata

    if hub.get("subfolder"):
        return {}
    try:
        found = get_safetensors_metadata(model_id, revision=hub.get("revision"), token=hub.get("token"))
    except Exception:
        return {}
    return dict(found.parameter_count)


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files `from_pretrained` reads: the index's shards, else model.safetensors, else every
    *.safetensors (repositories also ship other weight files, e.g. Mistral's consolidated.safetensors)."""
    index = directory / "model.safetensors.index.json"
    with contextlib.suppress(OSError, ValueError, KeyError, AttributeError):
        shards = [directory / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        return shards if all(shard.is_file() for shard in shards) else []  # a partial download: the hub's count
    single = directory / "model.safetensors"
    return [single] if single.is_file() else sorted(directory.glob("*.safetensors"))


def forced() -> bool | None:
    """`OPTIMUM_DYNAMO_STREAM_WEIGHTS`: True (=1), False (=0), None (unset: decided by size)."""
    value = os.environ.get(ENV)
    if value not in (None, "", "0", "1"):
        raise ExportError(f"invalid {ENV}={value!r}: expected 1 or 0")
    return None if not value else value == "1"


def export_bytes(model_id: str, dtype: torch.dtype, hub: dict[str, Any] | None = None) -> int:
    """Bytes of the checkpoint's floating weights in the export dtype (0 if unknown)."""
    counts = checkpoint_parameters(model_id, hub)
    return sum(n for k, n in counts.items() if k in ("F32", "F16", "BF16", "F64")) * dtype.itemsize


def fits_in_memory(needed: int) -> bool:
    """Whether `needed` bytes of weights leave half the memory available to this process."""
    available = available_memory()
    return not (needed and available and needed > SHARE * available)


def wanted(needed: int) -> bool:
    """Whether an export of `needed` bytes of weights (`export_bytes`) streams them (see the module's doc)."""
    if (switch := forced()) is not None:
        return switch
    return needed >= SIZE or not fits_in_memory(needed)


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
    swapped = [(m, name, p) for m in model.modules() for name, p in m._parameters.items() if p is not None and p.is_meta]
    stand_ins: dict[Any, torch.nn.Parameter] = {}  # a tied weight stays one tensor, as in memory
    for module, name, param in swapped:
        key = _stored_as(module, name, param)
        if key not in stand_ins:
            stand_ins[key] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype), requires_grad=False)
        module._parameters[name] = stand_ins[key]
    added = ("_hf_hook", "_old_forward", "forward")
    hooked = [(m, {k: m.__dict__.pop(k) for k in added if k in m.__dict__}) for m in model.modules() if hasattr(m, "_hf_hook")]
    try:
        yield
    finally:
        for module, name, param in swapped:
            module._parameters[name] = param
        for module, attributes in hooked:
            module.__dict__.update(attributes)


def _stored_as(module: torch.nn.Module, name: str, param: torch.nn.Parameter) -> Any:
    """What a parameter reads: its checkpoint file and tensor name (tied ones read the same, `alias_tied`; the
    hooks make a new meta parameter per module after each call, so identity no longer tells), else itself."""
    return _stored_in(getattr(getattr(module, "_hf_hook", None), "weights_map", None), name) or id(param)


def _stored_in(weights: Any, name: str) -> tuple[str, str] | None:
    """(safetensors file, tensor name) of `name` in an offload hook's weights map, if a safetensors file has it."""
    entry = getattr(getattr(weights, "dataset", None), "index", {}).get(f"{getattr(weights, 'prefix', '')}{name}")
    if entry and "safetensors_file" in entry:
        return entry["safetensors_file"], entry.get("weight_name")
    return None


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


def read_outside_its_module(error: BaseException) -> bool:
    """Whether `error` is a streamed (meta) weight read outside its module's forward, where no hook loads it."""
    return isinstance(error, RuntimeError) and "device meta" in str(error)


def keep_input_embedding(model: torch.nn.Module) -> int:
    """The input embedding's weights loaded and kept in memory, its offload hook removed (for models that read rows
    of it outside its own forward, as Gemma 4 takes its pad token's row). A head tied to it gets the same tensor
    (one initializer, as in memory). Returns the bytes kept (0: nothing was streamed there)."""
    from accelerate.hooks import remove_hook_from_module

    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return 0
    if not hasattr(embedding, "_hf_hook"):
        return 0
    own = {_stored_as(embedding, name, param): name for name, param in embedding.named_parameters(recurse=False)}
    tied = [(module, [(name, own[key]) for name, param in module.named_parameters(recurse=False)
                      if (key := _stored_as(module, name, param)) in own])
            for module in model.modules() if module is not embedding and hasattr(module, "_hf_hook")]
    tied = [(module, names) for module, names in tied if names]
    embedding._hf_hook.pre_forward(embedding)
    remove_hook_from_module(embedding)
    for module, names in tied:
        if len(names) < len(list(module.parameters(recurse=False))):  # its own weights beside the tied ones
            module._hf_hook.pre_forward(module)
        remove_hook_from_module(module)  # a head of the tied weight alone is not read from the checkpoint again
        for name, source in names:
            module._parameters[name] = embedding._parameters[source]
    return sum(p.nbytes for p in embedding.parameters(recurse=False))


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


class CheckpointTensor(ir.LazyTensor):
    """A streamed parameter (`stored`: its safetensors file and tensor name), its 2-D transpose (`perm`) or either
    with leading axes of 1 (`leading`): read whole when a pass asks for its values; written to the external-data
    file `block` bytes at a time, rows (the transpose's: columns) sliced from the file, and read by the quantizer
    a few columns at a time, so neither holds a whole tensor (a tied 151936 x 896 embedding is 544 MB in fp32,
    and the head reads its transpose)."""

    def __init__(self, read, stored: tuple[str, str] | None, convert, block: int = BLOCK, perm: tuple[int, ...] | None = None,
                 leading: int = 0, **kwargs):
        super().__init__(read, **kwargs)
        self.stored, self.convert, self.block, self.perm, self.leading = stored, convert, block, perm, leading

    def _derived(self, read, name: str, shape: list[int], **changes) -> CheckpointTensor:
        fields = {"perm": self.perm, "leading": self.leading, **changes}
        return CheckpointTensor(read, self.stored, self.convert, self.block, **fields, dtype=self.dtype,
                                shape=ir.Shape(shape), name=name)

    def transposed(self, perm: list[int], read, name: str) -> ir.LazyTensor:
        shape = [self.shape[p] for p in perm]
        if self.perm is not None or self.leading or list(perm) != [1, 0]:
            return ir.LazyTensor(read, dtype=self.dtype, shape=ir.Shape(shape), name=name)
        return self._derived(read, name, shape, perm=(1, 0))

    def unsqueezed(self, read, name: str) -> CheckpointTensor:
        """The same tensor with one more leading axis of 1."""
        return self._derived(read, name, [1, *self.shape], leading=self.leading + 1)

    @contextlib.contextmanager
    def _file(self) -> Iterator[Any]:
        """The tensor's safetensors slice (rows of the stored layout), or None: not stored as the graph reads it."""
        dims = tuple(self.shape)[self.leading:]
        if self.stored is None or not dims:
            yield None
            return
        from safetensors import safe_open

        with safe_open(self.stored[0], framework="pt") as checkpoint:
            stored = checkpoint.get_slice(self.stored[1])
            expected = tuple(dims[p] for p in (self.perm or range(len(dims))))
            yield stored if tuple(stored.get_shape()) == expected else None  # else read() says why

    def tofile(self, file) -> None:
        with self._file() as stored:
            if stored is None or self.nbytes <= self.block:
                return super().tofile(file)
            count = self.shape[self.leading]
            rows = max(1, self.block * count // self.nbytes)
            for start in range(0, count, rows):
                block = stored[:, start:start + rows].t() if self.perm else stored[start:start + rows]
                self.convert(block).tofile(file)

    def column_blocks(self, width: int) -> Iterator[np.ndarray] | None:
        """A 2-D tensor's columns, `width` at a time, each read from the file alone (the quantizer's blocks); None
        where the file does not hold it as the graph reads it."""
        with self._file() as stored:
            if stored is None or len(self.shape) - self.leading != 2:
                return None

        def blocks() -> Iterator[np.ndarray]:
            with self._file() as stored:
                for start in range(0, self.shape[-1], width):
                    block = stored[start:start + width].t() if self.perm else stored[:, start:start + width]
                    yield self.convert(block).numpy()

        return blocks()


def attach(model: ir.Model, torch_model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Every initializer that is a streamed parameter reads its tensor from the checkpoint when written
    (in `dtype`); returns how many."""
    def convert(tensor: torch.Tensor) -> ir.Tensor:
        tensor = tensor.to(dtype).contiguous()
        return ir.tensor(tensor.numpy() if dtype != torch.bfloat16 else tensor)

    found = sources(torch_model)
    count = 0
    for name, value in model.graph.initializers.items():
        if name not in found or value.const_value is None:
            continue
        weights, key = found[name]
        shape = ir.Shape(value.const_value.shape)

        def read(weights=weights, key=key, shape=shape):
            tensor = weights[key]
            if tuple(tensor.shape) != tuple(shape):
                raise ExportError(f"the checkpoint's {key} has shape {tuple(tensor.shape)}, the graph {tuple(shape)}")
            return convert(tensor)

        value.const_value = CheckpointTensor(read, _stored_in(weights, key), convert, dtype=value.const_value.dtype,
                                             shape=shape, name=name)
        count += 1
    return count


def cast_buffers(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Floating buffers in the export dtype, as `model.to(dtype)` makes them (parameters are cast on load)."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point() and not buffer.is_meta:
                module._buffers[name] = buffer.to(dtype)


__all__ = ["BLOCK", "DISK", "ENV", "SIZE", "CheckpointTensor", "alias_tied", "attach", "available_memory",
           "cast_buffers", "checkpoint_parameters", "device_map", "export_bytes", "fits_in_memory", "forced", "hooks_off",
           "is_streamed", "keep_input_embedding", "loading", "local_checkpoint", "read_outside_its_module",
           "return_freed_blocks", "sources", "wanted", "weight_files"]
