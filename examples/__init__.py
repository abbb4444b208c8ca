"""The papers' experiments, scaled to 2 CPU cores: ``python -m examples.<name> [--quick] [--data-dir DIR]``.

fedcanon_fig2 (heterogeneity, h = 0), fedcanon_fig1 (α vs β), za1_fig1 (full gradients: ZA1 vs
FedMiD / FedDA), fednmap_figs34 (stationarity vs N and Q). Outcomes: examples/RESULTS.md.
"""
