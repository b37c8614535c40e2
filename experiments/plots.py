"""Figures from a sweep's results (matplotlib, PNG): what a user looks at to choose a predictor.

- ``load_sweep.png``: mean PTL and p95 response time against load, one line per predictor (Fig. 6)
- ``long_requests.png``: p95 response time of the longest decile against load
- ``response_cdf.png``: response-time CDF per predictor at the highest load
- ``predicted_vs_true.png``: predicted vs true output length per predictor
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from core.io import atomic_write_bytes


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plots need matplotlib: pip install -e '.[plots]' (from the checkout)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    atomic_write_bytes(path, buffer.getvalue())


def _label(row: dict) -> str:
    return "FCFS" if row["predictor"] == "none" else f"{row['predictor']} ({row['policy']})"


def _series(summaries: list[dict], metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """label -> (loads, mean over seeds of metric)."""
    acc: dict[str, dict[float, list[float]]] = {}
    for s in summaries:
        if s.get(metric) is None:
            continue
        acc.setdefault(_label(s), {}).setdefault(s["load"], []).append(s[metric])
    return {label: (np.array(sorted(v)), np.array([np.mean(v[k]) for k in sorted(v)])) for label, v in acc.items()}


def plot_load_sweep(summaries: list[dict], out: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, title in ((axes[0], "mean_ptl_s", "mean per-token latency (s)"),
                              (axes[1], "p95_e2e_s", "p95 response time (s)")):
        for label, (x, y) in _series(summaries, metric).items():
            ax.plot(x, y, marker="o", label=label, linestyle="--" if label == "FCFS" else "-")
        ax.set_xlabel("load (x FCFS capacity)")
        ax.set_title(title)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    path = out / "load_sweep.png"
    _save(fig, path)
    plt.close(fig)
    return path


def plot_long_requests(summaries: list[dict], out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (x, y) in _series(summaries, "long_decile_p95_e2e_s").items():
        ax.plot(x, y, marker="o", label=label, linestyle="--" if label == "FCFS" else "-")
    ax.set_xlabel("load (x FCFS capacity)")
    ax.set_title("longest decile: p95 response time (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "long_requests.png"
    _save(fig, path)
    plt.close(fig)
    return path


def plot_response_cdf(runs: list[tuple[dict, Path]], out: Path) -> Path | None:
    """CDF of response time per predictor for runs at the highest load (first seed)."""
    if not runs:
        return None
    plt = _pyplot()
    top = max(s["load"] for s, _ in runs)
    seed = min(s["seed"] for s, _ in runs)
    fig, ax = plt.subplots(figsize=(6, 4))
    for s, path in runs:
        if s["load"] != top or s["seed"] != seed:
            continue
        t = pq.read_table(path, columns=["arrival_s", "finish_s"])
        e2e = np.sort(t.column("finish_s").to_numpy() - t.column("arrival_s").to_numpy())
        ax.plot(e2e, np.arange(1, len(e2e) + 1) / len(e2e), label=_label(s))
    ax.set_xscale("log")
    ax.set_xlabel("response time (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"response-time CDF at {top:g}x")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "response_cdf.png"
    _save(fig, path)
    plt.close(fig)
    return path


def plot_predicted_vs_true(runs: list[tuple[dict, Path]], out: Path) -> Path | None:
    chosen: dict[str, Path] = {}
    for s, path in runs:
        if s["predictor"] != "none" and s["predictor"] not in chosen:
            chosen[s["predictor"]] = path
    if not chosen:
        return None
    plt = _pyplot()
    cols = min(4, len(chosen))
    rows = int(np.ceil(len(chosen) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, path) in zip(axes.flat, chosen.items()):
        t = pq.read_table(path, columns=["output_tokens", "predicted_tokens"])
        true = t.column("output_tokens").to_numpy()
        pred = t.column("predicted_tokens").to_numpy(zero_copy_only=False)
        ax.scatter(true, pred, s=3, alpha=0.3)
        hi = max(float(np.nanmax(true)), float(np.nanmax(pred))) if len(true) else 1
        ax.plot([1, hi], [1, hi], color="k", lw=0.8)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("true tokens", fontsize=8)
        ax.set_ylabel("predicted", fontsize=8)
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    path = out / "predicted_vs_true.png"
    _save(fig, path)
    plt.close(fig)
    return path


def write_plots(summaries: list[dict], out: Path, run_dirs: list[Path]) -> list[Path]:
    """Every figure that the sweep's results support; returns the files written."""
    runs = [(s, d / "requests.parquet") for s, d in zip(summaries, run_dirs) if (d / "requests.parquet").is_file()]
    written = [plot_load_sweep(summaries, out), plot_long_requests(summaries, out),
               plot_response_cdf(runs, out), plot_predicted_vs_true(runs, out)]
    return [p for p in written if p is not None]
