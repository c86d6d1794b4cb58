"""Interpreter start-up with and without optimum-dynamo's start-up hook (`optimum_dynamo_startup.pth`).

Run with the Python of an environment that has the package installed:
    .venv-t4/bin/python benchmarks/startup.py [runs]
Both variants run interleaved in one process tree (`python -c pass`, OPTIMUM_DYNAMO_DISABLE=1 for the
second), so machine load hits both alike; prints min and median of each and their difference.
"""

import os
import statistics
import subprocess
import sys
import time


def once(env) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - start) * 1000


def main(runs: int) -> None:
    hook = dict(os.environ, OPTIMUM_DYNAMO_DISABLE="0")
    plain = dict(os.environ, OPTIMUM_DYNAMO_DISABLE="1")
    once(hook), once(plain)  # warm the file cache
    with_hook, without = [], []
    for _ in range(runs):
        with_hook.append(once(hook))
        without.append(once(plain))
    print(f"{'':>18}{'min ms':>10}{'median ms':>12}")
    for name, times in (("with hook", with_hook), ("without (DISABLE)", without)):
        print(f"{name:>18}{min(times):>10.1f}{statistics.median(times):>12.1f}")
    print(f"{'difference':>18}{min(with_hook) - min(without):>10.1f}"
          f"{statistics.median(with_hook) - statistics.median(without):>12.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
