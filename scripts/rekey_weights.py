"""Re-key the shipped baseline weights to the training trace's current content hash, without retraining.

A predictor loads ``predictors/weights/METHOD.npz`` when the artifact key stored in its metadata
(a hash of method, version, training-trace content hash and settings) matches. When the definition
of the content hash changes (it once hashed the file's bytes, so editing provenance metadata broke
the match), the weights are still the ones trained on the same requests: this script checks that
each file's stored key is consistent with its recorded training hash, then rewrites only the
``train_hash`` and ``key`` fields (arrays copied unchanged) and the MANIFEST's sha256/key columns.

    python scripts/rekey_weights.py            # re-key to the bundled training trace named in each file
    python scripts/rekey_weights.py --check    # exit 1 if any shipped file would change
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.trace import load_trace  # noqa: E402
from predictors.heads import WEIGHTS_DIR, Artifact, artifact_key, load_artifact  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="report what would change, write nothing")
    args = p.parse_args(argv)
    manifest = WEIGHTS_DIR / "MANIFEST"
    lines = manifest.read_text().splitlines()
    changed = []
    new_lines = []
    train_hashes = set()
    for line in lines:
        if not line or line.startswith("#"):
            new_lines.append(line)
            continue
        cols = line.split("\t")
        method, file = cols[0], cols[1]
        path = WEIGHTS_DIR / file
        art = load_artifact(path, "shipped")
        if art is None:
            raise SystemExit(f"{path}: not a readable weight file")
        meta = art.meta
        if meta["key"] != artifact_key(method, meta["version"], meta["train_hash"], meta["settings"]):
            raise SystemExit(f"{path}: stored key does not match its own train_hash; retrain instead")
        trace = load_trace(meta["train_name"])
        train_hashes.add((trace.name, trace.content_hash))
        key = artifact_key(method, meta["version"], trace.content_hash, meta["settings"])
        if key != meta["key"]:
            changed.append(method)
            if not args.check:
                rekeyed = Artifact(method=method, arrays=art.arrays,
                                   meta={**meta, "train_hash": trace.content_hash, "key": key})
                rekeyed.save(path)
                back = load_artifact(path, "shipped")
                assert back.meta["key"] == key and back.arrays.keys() == art.arrays.keys()
                assert all(np.array_equal(back.arrays[k], art.arrays[k]) and back.arrays[k].dtype == art.arrays[k].dtype
                           for k in art.arrays)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        cols[2], cols[3] = digest, key
        new_lines.append("\t".join(cols))
    if len(train_hashes) == 1:
        name, digest = train_hashes.pop()
        new_lines = [f"# training trace: {name} content hash {digest}" if line.startswith("# training trace:") else line
                     for line in new_lines]
    if args.check:
        print(f"would re-key: {', '.join(changed) or 'nothing'}")
        return 1 if changed else 0
    manifest.write_text("\n".join(new_lines) + "\n")
    print(f"re-keyed: {', '.join(changed) or 'nothing'}; wrote {manifest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
