"""Serving under load: luminar serve vs llama.cpp's llama-server, same GGUF, same threads, same run.

    python bench/serve.py --search 120    # writes bench/SERVE.md and bench/serve.json (`make bench-serve`)
    python bench/serve.py                 # only the default-schedule luminar against llama-server
    python bench/serve.py --quick         # one round, fewer requests
    python bench/serve.py --no-build      # skip llama-server unless it is built already

Both servers run as subprocesses on loopback ports, each with the same OpenMP / llama.cpp thread
count T (OMP_NUM_THREADS, else one per CPU) and 8 sequence slots. A bounded load generator (this
process, one thread per client) sends streaming /v1/completions requests: C clients, each sending
R requests one after another (greedy, max_tokens N, continuation prompts), then stops. For every
request it records the time to the first text chunk (TTFT) and the gaps between chunks
(inter-token latency, ITL; both servers send one chunk per token). Aggregate generated tokens/s is
all chunks over the phase's wall time. Phases run interleaved (luminar 1 client, llama-server 1
client, luminar 8 clients, llama-server 8 clients, per round) so other tenants' load hits both
alike; the table gives medians over rounds. The goal (issue 19): with 8 concurrent clients,
luminar's aggregate tokens/s >= 4x its one-client figure.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

PROMPTS = ["Once upon a time, in a small village by the sea,", "The history of the Roman Empire begins",
           "Here is a recipe for a simple tomato soup:", "The three laws of motion state that",
           "In the year 2050, cities will", "A good software engineer always",
           "The old lighthouse keeper looked out at the storm and", "Photosynthesis is the process by which"]


def say(message: str) -> None:
    print(f"[serve bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Contender:
    name: str
    command: list[str]
    env: dict
    port: int
    process: subprocess.Popen | None = None
    log: Path | None = None
    started: float = 0.0

    def start(self) -> None:
        self.log = HERE / f".serve-{self.name.replace(' ', '_')}.log"
        out = open(self.log, "w")
        self.started = time.perf_counter()
        self.process = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> float:
        """Seconds from start() until /health answered 200 (polled every 0.5 s)."""
        started = self.started
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.process.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return time.perf_counter() - started
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not ready after {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


@dataclass
class RequestTiming:
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""
    prompt: str = ""
    text: str = ""


def stream_one(port: int, model: str, prompt: str, max_tokens: int) -> RequestTiming:
    timing = RequestTiming(prompt=prompt)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True})
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            timing.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return timing
        last = None
        for line in response:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            choices = event.get("choices") or [{}]
            if not choices[0].get("text"):
                continue
            timing.text += choices[0]["text"]
            now = time.perf_counter()
            if last is None:
                timing.ttft = now - started
            else:
                timing.gaps.append(now - last)
            last = now
            timing.tokens += 1
    except OSError as e:
        timing.error = str(e)
    finally:
        conn.close()
    return timing


def load_phase(contender: Contender, model: str, clients: int, requests: int, max_tokens: int) -> dict:
    """`clients` threads, each sending `requests` streaming requests in turn; the phase's figures."""
    results: list[RequestTiming] = []
    lock = threading.Lock()

    def client(k: int):
        for r in range(requests):
            t = stream_one(contender.port, model, PROMPTS[(k + r * clients) % len(PROMPTS)], max_tokens)
            with lock:
                results.append(t)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    errors = [r.error for r in results if r.error]
    ttfts = sorted(r.ttft for r in results if r.ttft is not None)
    gaps = sorted(g for r in results for g in r.gaps)
    tokens = sum(r.tokens for r in results)
    return {"clients": clients, "requests": len(results), "errors": errors[:3], "error_count": len(errors),
            "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall if wall else 0.0,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
            "texts": {r.prompt: r.text for r in results if not r.error}}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


def contenders(model_path: str, slots: int, context: int, build: bool, search: float | None) -> tuple[list, str]:
    """luminar serve (default schedules; and with --search when `search`), and llama-server when it builds."""
    import llama_cpp
    t = threads()
    env = dict(os.environ, OMP_NUM_THREADS=str(t), PYTHONPATH=str(HERE.parent / "src"))
    found = []
    for name, extra in [("luminar serve", [])] + ([(f"luminar serve --search {search:g}", ["--search", f"{search:g}"])]
                                                  if search else []):
        port = free_port()
        found.append(Contender(name, [sys.executable, "-m", "luminar", "serve", model_path, "--port", str(port),
                                      "--max-batch", str(slots), "--context", str(context), "--no-embeddings",
                                      "--model-name", "model", "--quiet", *extra], env, port))
    binary, why_not = llama_cpp.llama_server(build=build, log=say)
    if binary is not None:
        port = free_port()
        found.append(Contender("llama-server", [str(binary), "-m", model_path, "--host", "127.0.0.1", "--port",
                                                str(port), "-t", str(t), "-tb", str(t), "-np", str(slots),
                                                "-c", str(slots * context), "--no-warmup"],
                               dict(os.environ, LD_LIBRARY_PATH=str(binary.parent)), port))
    return found, why_not


def run(quick: bool, build: bool, clients: int, requests: int, single_requests: int, max_tokens: int,
        rounds: int, search: float | None = None) -> dict:
    import machine
    from luminar.io.gguf import default_model_path
    model_path = str(default_model_path())
    servers, why_not = contenders(model_path, slots=clients, context=512, build=build, search=search)
    ready = {}
    try:
        for s in servers:
            say(f"starting {s.name}: {' '.join(s.command)}")
            s.start()
        for s in servers:
            ready[s.name] = s.wait_ready(900)
            say(f"{s.name} ready after {ready[s.name]:.1f} s")
        for s in servers:  # one warm-up request each (first-call costs are not what this measures)
            stream_one(s.port, "model", PROMPTS[0], 8)
        idle = machine.wait_for_idle(20 if quick else 60)
        phases: dict[str, dict[str, list[dict]]] = {s.name: {"1": [], str(clients): []} for s in servers}
        for r in range(rounds):
            for n in (1, clients):
                for s in servers:
                    phase = load_phase(s, "model", n, single_requests if n == 1 else requests, max_tokens)
                    phases[s.name][str(n)].append(phase)
                    say(f"round {r + 1}: {s.name}, {n} client(s): {phase['tok_s']:.1f} tok/s, "
                        f"TTFT p50 {phase['ttft_p50_s']:.2f} s, ITL p50 {1e3 * (phase['itl_p50_s'] or 0):.0f} ms, "
                        f"{phase['error_count']} errors")
    finally:
        for s in servers:
            s.stop()
    return {"model": model_path, "threads": threads(), "slots": clients, "max_tokens": max_tokens,
            "requests_per_client": requests, "rounds": rounds, "ready_s": ready, "llama_server_why_not": why_not,
            "idle_before": idle, "phases": phases, "machine": machine.cpu_model(), "git": machine.git_revision(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "quick": quick}


def median_of(phases: list[dict], key: str) -> float | None:
    values = [p[key] for p in phases if p[key] is not None]
    return statistics.median(values) if values else None


def report(r: dict) -> str:
    c = r["slots"]
    lines = ["# Serving: luminar serve vs llama-server under concurrent load", "",
             f"Generated by `bench/serve.py` ({'quick' if r['quick'] else 'full'} run, {r['when']}, luminar "
             f"{r['git']}). Machine: {r['machine']}; {r['threads']} threads for both servers; model "
             f"{os.path.basename(r['model'])}; {c} sequence slots each; streaming /v1/completions, greedy, "
             f"max_tokens {r['max_tokens']}; {r['rounds']} interleaved round(s), medians. Idle before: "
             f"{r['idle_before']['idle']} (waited {r['idle_before']['waited_s']} s; other tenants share this "
             f"machine's 2 CPUs, so absolute figures are loaded ones: compare ratios).", "",
             "| server | clients | requests | tokens/s (aggregate) | vs 1 client | TTFT p50 | TTFT p99 | ITL p50 | "
             "ITL p99 | errors |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = {}
    for name, by_clients in r["phases"].items():
        one = median_of(by_clients["1"], "tok_s")
        for n, phases in by_clients.items():
            tok_s = median_of(phases, "tok_s")
            ratio = tok_s / one if one else None
            if n != "1":
                ratios[name] = ratio
            cell = lambda key, scale=1.0, unit="s": (f"{median_of(phases, key) * scale:.2f} {unit}"  # noqa: E731
                                                     if median_of(phases, key) is not None else "-")
            lines.append(f"| {name} | {n} | {sum(p['requests'] for p in phases)} | {tok_s:.1f} | "
                         f"{ratio:.2f}x | {cell('ttft_p50_s')} | {cell('ttft_p99_s')} | "
                         f"{cell('itl_p50_s', 1e3, 'ms')} | {cell('itl_p99_s', 1e3, 'ms')} | "
                         f"{sum(p['error_count'] for p in phases)} |")
    lines.append("")
    peer = median_of(r["phases"]["llama-server"][str(c)], "tok_s") if "llama-server" in r["phases"] else None
    for name, ratio in ratios.items():
        if not name.startswith("luminar"):
            continue
        ours = median_of(r["phases"][name][str(c)], "tok_s")
        versus = f"; {ours / peer:.2f}x llama-server's aggregate tokens/s at {c} clients" if peer else ""
        lines.append(f"**{name}, {c} clients vs 1: {ratio:.2f}x aggregate tokens/s** (goal >= 4x: "
                     f"{'met' if ratio >= 4 else 'missed'}){versus}.")
    if peer:
        lines.append(f"llama-server, {c} clients vs 1: {ratios['llama-server']:.2f}x.")
    else:
        lines.append(f"llama-server was not measured: {r['llama_server_why_not']}")
    for name, by_clients in r["phases"].items():  # greedy: the same prompt gives the same text at any load
        alone = {p: t for phase in by_clients["1"] for p, t in phase["texts"].items()}
        batched = [(p, t) for phase in by_clients[str(c)] for p, t in phase["texts"].items() if p in alone]
        same = sum(t == alone[p] for p, t in batched)
        lines.append(f"{name}: {same} of {len(batched)} greedy completions under {c} clients equal the same "
                     f"prompt's completion with 1 client.")
    lines += ["", "Startup to ready: " + ", ".join(f"{name} {s:.1f} s" for name, s in r["ready_s"].items())
              + " (luminar: read the GGUF, build and compile both graphs).", "",
              "Per-round figures are in bench/serve.json. Reproduce: `make bench-serve` (= `python bench/serve.py "
              "--search 120`; without --search only the default-schedule luminar runs)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round, fewer requests")
    ap.add_argument("--no-build", action="store_true", help="do not build llama-server if it is missing")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="requests per client in the concurrent phase")
    ap.add_argument("--single-requests", type=int, default=4, help="requests of the one-client phase")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--search", type=float, default=None, metavar="SECONDS",
                    help="also run `luminar serve --search SECONDS` (the search's choices are cached)")
    ap.add_argument("--report-only", action="store_true", help="rewrite SERVE.md from the last serve.json")
    args = ap.parse_args()
    if args.report_only:
        (HERE / "SERVE.md").write_text(report(json.loads((HERE / "serve.json").read_text())))
        return 0
    rounds = 1 if args.quick else 2
    result = run(args.quick, not args.no_build, args.clients, 1 if args.quick else args.requests,
                 2 if args.quick else args.single_requests, args.max_tokens, rounds, args.search)
    (HERE / "serve.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (HERE / "SERVE.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
