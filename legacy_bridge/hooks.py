"""Run a callback right after a module is first imported (or now, if it already is).

Lets `install()` stay cheap: nothing heavy is imported until optimum or transformers import it themselves.
"""

from __future__ import annotations

import sys

_pending: dict[str, list] = {}
_before: dict[str, list] = {}


class _AfterImport:
    """A meta-path finder that finds nothing itself: it wraps the real loader of a watched module."""

    def find_spec(self, name, path, target=None):
        if name not in _pending and name not in _before:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def run(module):
            for callback in _before.pop(name, ()):
                callback(module)
            exec_module(module)
            for callback in _pending.pop(name, ()):
                callback(module)

        try:
            loader.exec_module = run  # the loader instance belongs to this spec only
        except AttributeError:  # a loader that takes no attributes: leave the import alone
            pass
        return spec


_FINDER = _AfterImport()


def when_imported(name: str, callback, *, before: bool = False) -> None:
    """Call `callback(module)` once `name` is imported: now if it already is, else right after its import
    (`before=True`: right before its code runs, so what it imports at the top is already in place)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    (_before if before else _pending).setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


class MethodPatch:
    """Methods of `module.cls` replaced once `module` is imported (`apply(cls, original)` replaces them and
    records each original in the dict it is given), restored by `uninstall()`."""

    def __init__(self, module: str, cls: str, apply):
        self.module, self.cls, self.apply = module, cls, apply
        self.enabled, self.original = False, {}

    def install(self) -> None:
        if not self.enabled:
            self.enabled = True
            when_imported(self.module, self._apply)

    def _apply(self, module) -> None:
        if self.enabled and not self.original:
            self.apply(getattr(module, self.cls), self.original)

    def uninstall(self) -> None:
        self.enabled = False
        module = sys.modules.get(self.module)
        if module is not None:
            for name, original in self.original.items():
                setattr(getattr(module, self.cls), name, original)
        self.original.clear()
