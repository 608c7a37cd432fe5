"""Generic passes on the primitive graph (placeholder: identity until the passes land)."""


def optimize(graph, passes=None):
    return graph
