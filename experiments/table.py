"""``simulate``'s console table: a header naming what was replayed, the runs' figures fitted to
the terminal (``core.console``: columns dropped in a stated order, never cut), a one-line legend,
and the trade-off of each length-aware run against FCFS in words."""

from __future__ import annotations

from core.console import fitted_table, header_lines, output_width, stdout_console
from simulator.run_metrics import wide_columns, wide_legend

NO_PREDICTOR = "none"   # simulator.runner.NO_PREDICTOR (not imported: that module loads the engine)
#: Width when stdout is neither a terminal nor told by $COLUMNS (a file, a pipe).
PIPED_WIDTH = 100

#: Compact table: (header, summary key or derived column).
COMPACT_COLUMNS = [("predictor", "predictor"), ("policy", "policy"), ("load", "load"),
                   ("mean NL", "mean_ptl_s"), ("vs FCFS", "vs_fcfs_mean_ptl_s"), ("p99 TPOT", "p99_tpot_ms"),
                   ("p95 e2e", "p95_e2e_s"), ("p95 vs FCFS", "vs_fcfs_p95_e2e_s"),
                   ("mean TTFT", "mean_ttft_s")]
WIDE_COLUMNS = [("predictor", "predictor"), ("policy", "policy"), ("load", "load"),
                ("mean NL", "mean_ptl_s"), ("vs FCFS", "vs_fcfs_mean_ptl_s"),
                ("NL vs LEAP", "vs_leap_mean_ptl_s"), ("mean TPOT", "mean_tpot_ms"), ("p99 TPOT", "p99_tpot_ms"),
                ("p99 ITL", "p99_itl_ms"), ("mean e2e", "mean_e2e_s"), ("p50 e2e", "p50_e2e_s"),
                ("p95 e2e", "p95_e2e_s"), ("p95 vs FCFS", "vs_fcfs_p95_e2e_s"), ("p99 e2e", "p99_e2e_s"),
                ("mean TTFT", "mean_ttft_s"), ("long p95", "long_decile_p95_e2e_s"), ("tok/s", "throughput_tok_s"),
                ("Spearman", "spearman"), ("Kendall", "kendall_tau"), ("saturated", "saturated_share"),
                ("sim CPU s", "sim_cpu_s")]
#: (mean e2e is in --wide: p99 TPOT took its place.)
#: Columns a narrow terminal loses first to last: the trade-off of mean NL against the tail (p99
#: TPOT, p95 e2e) is the table's point (and the sentence under it repeats it), so those go last; the
#: run's identity (predictor, policy, load, seed), mean NL and p95 e2e always stay.
DROP_ORDER = ["mean_ttft_s", "vs_fcfs_p95_e2e_s", "p99_tpot_ms", "vs_fcfs_mean_ptl_s"]
#: The terms of the compact table, in parts of at most 100 characters (one line each when narrow).
LEGEND = ("s; TPOT ms | e2e: arrival to last token | TTFT: to first token | NL: normalized latency, e2e / "
          "output tokens (once PTL) | TPOT: time per output token after the first, (e2e - TTFT) / (output tokens - 1)")
#: Said under the table when a column of prefix-cache hits is shown.
HIT_LEGEND = " | hit rate: share of prompt tokens found in the prefix cache at admission"
WIDE_LEGEND = (" | ITL ms | ITL: gap between a request's tokens (from each request's mean gap in the simulator)"
               " | vs: change against FCFS (LEAP) at the same load and seed, - is faster | long p95: p95 e2e of "
               "the longest-output decile | saturated: share of steps with more ready requests than decode "
               "slots | sim CPU s: CPU seconds of the simulation loop")


def seconds_text(value) -> str:
    """Three significant figures, never scientific notation: 0.0295, 7.53, 60.2, 109, 1534."""
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _ms_text(summary: dict) -> str:
    return _cell(summary, "p99_tpot_ms")


def load_text(load: float | None) -> str:
    return "as recorded" if load is None else f"{load:g}x"


def _change(value, base) -> float | None:
    return (value - base) / base if value is not None and base else None


def _cell(s: dict, name: str) -> str:
    value = s.get(name)
    if name == "load":
        return "-" if value is None else f"{value:g}x"
    if name.startswith("vs_"):
        return "-" if value is None else f"{round(value * 100):+d}%".replace("+0%", "0%")
    if name in ("spearman", "kendall_tau", "saturated_share", "prefix_hit_rate"):
        return f"{value:.3f}" if value is not None else "-"
    if name.endswith("_ms"):
        return f"{value:.0f}" if value is not None and abs(value) >= 100 else (
            f"{value:.3g}" if value is not None else "-")
    if name == "throughput_tok_s":
        return f"{value:.0f}" if value is not None else "-"
    if isinstance(value, float):
        return seconds_text(value)
    return "-" if value is None else str(value)


def header(first: dict) -> list[str]:
    """What was replayed: trace, engine, arrivals (the process or the file), capacity, requests."""
    parts = [f"trace {first['trace']}", f"engine {first['engine']}", f"arrivals {first['arrivals']}"]
    if first.get("replicas") is not None:
        parts.append(f"{first['replicas']} replicas")
    if first.get("capacity_req_s") is not None:
        parts.append(f"capacity {first['capacity_req_s']:.3f} req/s")
    return [*parts, f"{first['arrived']} requests"]


def print_table(summaries: list[dict], wide: bool = False) -> None:
    """The header, the table fitted to the terminal (``wide``: every figure, nothing dropped), the
    legend, and the trade-off of each length-aware run against FCFS in words."""
    from rich import box
    from rich.table import Table

    def key(s):   # a fleet's runs compare with FCFS behind the same router
        return (s["trace"], s["engine"], s["arrivals"], s["load"], s["seed"], s.get("router"), s.get("replicas"))

    fcfs = {key(s): s for s in summaries if s["predictor"] == NO_PREDICTOR and s["policy"] == "fcfs"}
    rows = []
    for s in summaries:
        base = fcfs.get(key(s))
        rows.append({**s, "vs_fcfs_p95_e2e_s": _change(s.get("p95_e2e_s"), base and base.get("p95_e2e_s")),
                     "vs_fcfs_mean_ptl_s": s.get("vs_fcfs_mean_ptl_s") if len(summaries) > 1 else None})
    columns = WIDE_COLUMNS + wide_columns() if wide else list(COMPACT_COLUMNS)   # + simulator.run_metrics'
    if not fcfs or len(summaries) == 1:
        columns = [c for c in columns if not c[1].startswith("vs_fcfs")]
    if not any(s["predictor"] == "leap" for s in summaries):
        columns = [c for c in columns if c[1] != "vs_leap_mean_ptl_s"]   # always "-" without a leap run
    if len({s["seed"] for s in summaries}) > 1:
        columns.insert(3, ("seed", "seed"))
    if any("router" in s for s in summaries):   # a fleet: which router (the replicas are in the header)
        columns.insert(2, ("router", "router"))
    if any("prefix_hit_rate" in s for s in summaries):   # prefix caching on: the share of prompt tokens cached
        columns.insert(len(columns) - (0 if wide else 1), ("hit rate", "prefix_hit_rate"))
    headers = dict((name, head) for head, name in columns)

    def build(kept: list[str]) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for name in kept:
            text = name in ("predictor", "policy", "router")
            table.add_column(headers[name], justify="left" if text else "right", no_wrap=text)
        for s in rows:
            table.add_row(*[_cell(s, name) for name in kept])
        return table

    width = output_width(PIPED_WIDTH)
    table, console_width, dropped = fitted_table(build, [name for _, name in columns], DROP_ORDER, width, wide)
    console = stdout_console(console_width)
    for line in header_lines(header(summaries[0]), width):
        console.print(line, style="italic", soft_wrap=True)
    console.print(table)
    hits = HIT_LEGEND if "prefix_hit_rate" in headers else ""
    for line in header_lines((LEGEND + hits + (WIDE_LEGEND + wide_legend() if wide else "")).split(" | "), width):
        console.print(line, soft_wrap=True)
    if dropped:
        console.print(f"not shown at {width} columns: {', '.join(headers[n] for n in dropped)} (--wide shows "
                      "every column)", width=width)
    others = [s for s in rows if s["predictor"] != NO_PREDICTOR and key(s) in fcfs]
    if 0 < len(others) <= 3:
        for s in others:
            base = fcfs[key(s)]
            ptl, p95 = s.get("vs_fcfs_mean_ptl_s"), s.get("vs_fcfs_p95_e2e_s")
            if ptl is None or p95 is None:
                continue
            where = f"at {s['load']:g}x" if s["load"] is not None else f"with arrivals {s['arrivals']}"
            tpot = _change(s.get("p99_tpot_ms"), base.get("p99_tpot_ms"))
            tail = f", p99 TPOT {tpot:+.0%} ({_ms_text(s)} ms)" if tpot is not None else ""
            behind = f" behind {s['router']}" if s.get("router") else ""
            console.print(f"{s['predictor']} + {s['policy']}{behind} {where} vs FCFS: mean NL {ptl:+.0%}, p95 e2e "
                          f"{p95:+.0%} ({seconds_text(s['p95_e2e_s'])} s){tail}", width=width)
