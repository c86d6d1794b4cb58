"""The versions an export accepts are the package's own requirements (pyproject.toml), checked before loading."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from optimum_dynamo import supported
from optimum_dynamo.errors import PipelineError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_checked_ranges_are_pyproject_s():
    declared = [Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]]
    expected = {r.name: str(r.specifier) for r in declared if r.name in supported.CHECKED}
    assert {n: str(r.specifier) for n, r in supported.requirements().items()} == expected
    assert set(expected) == {"torch", "transformers"}
    supported.check()  # this environment is one of the supported ones


def test_a_transformers_out_of_range_is_refused_in_one_line(monkeypatch):
    installed = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: "4.40.0" if n == "transformers" else installed(n))
    specifier = supported.requirements()["transformers"].specifier
    lower, upper = sorted(map(str, specifier), key=lambda s: not s.startswith(">"))
    assert lower.startswith(">=4.") and upper.startswith("<")
    with pytest.raises(PipelineError) as e:
        supported.check()
    assert str(e.value) == (f'transformers 4.40.0 is not supported by this optimum-dynamo release: it works with '
                            f'transformers{lower},{upper} (pip install "transformers{lower},{upper}")')


@pytest.mark.parametrize("version, warned", [("4.57.6", False), ("5.0.0", True), ("5.13.1", True), ("5.22.2", False),
                                             ("5.24.0", False)])
def test_state_caches_on_the_releases_between_are_warned_of(monkeypatch, version, warned):
    """transformers 5.0-5.21: some state-cache families' exports fail (measured, docs/compatibility.md); the export
    says which releases they are tested on, in one line, and goes on (Mamba itself passes there)."""
    installed = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: version if n == "transformers" else installed(n))
    upper = next(str(s) for s in supported.requirements()["transformers"].specifier if s.operator == "<")
    expected = (f"warning: mamba2 has a state cache; on transformers {version} the exports of some state-cache families "
                "fail (Mamba-2, Jamba, NemotronH...): they are tested on transformers 4.53-4.57 and >=5.22 "
                f'(pip install "transformers>=5.22,{upper}")')
    assert supported.state_cache_warning("mamba2") == (expected if warned else None)
