"""Run a saved graph in a process that never imports onemodel.training; used by the tests.

    python run_saved.py MODEL_FILE FEEDS.npz OUT.npz
"""

import sys

import numpy as np

from onemodel.runtime import Session

model, feeds_path, out_path = sys.argv[1:4]
session = Session.load(model)
feeds = dict(np.load(feeds_path))
results = {}
for key in sorted({k.split("/")[0] for k in feeds}):
    batch = {k.split("/")[1]: v for k, v in feeds.items() if k.startswith(key + "/")}
    for name, value in session.run(batch).items():
        results[f"{key}/{name}"] = value.numpy()
assert "onemodel.training" not in sys.modules, "the runtime process imported training"
np.savez(out_path, **results)
