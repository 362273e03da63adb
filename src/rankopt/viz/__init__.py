"""Figures of rankopt: retrieval grids, precision-recall curves, embedding maps,
training curves (per step and per evaluation), step-function surrogates, AP per level,
decomposability-gap and hyper-parameter sweep plots, FNMR-vs-FMR curves of a threshold.

All rendering is headless (Agg, no ``pyplot``); every PNG is ``figsize * 100`` pixels.
"""

from rankopt.viz.analysis import plot_decomposability_gap, plot_sweep
from rankopt.viz.analysis import plot_approximation_error, plot_operating_region
from rankopt.viz.comparison import GroupNeighbours, plot_learning_curves_by_group, plot_retrieval_rows
from rankopt.viz.curves import PRCurve, plot_pr_curves, plot_training_curves, precision_recall
from rankopt.viz.embedding_map import embed_2d, plot_embedding_map
from rankopt.viz.figures import write_figures
from rankopt.viz.retrieval_grid import Neighbours, RetrievalGrid, plot_retrieval_grid, retrieval_neighbours
from rankopt.viz.verification_curve import plot_fnmr_fmr
from rankopt.viz.training import (
    Surrogate,
    plot_ap_per_level,
    plot_learning_rates,
    plot_loss_terms,
    plot_metric_history,
    plot_surrogates,
)

__all__ = [
    "GroupNeighbours",
    "Neighbours",
    "PRCurve",
    "RetrievalGrid",
    "Surrogate",
    "embed_2d",
    "plot_approximation_error",
    "plot_ap_per_level",
    "plot_decomposability_gap",
    "plot_embedding_map",
    "plot_fnmr_fmr",
    "plot_learning_curves_by_group",
    "plot_learning_rates",
    "plot_loss_terms",
    "plot_metric_history",
    "plot_operating_region",
    "plot_pr_curves",
    "plot_retrieval_grid",
    "plot_retrieval_rows",
    "plot_surrogates",
    "plot_sweep",
    "plot_training_curves",
    "precision_recall",
    "retrieval_neighbours",
    "write_figures",
]
