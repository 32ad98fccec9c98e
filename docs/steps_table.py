"""The steps-curve table of docs/binding.md from a run of config/ssl_steps.yaml."""
import json, sys
from pathlib import Path
import pandas as pd
root = Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "results"
models = pd.read_csv(root / "tables" / "models.csv").set_index("model")
rows = []
for run in models.index:
    meta_path = root / "zoo" / run / "meta.json"
    if not meta_path.exists():
        continue
    meta = json.loads(meta_path.read_text())
    m, learning = models.loc[run], meta["learning"]
    rows.append({
        "run": run, "steps": meta["steps_trained"],
        "arrangement": "yes" if meta.get("arrangement_groups") or "_arr_" in run else "no",
        "seed": meta["seed"],
        "loss (trivial)": f"{learning['final_loss_mean']:.2f} ({learning['trivial_loss']:.2f})",
        "slot probe (init)": f"{learning['slot_probe_accuracy']:.2f} ({learning['slot_probe_accuracy_random_init']:.2f})",
        "binding cosine": f"{m['binding_cosine']:.3f} [{m['binding_cosine_ci_low']:.2f}, {m['binding_cosine_ci_high']:.2f}]",
        "binding kNN": f"{m['binding_knn']:.3f} [{m['binding_knn_ci_low']:.2f}, {m['binding_knn_ci_high']:.2f}]",
        "Same/Different": f"{m['same_different']:.3f} [{m['same_different_ci_low']:.2f}, {m['same_different_ci_high']:.2f}]",
        "JER final": f"{m['jer_pr_final']:.1f}",
        "wall s": f"{meta['wall_time_s']:.0f}",
    })
table = pd.DataFrame(rows).sort_values(["arrangement", "steps", "seed"], key=lambda c: c if c.name != "arrangement" else c.map({"no": 0, "yes": 1}))
print(table.to_markdown(index=False))
