"""The `luminar export` and `luminar serve` commands (registered through cli.COMMAND_MODULES).

    luminar export smollm2 -o smollm2.luminar            # graphs + weights + tokenizer (+ tuning with --search)
    luminar serve smollm2.luminar --host 127.0.0.1 --port 8000
    luminar serve path/to/model.gguf --max-batch 8 --context 2048
"""
from __future__ import annotations

import os
import time

from ..cli import SEARCH_HELP, _number


def add_commands(commands) -> None:
    export = commands.add_parser("export", help="write a model as one artifact file (luminar.load_artifact)",
                                 description="Write MODEL (a GGUF file, a Hugging Face directory or a name: "
                                             "smollm2, gemma) as one versioned artifact: its graphs, weights as "
                                             "stored, tokenizer and chat template, and tuning cache entries.")
    export.add_argument("model", metavar="MODEL", nargs="?", default=None)
    export.add_argument("-o", "--output", required=True, metavar="FILE")
    export.add_argument("--search", nargs="?", const=True, default=None, metavar="SECONDS",
                        type=_number(float, 0, low_open=True, what="a number of seconds > 0"),
                        help="search the kernels' schedules first and store the choices in the artifact")
    export.add_argument("--quiet", action="store_true", help="no progress on stderr")
    export.set_defaults(handler=run_export)

    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching",
                                description="Serve ARTIFACT_OR_MODEL (an artifact from `luminar export`, a GGUF "
                                            "file, a Hugging Face directory or a name) over HTTP: "
                                            "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, "
                                            "/health, /metrics.")
    serve.add_argument("model", metavar="ARTIFACT_OR_MODEL", nargs="?", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_number(int, 0, 65535, what="a port in [0, 65535]"), default=8000)
    serve.add_argument("--model-name", default=None, help="the name clients ask for (default: the file's stem)")
    serve.add_argument("--max-batch", type=_number(int, 1, 256, what="an int in [1, 256]"), default=8, metavar="N",
                       help="sequences decoded together (KV cache slots; default 8)")
    serve.add_argument("--context", type=_number(int, 2, what="an int >= 2"), default=None, metavar="TOKENS",
                       help="tokens per sequence, prompt included (default: the model's, at most 4096)")
    serve.add_argument("--max-queue", type=_number(int, 0, what="an int >= 0"), default=64, metavar="N",
                       help="requests that may wait for a slot; more get 429 (default 64)")
    serve.add_argument("--timeout", type=_number(float, 0, low_open=True, what="seconds > 0"), default=600.0,
                       metavar="SECONDS", help="a request's limit from arrival to its last token (default 600)")
    serve.add_argument("--no-embeddings", action="store_true", help="do not offer /v1/embeddings")
    serve.add_argument("--search", nargs="?", const=True, default=None, metavar="SECONDS",
                       type=_number(float, 0, low_open=True, what="a number of seconds > 0"), help=SEARCH_HELP)
    serve.add_argument("--quiet", action="store_true", help="no progress on stderr")
    serve.set_defaults(handler=run_serve)


def run_export(args, log) -> int:
    from .artifact import export
    started = time.perf_counter()
    export(args.model, args.output, progress=log, search=args.search)
    log(f"exported in {time.perf_counter() - started:.1f} s")
    return 0


def run_serve(args, log) -> int:
    import uvicorn
    from ..models import resolve
    from .server import Limits
    started = time.perf_counter()
    path = resolve(args.model)
    server = build_server(path, model_name=args.model_name, max_batch=args.max_batch, context=args.context,
                          max_queue=args.max_queue, limits=Limits(request_timeout=args.timeout),
                          embeddings=not args.no_embeddings, search=args.search, progress=log)
    log(f"ready in {time.perf_counter() - started:.1f} s: serving {server.model_name!r} on "
        f"http://{args.host}:{args.port}/v1")
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=int(server.limits.shutdown_grace))
    return 0


def build_server(path, model_name: str | None = None, max_batch: int = 8, context: int | None = None,
                 max_queue: int = 64, limits=None, embeddings: bool = True, search=None, progress=None):
    """A Server for `path` (an artifact or anything models.load takes): the model compiled, the
    batched decode graph compiled, the engine made (it starts with the app)."""
    from .artifact import bundle_from_model, install_tuning, is_artifact, read_artifact
    say = progress or (lambda message: None)
    bundle = read_artifact(path) if is_artifact(path) else bundle_from_model(path, progress=say)
    install_tuning(bundle.tuning)
    name = model_name or os.path.splitext(os.path.basename(os.fspath(path).rstrip("/")))[0]
    model, batched = compile_for_serving(bundle, search, say)
    return server_for(model, batched, name, max_batch, context, max_queue, limits, embeddings, search)


def compile_for_serving(bundle, search=None, progress=None):
    """(LlamaModel, compiled batched decode program) of a ModelBundle."""
    from .artifact import search_dims
    say = progress or (lambda message: None)
    if "batched" not in bundle.graphs:
        from ..errors import UnsupportedError
        raise UnsupportedError(f"{bundle.config.architecture} has sliding-window layers; continuous "
                               f"batching (luminar serve) supports full-attention models only")
    options = {} if search is None else {"search": search}
    model = bundle.model("cpu", progress=say, **options)
    started = time.perf_counter()
    batched = bundle.graphs["batched"].compile("cpu", search_dims=search_dims(bundle.graphs["batched"]), **options)
    batched.set_inputs(bundle.fixed_inputs("batched"))
    say(f"compiled the batched decode graph in {time.perf_counter() - started:.1f} s")
    return model, batched


def server_for(model, batched, name: str, max_batch: int = 8, context: int | None = None, max_queue: int = 64,
               limits=None, embeddings: bool = True, search=None):
    """A Server (its engine starts with the app) around a compiled model and batched program."""
    from .engine import BatchingEngine
    from .server import Server
    options = {} if search is None else {"search": search}
    engine = BatchingEngine(model, batched, max_batch=max_batch,
                            context=context or min(model.config.max_position_embeddings, 4096), max_queue=max_queue)

    def load_minilm():
        from ..models.bert import load_embedder
        return load_embedder(**options)
    return Server(engine, model.tokenizer, name, limits=limits, embedder_loader=load_minilm if embeddings else None)
