"""The README's example: build a graph with a symbolic dim, compile it, run it twice."""
import numpy as np

import luminar as lm

g = lm.Graph()
x = g.tensor("x", (2, "s", 64))  # 's' is a symbolic dimension, bound when the graph runs
w = g.tensor("w", (64, 64))
y = (x @ w).softmax(-1).output("y")  # mark what to keep
model = g.compile("cpu")  # or "reference": the numpy oracle

for s in (7, 12):  # no recompiling for a new sequence length
    out = model(x=np.random.rand(2, s, 64).astype(np.float32), w=np.eye(64, dtype=np.float32))
    print(f"s={s}: y{out['y'].shape}, rows sum to {out['y'].sum(-1).mean():.6f}")
print(f"{len(g.nodes)} primitive nodes; graph as DOT: {len(g.to_dot())} characters")
