"""Every patch active on the installed transformers matches its target: the target exists where its module does, and
its signature is the replacement's. A release that renames a parameter fails here, not in every export (each
export applies every active patch whose module it imported). `make matrix` runs this file on every row."""

import importlib

import pytest

from optimum_dynamo import patches


def _module_of(target: str):
    """The deepest importable module of a dotted target; None where the target's own module does not exist in this
    release (a model added later: nothing imports it, so its patch never applies)."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:split])
        try:
            return importlib.import_module(name), parts[split:]
        except ModuleNotFoundError as e:
            if not (name == e.name or name.startswith(f"{e.name}.")):  # it exists but needs what is not installed
                raise
    return None, parts


@pytest.mark.parametrize("patch", patches.active_patches(), ids=lambda p: f"{p.name.rsplit('.', 1)[-1]}@{p.target}")
def test_active_patch_matches_its_target(patch):
    module, rest = _module_of(patch.target)
    if module is None or (hasattr(module, "__path__") and len(rest) > 1 and not hasattr(module, rest[0])):
        pytest.skip(f"{patch.target}: not in this transformers (its patch never applies here)")
    with patches.applied([patch], options=(patch.option,) if patch.option else ()) as swapped:
        assert swapped  # (a patch of a name other modules imported is swapped in each of them too)
