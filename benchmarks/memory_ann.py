"""Exemplar-memory retrieval: latency p50/p99 and recall@10 against exact search at 10k, 100k
and 1M exemplars, with the memory's own index choice (``bcer.memory.VectorIndex``: exact flat
up to ``FLAT_MAX``, HNSW beyond) and exact flat search beside it.

Embeddings are clustered, not uniform random (on uniform random vectors in 384-d every point
is nearly equidistant and ANN recall means nothing): ``sqrt(n)`` cluster centres on the unit
sphere, each exemplar a centre plus Gaussian noise scaled so that cosine within a cluster is
~0.6-0.8 (like MiniLM between reports of one kind), re-normalised. Queries are fresh draws
from the same clusters (not in the index). One query at a time, one FAISS thread (a retrieval
in the R4 loop is one query); exact top-10 by batched ``IndexFlatIP`` is the ground truth.

    python benchmarks/memory_ann.py --sizes 10000,100000,1000000 --out benchmarks/results/memory_ann.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcer.memory.index import FLAT_MAX, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH, HNSW_M, VectorIndex, faiss_module  # noqa: E402

DIM = 384


def clustered(n: int, n_clusters: int, rng: np.random.Generator, sigma: float, centres=None,
              chunk: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
    if centres is None:
        centres = rng.standard_normal((n_clusters, DIM)).astype(np.float32)
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = np.empty((n, DIM), np.float32)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        x = centres[rng.integers(0, len(centres), b - a)] + sigma * rng.standard_normal((b - a, DIM)).astype(np.float32)
        out[a:b] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out, centres


def n_clusters(n: int) -> int:
    """sqrt(n) clusters of sqrt(n) exemplars: many kinds of report, many reports of each kind."""
    return max(10, int(round(n ** 0.5)))


def _latencies(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    times, ids = [], []
    for q in queries:
        t = time.perf_counter()
        _, i = index.search(q[None, :], k)
        times.append(time.perf_counter() - t)
        ids.append(i[0])
    return np.asarray(times), np.asarray(ids)


def recall_at(ids: np.ndarray, truth: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ids, truth)]))


def bench_size(n: int, n_queries: int, rng: np.random.Generator, sigma: float, build_threads: int) -> dict:
    faiss = faiss_module()
    t0 = time.time()
    x, centres = clustered(n, n_clusters(n), rng, sigma)
    q, _ = clustered(n_queries, 0, rng, sigma, centres=centres)
    gen_s = time.time() - t0
    faiss.omp_set_num_threads(build_threads)
    exact = faiss.IndexFlatIP(DIM)
    exact.add(x)
    t0 = time.time()
    _, truth = exact.search(q, 10)
    truth_s = time.time() - t0
    intra = float(np.mean(np.sum(q * x[truth[:, 0]], axis=1)))
    t0 = time.time()
    mem = VectorIndex(DIM, "auto")
    for a in range(0, n, 50_000):
        mem.add(x[a:a + 50_000])
    build_s = time.time() - t0
    faiss.omp_set_num_threads(1)
    warm = min(20, n_queries)
    _latencies(mem, q[:warm], 10)
    t_mem, ids_mem = _latencies(mem, q, 10)
    t_flat, ids_flat = _latencies(exact, q[: min(n_queries, 100)], 10)
    row = {"n": n, "clusters": n_clusters(n), "queries": n_queries, "index": mem.kind,
           "p50_ms": round(1e3 * float(np.percentile(t_mem, 50)), 4),
           "p99_ms": round(1e3 * float(np.percentile(t_mem, 99)), 4),
           "recall_at_10": round(recall_at(ids_mem, truth, 10), 4),
           "exact_flat_p50_ms": round(1e3 * float(np.percentile(t_flat, 50)), 3),
           "exact_flat_p99_ms": round(1e3 * float(np.percentile(t_flat, 99)), 3),
           "build_s": round(build_s, 1), "generate_s": round(gen_s, 1), "ground_truth_s": round(truth_s, 1),
           "mean_top1_cosine": round(intra, 3), "vectors_gb": round(x.nbytes / 1e9, 2),
           "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)}
    row["goal"] = {"p50_ms": 1.0 if n <= 100_000 else 5.0, "recall_at_10": 0.95}
    row["goal_met"] = row["p50_ms"] <= row["goal"]["p50_ms"] and row["recall_at_10"] >= 0.95
    del x, exact, mem
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--sigma", type=float, default=0.045, help="per-dimension noise around a cluster centre")
    ap.add_argument("--build-threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/memory_ann.json")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    res = {"config": {"dim": DIM, "flat_max": FLAT_MAX, "hnsw": {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION,
                                                                 "efSearch": HNSW_EF_SEARCH},
                      "search_threads": 1, "build_threads": args.build_threads, "sigma": args.sigma,
                      "cpus": os.cpu_count(), "machine": platform.machine(), "faiss": faiss_module().__version__},
           "sizes": []}
    for n in [int(s) for s in args.sizes.split(",")]:
        load = os.getloadavg()
        row = bench_size(n, args.queries, rng, args.sigma, args.build_threads)
        row["load_avg_before"] = [round(v, 1) for v in load]
        res["sizes"].append(row)
        print(json.dumps(row), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))  # after each size: a long 1M run keeps what it measured


if __name__ == "__main__":
    main()
