"""The versions of torch and transformers this release is tested with, read from its own metadata.

pip keeps them in range on install; an environment built otherwise (`pip install --no-deps`, a later
`pip install transformers==...`) gets one line naming what works before any export starts.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from .errors import PipelineError

CHECKED = ("torch", "transformers")


def requirements() -> dict[str, Requirement]:
    """The package's own requirements on CHECKED (none when run from a source tree without metadata)."""
    try:
        declared = importlib.metadata.requires("optimum-dynamo") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    found = (Requirement(r) for r in declared)
    return {r.name: r for r in found if r.name in CHECKED and r.marker is None}


def check() -> None:
    """PipelineError naming the installed version and the range that works, for the first one out of range."""
    for name, requirement in requirements().items():
        installed = importlib.metadata.version(name)
        if not requirement.specifier.contains(installed.split("+")[0], prereleases=True):
            bounds = name + ",".join(sorted(map(str, requirement.specifier), key=lambda s: not s.startswith(">")))
            raise PipelineError(f"{name} {installed} is not supported by this optimum-dynamo release: it works with "
                                f"{bounds} (pip install \"{bounds}\")")


# transformers releases where the export of state caches (Mamba, hybrids) is measured failing for some families
# (they stop at validation or before: docs/compatibility.md); it passes on 4.53-4.57 and 5.22-5.24
STATE_CACHE_GAP = SpecifierSet(">=5.0,<5.22")


def state_cache_warning(model_type: str) -> str | None:
    """One line for a model with a state cache on a transformers release in STATE_CACHE_GAP, else None."""
    installed = importlib.metadata.version("transformers")
    if not STATE_CACHE_GAP.contains(installed.split("+")[0], prereleases=True):
        return None
    upper = [str(s) for s in getattr(requirements().get("transformers"), "specifier", ()) if s.operator == "<"]
    wanted = ",".join(["transformers>=5.22", *upper])
    return (f"warning: {model_type} has a state cache; on transformers {installed} the exports of some state-cache "
            f"families fail (Mamba-2, Jamba, NemotronH...): they are tested on transformers 4.53-4.57 and >=5.22 "
            f"(pip install \"{wanted}\")")
