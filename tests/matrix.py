"""The version matrix (`make matrix`, on demand, not in CI): per row one environment, the built wheel installed in
it, then four groups of tests, each one cell of the table in docs/compatibility.md (pass / fail / n/a).

Every row shares one base venv per torch version (.venv-matrix/base-torch-X: torch, torchvision, onnx, onnxscript,
onnxruntime and the other pins that do not depend on transformers). A row's own venv is small: a .pth file in its
site-packages puts the base's site-packages on sys.path after its own, and transformers, optimum, optimum-onnx and
the wheel are installed into the row itself (the wheel's start-up .pth and optimum-cli register file included).

Raw results go to .matrix/results.json (merged per row), the table between the docs' marker comments.
Standard library only: run it with any Python 3.10+.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".venv-matrix"
OUT = ROOT / ".matrix"
RESULTS = OUT / "results.json"
DOCS = ROOT / "docs" / "compatibility.md"
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"

ONNXRUNTIME = "1.32.0"
# Pins that do not depend on transformers, as in .ci/t5.txt (onnxruntime: the newest release).
BASE_PINS = ["onnx==1.23.2", "onnxscript==0.7.2", f"onnxruntime=={ONNXRUNTIME}", "optree==0.20.0", "requests",
             "sentencepiece", "pillow", "pytest", "hypothesis"]
# torchvision 0.29.x needs torch >= 2.14 (and does not import on 2.13): none there.
TORCHVISION = {"2.15.0": "0.29.2", "2.14.1": "0.29.2", "2.13.0": None}
OPTIMUM_ONNX = "0.1.0"

TRANSFORMERS = ["4.53.3", "4.55.4", "4.57.6", "5.0.0", "5.2.0", "5.4.0", "5.13.1", "5.14.1", "5.23.0",
                "5.24.0"]
ROWS = ([(t, "2.15.0") for t in TRANSFORMERS]
        + [(t, torch) for torch in ("2.13.0", "2.14.1") for t in ("4.57.6", "5.24.0")])

# group -> (working directory, pytest arguments); the smoke set runs from its own directory (its own pytest.ini)
GROUPS = {
    "patches": ("tests", ["test_patch_targets.py"]),
    "smoke": ("tests/smoke", ["."]),
    "decoder sweep": ("tests", ["test_decoder_sweep.py"]),
    "seq2seq": ("tests", ["test_seq2seq_cli.py"]),
    "vlm": ("tests", ["test_vlm_cli.py"]),
}
GROUP_TIMEOUT = 3600
PIP_ENV = {**os.environ, "PIP_CONSTRAINT": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
TEST_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def row_name(transformers: str, torch: str) -> str:
    return f"transformers-{transformers}-torch-{torch}"


def optimum_for(transformers: str) -> str:
    return "2.1.0" if transformers.startswith("4.") else "2.3.0"


def sh(*argv, env=PIP_ENV, cwd=None, timeout=None) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, argv)), flush=True)
    return subprocess.run(list(map(str, argv)), env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True)


def checked(*argv, **kwargs) -> str:
    run = sh(*argv, **kwargs)
    if run.returncode:
        raise RuntimeError(f"`{' '.join(map(str, argv))}` failed: {last_line(run.stderr or run.stdout)}")
    return run.stdout


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return lines[-1].strip() if lines else ""


def site_packages(venv: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib", vars={"base": "."}))
    return (venv / rel).resolve()


def new_venv(venv: Path) -> Path:
    shutil.rmtree(venv, ignore_errors=True)
    checked(sys.executable, "-m", "venv", venv)
    return venv / "bin" / "python"


def base_venv(torch: str) -> Path:
    """The shared base venv of one torch version, built once (rebuilt when its pins change)."""
    venv = VENVS / f"base-torch-{torch}"
    pins = [f"torch=={torch}"] + ([f"torchvision=={TORCHVISION[torch]}"] if TORCHVISION[torch] else []) + BASE_PINS
    done = venv / ".done"
    if done.exists() and done.read_text().split() == pins:
        return venv
    python = new_venv(venv)
    checked(python, "-m", "pip", "install", "-q", *pins)
    done.write_text("\n".join(pins) + "\n")
    return venv


def build_row(transformers: str, torch: str, wheel: Path) -> Path:
    """A fresh row venv over the base: transformers, optimum, optimum-onnx and the wheel in its own site-packages."""
    base = base_venv(torch)
    venv = VENVS / row_name(transformers, torch)
    python = new_venv(venv)
    (site_packages(venv) / "matrix_base.pth").write_text(f"{site_packages(base)}\n")
    pins = [f"transformers=={transformers}", f"optimum=={optimum_for(transformers)}"]
    if transformers.startswith("4."):
        checked(python, "-m", "pip", "install", "-q", *pins, f"optimum-onnx=={OPTIMUM_ONNX}", wheel)
    else:  # optimum-onnx 0.1.0's metadata pins transformers < 4.58 and optimum ~= 2.1.0
        checked(python, "-m", "pip", "install", "-q", *pins, wheel)
        checked(python, "-m", "pip", "install", "-q", "--no-deps", f"optimum-onnx=={OPTIMUM_ONNX}")
    where = checked(python, "-c", "import torch, transformers; print(torch.__file__, transformers.__file__)").split()
    assert where[0].startswith(str(site_packages(base))) and where[1].startswith(str(site_packages(venv))), where
    return python


def versions(python: Path) -> dict:
    names = ["torch", "torchvision", "transformers", "optimum", "optimum-onnx", "onnxruntime", "optimum-dynamo"]
    probe = ("import importlib.metadata as m, json\n"
             f"def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return None\n"
             f"print(json.dumps({{n: v(n) for n in {names!r}}}))")
    return json.loads(checked(python, "-c", probe))


def reason(report: str) -> str:
    """One line of a failure report (junit's element text): its last assertion-message line that names an error
    (a CLI's `error: ...` line, an exception), else the first line."""
    lines = [line[1:].strip() for line in report.splitlines() if line.startswith("E ")] or report.splitlines()
    lines = [line.strip() for line in lines if line.strip()]
    named = [line for line in lines if re.search(r"error|exception|failed", line, re.I) and not line.startswith("+")]
    return (named[-1] if named else lines[0] if lines else "(no message)")[:400]


def run_group(python: Path, group: str, wheel: Path) -> dict:
    cwd, args = GROUPS[group]
    xml = OUT / "junit" / f"{python.parents[1].name}-{group.replace(' ', '-')}.xml"
    for directory in (xml.parent, OUT / "tmp"):
        directory.mkdir(parents=True, exist_ok=True)
    xml.unlink(missing_ok=True)
    log = xml.with_suffix(".log")  # pytest's own output, beside its junit XML
    started = time.time()
    try:
        # a base temp of its own (a failed test's exports stay there), apart from other pytest runs' /tmp dirs
        run = sh(python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={xml}",
                 f"--basetemp={OUT / 'tmp' / xml.stem}", *args,
                 env={**TEST_ENV, "SMOKE_WHEEL": str(wheel)}, cwd=ROOT / cwd, timeout=GROUP_TIMEOUT)
        output = run.stdout + run.stderr
        log.write_text(output)
    except subprocess.TimeoutExpired:
        return {"status": "fail", "reason": f"timed out after {GROUP_TIMEOUT} s", "seconds": GROUP_TIMEOUT}
    seconds = round(time.time() - started)
    if not xml.exists():
        return {"status": "fail", "reason": f"pytest exit {run.returncode}: {last_line(output)}", "seconds": seconds}
    counts, failures = {"passed": 0, "failed": 0, "skipped": 0}, []
    for case in ET.parse(xml).iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            test = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
            failures.append({"test": test, "reason": reason(bad.text or bad.get("message") or "")})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    status = "fail" if counts["failed"] or run.returncode not in (0, 5) else "pass" if counts["passed"] else "n/a"
    result = {"status": status, "seconds": seconds, **counts, "failures": failures}
    if status == "fail":
        result["reason"] = (f"{failures[0]['test']}: {failures[0]['reason']}" if failures
                            else f"pytest exit {run.returncode}: {last_line(output)}")
    return result


def run_row(transformers: str, torch: str, wheel: Path) -> dict:
    name, started = row_name(transformers, torch), time.time()
    row = {"row": name, "torch": torch, "transformers": transformers, "optimum": optimum_for(transformers),
           "optimum-onnx install": "pip install" if transformers.startswith("4.") else "pip install --no-deps",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cells": {}}
    try:
        python = build_row(transformers, torch, wheel)
    except (RuntimeError, AssertionError) as error:
        row["error"] = f"environment: {error}"
    else:
        row["versions"] = versions(python)
        row["commit"] = checked("git", "rev-parse", "--short", "HEAD", cwd=ROOT).strip()
        row["install seconds"] = round(time.time() - started)
        for group in GROUPS:
            print(f"== {name}: {group}", flush=True)
            row["cells"][group] = run_group(python, group, wheel)
            print(f"== {name}: {group}: {row['cells'][group]['status']} {row['cells'][group].get('reason', '')}")
    row["seconds"] = round(time.time() - started)
    row["disk MB"] = {p.name: du_mb(p) for p in (VENVS / name, VENVS / f"base-torch-{torch}") if p.exists()}
    return row


def du_mb(path: Path) -> int:
    return int(checked("du", "-sm", path).split()[0])


def cell(result: dict, notes: list) -> str:
    counts = f"{result.get('passed', 0)} passed" + (f", {result['skipped']} skipped" if result.get("skipped") else "")
    if result["status"] == "pass":
        return f"pass ({counts})"
    if result["status"] == "n/a":
        return f"n/a ({result.get('skipped', 0)} skipped)"
    notes.append(result["reason"])
    return f"**fail** [{len(notes)}] ({result.get('failed', 0)} failed, {counts})"


def table(results: dict) -> str:
    header = ["transformers", "torch", "optimum", "optimum-onnx", "onnxruntime", "torchvision", *GROUPS, "minutes",
              "measured (UTC)", "package commit"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes = []
    order = {row_name(t, torch): i for i, (t, torch) in enumerate(ROWS)}
    for name in sorted(results, key=lambda n: order.get(n, len(order))):
        row = results[name]
        v = row.get("versions", {})
        no_deps = " (`--no-deps`)" if "no-deps" in row["optimum-onnx install"] else ""
        cells = [v.get("transformers") or row["transformers"], v.get("torch") or row["torch"],
                 v.get("optimum") or row["optimum"], f"{v.get('optimum-onnx') or OPTIMUM_ONNX}{no_deps}",
                 v.get("onnxruntime") or "—", v.get("torchvision") or "—"]
        if "error" in row:
            notes.append(row["error"])
            cells += [f"**not built** [{len(notes)}]"] + ["—"] * (len(GROUPS) - 1)
        else:
            cells += [cell(row["cells"][group], notes) if group in row["cells"] else "—" for group in GROUPS]
        cells += [str(round(row["seconds"] / 60)), row["date"].replace(" UTC", ""), row.get("commit", "—")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + [f"[{i}] `{note.replace('`', chr(39))}`" + "  " for i, note in enumerate(notes, 1)]
    return "\n".join(lines).rstrip() + "\n"


def write_docs(results: dict) -> None:
    text = DOCS.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{DOCS}: the markers {START} and {END} are missing")
    head, rest = text.split(START, 1)
    DOCS.write_text(f"{head}{START}\n{table(results)}{END}{rest.split(END, 1)[1]}")
    print(f"wrote the table of {len(results)} rows into {DOCS.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", help="comma-separated row names or parts of them (e.g. "
                        "'transformers-5.24.0-torch-2.15.0' or '5.24.0' or 'torch-2.13'); default: every row")
    parser.add_argument("--table-only", action="store_true", help="only rewrite the docs' table from the JSON")
    parser.add_argument("--list", action="store_true", help="print the row names and stop")
    args = parser.parse_args()
    names = {row_name(*r): r for r in ROWS}
    if args.list:
        print("\n".join(names))
        return
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.table_only:
        wanted = [p.strip() for p in args.rows.split(",")] if args.rows else [""]
        chosen = list(dict.fromkeys(n for w in wanted for n in names if w in n))  # in the order asked
        if not chosen:
            raise SystemExit(f"no row matches {args.rows!r} (--list shows them)")
        wheels = sorted((ROOT / "dist").glob("*.whl"))
        if len(wheels) != 1:
            raise SystemExit("expected one wheel in dist/ (`make wheel`)")
        OUT.mkdir(exist_ok=True)
        for name in chosen:
            results[name] = run_row(*names[name], wheels[0])
            RESULTS.write_text(json.dumps(results, indent=1) + "\n")
            print(f"== {name}: done in {results[name]['seconds']} s", flush=True)
    write_docs(results)


if __name__ == "__main__":
    main()
