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
