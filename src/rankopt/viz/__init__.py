"""Figures of rankopt: retrieval grids, precision-recall curves, embedding maps,
training curves, decomposability-gap and hyper-parameter sweep plots.

All rendering is headless (Agg, no ``pyplot``); every PNG is ``figsize * 100`` pixels.
"""

from rankopt.viz.analysis import plot_decomposability_gap, plot_sweep
from rankopt.viz.curves import PRCurve, plot_pr_curves, plot_training_curves, precision_recall
from rankopt.viz.embedding_map import embed_2d, plot_embedding_map
from rankopt.viz.figures import write_figures
from rankopt.viz.retrieval_grid import Neighbours, RetrievalGrid, plot_retrieval_grid, retrieval_neighbours

__all__ = [
    "Neighbours",
    "PRCurve",
    "RetrievalGrid",
    "embed_2d",
    "plot_decomposability_gap",
    "plot_embedding_map",
    "plot_pr_curves",
    "plot_retrieval_grid",
    "plot_sweep",
    "plot_training_curves",
    "precision_recall",
    "retrieval_neighbours",
    "write_figures",
]
