#!/usr/bin/env python
"""Train the baseline predictors (TIE, SSJF, LTR, TRAIL, EGTP) on a training trace.

    .venv-capture/bin/python scripts/train_baselines.py                      # all five on lmsys (cached)
    .venv-capture/bin/python scripts/train_baselines.py --trace lmsys --retrain --ship
    .venv-capture/bin/python scripts/train_baselines.py --predictors trail --set epochs=50

Weights go to the cache (``cache_dir()/baselines``); ``--ship`` also copies them to
``predictors/weights/METHOD.npz`` and rewrites ``predictors/weights/MANIFEST`` with this command,
the training trace's hash and each file's sha256. Needs torch (optional extra ``train``).
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from core.metrics import kendall_tau_b, spearman  # noqa: E402
from core.trace import TraceError, load_trace  # noqa: E402
from predictors import BASELINES, PREDICTORS  # noqa: E402
from predictors.base import Known  # noqa: E402
from predictors.heads import WEIGHTS_DIR, merged_settings, resolve_artifact  # noqa: E402


def module_of(name: str):
    return sys.modules[PREDICTORS[name].__module__]


def parse_sets(items: list[str], names: list[str]) -> dict:
    """``--set KEY=VALUE`` overrides; every key must be a setting of one of the chosen baselines
    and its value must convert to that setting's type (ValueError otherwise)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        owners = [n for n in names if key in module_of(n).DEFAULTS]
        if not owners:
            raise ValueError(f"--set {key}: not a setting of {', '.join(names)}")
        for n in owners:
            default = module_of(n).DEFAULTS[key]
            if default is not None and not isinstance(default, (list, tuple, str)):
                try:
                    type(default)(value)
                except ValueError:
                    kind = {"int": "an integer", "float": "a number"}.get(type(default).__name__, type(default).__name__)
                    raise ValueError(f"--set {item}: {key} needs {kind}") from None
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="lmsys", help="training trace (bundled name or path), default lmsys")
    p.add_argument("--predictors", default=",".join(BASELINES), help=f"comma-separated, default all {len(BASELINES)}: {', '.join(BASELINES)}")
    p.add_argument("--retrain", action="store_true", help="ignore cached and shipped weights")
    p.add_argument("--ship", action="store_true", help="copy the weights to predictors/weights/ + MANIFEST")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a training setting")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.predictors.split(",") if n.strip()]
    bad = [n for n in names if n not in BASELINES]
    if bad:
        print(f"train_baselines: unknown baseline(s) {', '.join(bad)} (choose from {', '.join(BASELINES)})",
              file=sys.stderr)
        return 2
    try:
        trace = load_trace(args.trace)
    except TraceError as exc:
        print(f"train_baselines: {exc}", file=sys.stderr)
        return 2
    try:
        extra = parse_sets(args.set, names)
    except ValueError as exc:
        print(f"train_baselines: {exc}", file=sys.stderr)
        return 2
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        print("train_baselines: torch is not installed (pip install -e '.[train]')", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        mod = module_of(name)
        settings = merged_settings(mod.DEFAULTS, extra)
        started = time.perf_counter()
        art = resolve_artifact(mod.METHOD, mod.VERSION, settings, trace, mod.train, retrain=args.retrain)
        wall = time.perf_counter() - started
        pred = PREDICTORS[name](art)
        pred.bind(trace, np.random.default_rng(0))
        est = pred.predict(np.arange(len(trace)), Known(arrived=len(trace), finished=0))   # all queued at once
        rho, tau = spearman(est, trace.output_tokens), kendall_tau_b(est, trace.output_tokens)
        print(f"{name:6s} weights={art.source:8s} train_s={art.meta.get('train_seconds')} wall_s={wall:.1f} "
              f"in-sample spearman={rho:.3f} tau={tau:.3f} key={art.meta['key']}")
        if args.ship:
            target = WEIGHTS_DIR / f"{name}.npz"
            art.save(target)
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            rows.append(f"{name}\t{target.name}\t{digest}\t{art.meta['key']}\t{art.meta.get('train_seconds')}")
    if args.ship:
        exe = Path(sys.executable)
        try:
            exe_text = str(exe.relative_to(ROOT)) if not exe.is_absolute() or ROOT in exe.parents else "python"
        except ValueError:
            exe_text = "python"
        command = f"{exe_text} scripts/train_baselines.py " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        manifest = WEIGHTS_DIR / "MANIFEST"
        old = {}
        if manifest.is_file():
            for line in manifest.read_text().splitlines():
                if line and not line.startswith("#"):
                    old[line.split("\t")[0]] = line
        for r in rows:
            old[r.split("\t")[0]] = r + f"\t{command}"
        header = ["# Shipped baseline weights (numpy .npz, float16 weight matrices). Made with torch "
                  f"{torch.__version__} on the training trace below; a predictor loads its file when the",
                  "# artifact key (hash of method, version, training-trace content hash and settings) matches.",
                  f"# training trace: {trace.name} content hash {trace.content_hash}",
                  "# method\tfile\tsha256\tartifact_key\ttrain_seconds\tcommand"]
        (WEIGHTS_DIR / "MANIFEST").write_text("\n".join(header + [old[k] for k in BASELINES if k in old]) + "\n")
        print(f"wrote {len(rows)} weight file(s) and {manifest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
