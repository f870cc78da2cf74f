"""The scheduler model fitted to H200 traces (tools/calibrate_model.py).

h200_fit.json holds the fitted parameters and where they came from: the
traces' commit, device and date, and each traced case's span against the
model's. `fitted_hardware()` is what `gpuvm sweep` predicts with on a machine
without a GPU. The static lists the device runs are still made with
Hardware()'s estimates: they were measured that way (README, the layer table).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..opspec import ProgramError
from .hardware import Hardware, OpTiming

FIT_PATH = Path(__file__).with_name("h200_fit.json")


def load() -> dict:
    """The stored fit: {"params": {...}, "source": {...}}."""
    try:
        return json.loads(FIT_PATH.read_text())
    except (OSError, ValueError) as e:
        raise ProgramError(f"cannot read the model's fit {FIT_PATH}: {e}") from e


def save(params: dict[str, float], source: dict) -> None:
    FIT_PATH.write_text(json.dumps({"params": params, "source": source}, indent=1) + "\n")


def fit_source() -> str:
    """Where the stored fit comes from, in a line."""
    src = load()["source"]
    worst = max(abs(r["ratio"] - 1) for r in src["cases"])
    return (f"scheduler model fitted to {len(src['cases'])} {src['device']} layer traces of {src['commit']} "
            f"({src['date']}; within {worst:.0%} of each traced layer)")


def hardware(params: dict[str, float], hbm_bytes_per_s: float) -> Hardware:
    """Hardware from a fit's parameters: "fixed.OP" and "math.OP" make OP's
    OpTiming (a matrix rate at most 1), the others are Hardware fields."""
    ops = {k.split(".", 1)[1]: OpTiming(v, min(1.0, params.get("math." + k.split(".", 1)[1], 1.0))) for k, v in params.items() if k.startswith("fixed.")}
    return Hardware(hbm_bytes_per_s=hbm_bytes_per_s, ops=ops, **{k: v for k, v in params.items() if "." not in k})


def fitted_hardware(hbm_bytes_per_s: float | None = None) -> Hardware:
    """Hardware with the stored fit; the HBM rate is the traced runs' measured
    read unless given (a sweep on a GPU measures its own)."""
    fit = load()
    return hardware(fit["params"], fit["source"]["read_bytes_per_s"] if hbm_bytes_per_s is None else hbm_bytes_per_s)
