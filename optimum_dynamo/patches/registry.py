"""Reversible patches, registered by decorator, gated by library versions, signature-checked.

    @register_patch("transformers.masking_utils._ignore_causal_mask_sdpa",
                    versions={"transformers": ">=5.0"}, reason="...")
    def never_skip_mask(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        return False

A function other modules import by name (`from ..masking_utils import f`) is patched with
`where_imported=True`: also in every imported module that holds the same object under that name.

Checks are lazy (registration imports nothing): `applied()` swaps in each active patch whose target
module is already imported (a model being exported has imported its modules; the others cannot be in use),
checks its signature first — a target whose parameters differ from the replacement's raises `PatchError` —
and always restores them. Patches are process-wide: do not export from two threads at once.

A replacement names the cache `past_key_values` (Mamba-style: `cache_params`) on every transformers version: where
the installed one calls it `cache` (5.24+, `legacy_bridge.cache_argument`), the signature check reads it so, the
swapped-in function takes `cache=` and `original(target)` is given `past_key_values=` as `cache=`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from legacy_bridge import cache_argument


class PatchError(RuntimeError):
    pass


@dataclass
class Patch:
    target: str
    replacement: Callable
    versions: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    check_signature: bool = True
    option: str | None = None  # applied only when an export asks for this option (e.g. "fused_attention")
    where_imported: bool = False  # also swapped in the modules that imported the target by name

    @property
    def name(self) -> str:
        return f"{self.replacement.__module__}.{self.replacement.__qualname__}"

    def is_active(self) -> bool:
        """True when every gated library is installed at a matching version."""
        for package, spec in self.versions.items():
            try:
                installed = Version(importlib.metadata.version(package))
            except importlib.metadata.PackageNotFoundError:
                return False
            if not SpecifierSet(spec, prereleases=True).contains(installed):
                return False
        return True

    def resolve(self) -> tuple[Any, str]:
        """(owner object, attribute name) of the target; raises PatchError if it is gone."""
        parts = self.target.split(".")
        for split in range(len(parts) - 1, 0, -1):
            try:
                owner = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:-1]:
                    owner = getattr(owner, attr)
            except AttributeError:
                break
            if hasattr(owner, parts[-1]):
                return owner, parts[-1]
            break
        raise PatchError(f"patch {self.name}: target {self.target} does not exist")

    def in_use(self) -> bool:
        """Whether the module holding the target is imported (nothing is imported to tell): the deepest
        imported prefix is that module, or a package whose next name is already loaded."""
        parts = self.target.split(".")
        for split in range(len(parts) - 1, 0, -1):
            module = sys.modules.get(".".join(parts[:split]))
            if module is not None:
                return not hasattr(module, "__path__") or parts[split] in vars(module)
        return False

    def check(self) -> None:
        if not self.check_signature:
            return
        owner, attr = self.resolve()
        original = inspect.getattr_static(owner, attr)
        original = getattr(original, "__func__", original)
        if _params(original) != [(cache_argument.renamed(n), kind) for n, kind in _params(self.replacement)]:
            raise PatchError(
                f"patch {self.name}: {self.target}{inspect.signature(original)} no longer matches "
                f"the replacement{inspect.signature(self.replacement)}"
            )

    def renames(self) -> dict[str, str]:
        """{installed name: the replacement's name} of the cache parameters the installed transformers renamed."""
        names = inspect.signature(self.replacement).parameters
        return {cache_argument.renamed(n): n for n in names if cache_argument.renamed(n) != n}


def _params(fn) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def _keywords(fn: Callable, renames: dict[str, str]) -> Callable:
    """`fn` taking its keyword arguments by the names in `renames` (old -> new); `fn` itself if there are none."""
    if not renames:
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **{renames.get(k, k): v for k, v in kwargs.items()})

    return call


_PATCHES: list[Patch] = []
_ORIGINALS: dict[str, Any] = {}
_LOCK = threading.RLock()


def register_patch(target: str, *, versions: dict[str, str] | None = None, reason: str = "", check_signature=True,
                   option: str | None = None, where_imported: bool = False):
    """Decorator: the function replaces `target` while patches are applied (with `option`: only when
    `applied(options=...)` names it; with `where_imported`: in the modules that imported it too)."""

    def decorator(fn):
        _PATCHES.append(Patch(target, fn, dict(versions or {}), reason, check_signature, option, where_imported))
        return fn

    return decorator


def unregister_patch(fn: Callable) -> None:
    """Remove the patch whose replacement is `fn`."""
    _PATCHES[:] = [p for p in _PATCHES if p.replacement is not fn]


def active_patches() -> list[Patch]:
    return [p for p in _PATCHES if p.is_active()]


def original(target: str) -> Any:
    """The unpatched object behind `target` (for replacements that wrap it), taking the replacement's names."""
    return _ORIGINALS[target]


def _importers(owner, attr: str, value) -> list:
    """The imported modules other than `owner` that hold `value` as `attr`."""
    return [m for m in list(sys.modules.values())
            if m is not owner and m is not None and getattr(m, "__dict__", {}).get(attr) is value]


@contextmanager
def applied(patches: list[Patch] | None = None, options: tuple[str, ...] = ()):
    """Swap the patches in (by default: the active ones whose target module is imported, and whose option,
    if any, is in `options`), checking each signature first; restore every swapped attribute on exit, also
    on error."""
    if patches is None:
        patches = [p for p in active_patches() if p.in_use() and (p.option is None or p.option in options)]
    done: list[tuple[Patch, Any, str, Any]] = []
    with _LOCK:
        try:
            for patch in patches:
                patch.check()
                owner, attr = patch.resolve()
                value, renames = getattr(owner, attr), patch.renames()
                _ORIGINALS[patch.target] = _keywords(value, {old: new for new, old in renames.items()})
                swapped = _keywords(patch.replacement, renames)
                for holder in [owner, *(_importers(owner, attr, value) if patch.where_imported else ())]:
                    saved = inspect.getattr_static(holder, attr)
                    replacement = staticmethod(swapped) if isinstance(saved, staticmethod) else swapped
                    setattr(holder, attr, replacement)
                    done.append((patch, holder, attr, saved))
            yield [p for p, *_ in done]
        finally:
            for patch, owner, attr, saved in reversed(done):
                setattr(owner, attr, saved)
                _ORIGINALS.pop(patch.target, None)
