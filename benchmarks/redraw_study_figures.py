"""Draw the study figures docs/benchmarks.md shows from the committed tables benchmarks/results/study_*.md,
with the plotting calls of rankopt.experiments.studies (the tables hold the means; the spread over seeds is in
the tables, not drawn). `rankopt study NAME` draws the same figures, with error bars, from its own runs;
approximation_error.png needs its run's steps.csv and comes from `rankopt study approximation_error`.

    python benchmarks/redraw_study_figures.py docs/benchmarks/studies
"""
import math, sys
from pathlib import Path
from rankopt.viz import plot_decomposability_gap, plot_operating_region, plot_sweep

RESULTS = Path("benchmarks/results")
OUT = Path(sys.argv[1])
NAN = math.nan


def table(name):
    lines = [l for l in (RESULTS / f"study_{name}.md").read_text().splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]
    return head, rows


def num(cell):
    return float(cell.split("±")[0]) if cell not in ("–", "") else NAN


note = "omniglot, validation split"
for name, symbol in (("lambda", "λ"), ("rho", "ρ")):
    head, rows = table(name)
    values = [num(r[0]) for r in rows]
    metrics = {m: [num(r[head.index(m)]) for r in rows] for m in ("map@r", "recall@1")}
    plot_sweep(symbol, values, metrics, OUT / f"{name}.png", errors={m: [NAN] * len(values) for m in metrics}, title_note=note)

head, rows = table("batch_size")
sizes = [int(r[0]) for r in rows]
col = lambda k: [num(r[head.index(k)]) for r in rows]
metric_keys = [f"{h} {m}" for m in ("map@r", "recall@1") for h in ("SupAP", "ROADMAP")]
gain_keys = [f"gain {m}" for m in ("map@r", "recall@1")]
plot_sweep("batch size B", sizes, {k: col(k) for k in metric_keys}, OUT / "batch_size_metrics.png", log_x=True,
           errors={k: [NAN] * len(sizes) for k in metric_keys}, title_note=note)
plot_sweep("batch size B", sizes, {k: col(k) for k in gain_keys}, OUT / "batch_size_gain.png", log_x=True,
           baselines={"no gain": 0.0}, errors={k: [NAN] * len(sizes) for k in gain_keys}, ylabel="ROADMAP - SupAP",
           title_note=note)

head, rows = table("decomposability_gap")
sizes = [int(h.removeprefix("DG@")) for h in head[2:]]
names = {"untrained": "untrained", "SupAP (no calibration)": "sup_ap", "ROADMAP (SupAP + calibration)": "roadmap"}
gaps = {names[r[0]]: [num(c) for c in r[2:]] for r in rows if r[0] in names}
plot_decomposability_gap(sizes, gaps, OUT / "decomposability_gap.png", errors={n: [NAN] * len(sizes) for n in gaps},
                         title_note="omniglot, test split")

head, rows = table("operating_region")
taus = head[3:]
sizes = sorted({int(r[1]) for r in rows})
fractions = {m: {t: [num(r[head.index(t)]) for r in rows if r[0] == m] for t in taus} for m in ("untrained", "trained")}
plot_operating_region(sizes, fractions, OUT / "operating_region.png", title_note="omniglot")
print(sorted(p.name for p in OUT.glob("*.png")))
