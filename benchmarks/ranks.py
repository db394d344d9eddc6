"""Ranks vs. time and memory: a full JSON report of a folder of N rank traces, three ways:

* ``memory``: every rank's frames gathered into one process (``keep_traces=True``, the old way);
* ``processes``: the default, each rank reduced to a small summary in a local worker process;
* ``dask``: the same on a Dask ``LocalCluster`` (``--dask local``).

Each run is a fresh process with an empty parse cache (a first report). Printed per run: wall
time, the peak RSS of the driver process (what must stay bounded as ranks grow) and the largest
peak RSS of any worker process. The rank traces are copies of the two real DDP rank traces with
``distributedInfo`` set to ranks 0..N-1 (benchmark data only, never shipped as samples).

    python benchmarks/ranks.py [--workers 2] N [N ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = r"""
import json, resource, sys, time
t = time.perf_counter()
import gpuprof
mode, folder, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
kw = {"memory": {"keep_traces": True}, "processes": {}, "dask": {"dask": "local"}}[mode]
a = gpuprof.analyze(folder, workers=workers, **kw)
a.to_json()
print(json.dumps({"seconds": time.perf_counter() - t, "findings": [f.id for f in a.findings],
                  "driver_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def make_ranks(folder: Path, n: int) -> None:
    src = [json.loads(gzip.decompress((ROOT / "sample_traces/h200/ddp_good" / f"rank{r}.json.gz").read_bytes()))
           for r in (0, 1)]
    for r in range(n):
        doc = dict(src[r % 2])
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("counts", nargs="+", type=int)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--modes", default="memory,processes,dask")
    a = p.parse_args()
    print(f"{'ranks':>6} {'mode':>10} {'seconds':>8} {'driver MB':>10} {'worker MB':>10}  findings")
    for n in a.counts:
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d) / "ranks"
            folder.mkdir()
            make_ranks(folder, n)
            for mode in a.modes.split(","):
                env = {"GPUPROF_CACHE_DIR": str(Path(d) / f"cache-{mode}"), "PATH": "/usr/bin:/bin",
                       "PYTHONPATH": str(ROOT)}
                r = subprocess.run([sys.executable, "-c", RUN, mode, str(folder), str(a.workers)], env=env,
                                   capture_output=True, text=True)
                if r.returncode:
                    print(f"{n:6d} {mode:>10} failed: {r.stderr.strip().splitlines()[-1:]}")
                    continue
                m = json.loads(r.stdout.strip().splitlines()[-1])
                print(f"{n:6d} {mode:>10} {m['seconds']:8.1f} {m['driver_mb']:10.0f} {m['worker_mb']:10.0f}  "
                      f"{','.join(m['findings'])}", flush=True)


if __name__ == "__main__":
    main()
