"""Serving: exported artifacts (artifact.py), continuous batching (engine.py) and an
OpenAI-compatible HTTP server (server.py, `luminar serve`)."""


def load_artifact(path, backend: str = "cpu", progress=None, **compile_options):
    """Read an artifact written by `luminar export` and compile its model (see serve/artifact.py)."""
    from .artifact import load_artifact as load
    return load(path, backend=backend, progress=progress, **compile_options)
