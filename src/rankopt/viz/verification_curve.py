"""The FNMR-vs-FMR curve of a verification threshold (``rankopt calibrate``): the false non-match rate
against the false match rate (log scale), the calibrated operating point marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rankopt.viz._common import new_figure, save_figure, titled

VERIFICATION_INCHES = (6.0, 4.5)


def plot_fnmr_fmr(fmr: np.ndarray, fnmr: np.ndarray, out_path: str | Path, *, target: float, chosen_fmr: float,
                  chosen_fnmr: float, threshold: float, pairs: tuple[int, int], title_note: str | None = None) -> Path:
    """Step curve of the operating points ``(fmr, fnmr)`` (FMR > 0 drawn; increasing FMR), the ``target`` FMR
    as a dashed line and the chosen point (``chosen_fmr``, ``chosen_fnmr`` at ``threshold``); ``pairs`` =
    (genuine, impostor) pair counts."""
    fmr, fnmr = np.asarray(fmr, dtype=float), np.asarray(fnmr, dtype=float)
    if fmr.shape != fnmr.shape or fmr.ndim != 1 or not (fmr > 0).any():
        raise ValueError(f"fmr and fnmr must be two (P,) arrays with a positive FMR, got shapes {fmr.shape}, "
                         f"{fnmr.shape}")
    shown = fmr > 0
    fig = new_figure(*VERIFICATION_INCHES)
    ax = fig.add_subplot()
    ax.step(fmr[shown], fnmr[shown], where="post", linewidth=1.8, label="FNMR at each FMR")
    ax.axvline(target, color="#888888", linestyle="--", linewidth=1, label=f"target FMR {target:g}")
    ax.plot([max(chosen_fmr, fmr[shown].min())], [chosen_fnmr], "o", color="#d62728",
            label=f"threshold {threshold:.4f}: FMR {chosen_fmr:.2e}, FNMR {chosen_fnmr:.3f}")
    ax.set_xscale("log")
    ax.set(ylim=(-0.02, 1.02), xlabel="false match rate (impostor pairs accepted)",
           ylabel="false non-match rate (genuine pairs rejected)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(titled(f"FNMR vs FMR ({pairs[0]} genuine, {pairs[1]} impostor pairs)", title_note), fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_path)
