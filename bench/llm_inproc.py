"""bench/llm.py's jobs, samples and summaries, and its in-process targets: our engine with no
server (`inproc`), transformers' own continuous batching (`hf_cb`) and OpenVINO GenAI's pipeline
in another interpreter (`openvino`)."""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchlib  # bench/ is on the path: llm.py, the entry point, puts it there

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Job:
    prompt_ids: list[int]
    prompt: str
    tokens: int


@dataclass
class Sample:
    ttft_s: float
    e2e_s: float
    tokens: int
    warm: bool = False  # a client's first request (--warmup): reported apart as the burst
    start_s: float = 0.0  # when it was sent, from the start of the run

    @property
    def tpot_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / max(self.tokens - 1, 1)


def make_jobs(
    tokenizer: Any, count: int, prompt: tuple[int, int], output: tuple[int, int]
) -> list[Job]:
    rng = random.Random(25)
    vocab = len(tokenizer)
    jobs = []
    for _ in range(count):
        ids = [rng.randrange(8, vocab) for _ in range(rng.randint(*prompt))]
        text = tokenizer.decode(ids)
        jobs.append(Job(tokenizer(text)["input_ids"], text, rng.randint(*output)))
    return jobs


def summarize(samples: list[Sample], wall_s: float) -> dict[str, Any]:
    """Figures over every request; when some were warm-ups (each client's first), also
    `burst` (those alone: with --stagger-ms 0 they all arrive at once) and `steady` (the rest:
    a closed loop in steady state, each client sending its next request when one ends, as
    genai-perf and perf_analyzer measure a concurrency; its tokens/s is over the span from the
    first steady request sent to the last one ended)."""
    out: dict[str, Any] = _figures(samples, wall_s)
    warm = [s for s in samples if s.warm]
    steady = [s for s in samples if not s.warm]
    if warm and steady:
        out["burst"] = _figures(warm, max(s.start_s + s.e2e_s for s in warm))
        began = min(s.start_s for s in steady)
        out["steady"] = _figures(steady, max(s.start_s + s.e2e_s for s in steady) - began)
    return out


def _figures(samples: list[Sample], wall_s: float) -> dict[str, float]:
    tokens = sum(s.tokens for s in samples)
    ttft = [s.ttft_s * 1000 for s in samples]
    tpot = [s.tpot_s * 1000 for s in samples]
    return {
        "requests": len(samples),
        "output_tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s else 0.0,
        "ttft_p50_ms": benchlib.percentile(ttft, 50),
        "ttft_p99_ms": benchlib.percentile(ttft, 99),
        "tpot_p50_ms": benchlib.percentile(tpot, 50),
        "tpot_p99_ms": benchlib.percentile(tpot, 99),
    }


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the repeats (the burst and steady figures likewise)."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = median_result([r[key] for r in runs if key in r])
        else:
            out[key] = benchlib.median([r[key] for r in runs])
    return out


# ---- in process -------------------------------------------------------------------------------


def run_inproc(
    engine: Any, jobs: list[Job], concurrency: int, stagger_s: float = 0.0, warmup: bool = False
) -> dict[str, Any]:
    from oceanus.backends.llm.sampling import SamplingParams

    samples: list[Sample] = []
    lock = threading.Lock()
    done = threading.Event()
    pending = list(reversed(jobs))
    remaining = [len(jobs)]

    def start(warm: bool) -> None:
        with lock:
            if not pending:
                return
            job = pending.pop()
        began = time.perf_counter()
        first = [0.0]
        count = [0]

        def sink(out: Any) -> None:
            count[0] += len(out.token_ids)
            if out.token_ids and not first[0]:
                first[0] = time.perf_counter()
            if out.finished:
                now = time.perf_counter()
                with lock:
                    sample = Sample(first[0] - began, now - began, count[0])
                    sample.warm, sample.start_s = warm, began - run_began
                    samples.append(sample)
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()
                start(False)  # closed loop: the client's next request

        params = SamplingParams(max_tokens=job.tokens, temperature=0.0, ignore_eos=True)
        engine.submit(job.prompt_ids, params, sink)

    run_began = time.perf_counter()
    for client in range(concurrency):
        if client and stagger_s:
            time.sleep(stagger_s)  # clients join one after another (--stagger-ms)
        start(warmup)
    done.wait()
    return summarize(samples, time.perf_counter() - run_began)


def run_hf_cb(manager: Any, jobs: list[Job], concurrency: int) -> dict[str, Any]:
    """transformers' continuous-batching manager (kept running across points), `concurrency`
    client threads each streaming one request at a time through `request_id_iter`."""
    samples: list[Sample] = []
    lock = threading.Lock()
    pending = list(reversed(jobs))

    def client() -> None:
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop()
            began = time.perf_counter()
            first = 0.0
            rid = manager.add_request(
                job.prompt_ids, max_new_tokens=job.tokens, streaming=True, eos_token_id=-1
            )
            count = 0
            for out in manager.request_id_iter(rid):
                count = len(out.generated_tokens)
                if count and not first:
                    first = time.perf_counter()
            now = time.perf_counter()
            with lock:
                samples.append(Sample((first or now) - began, now - began, count))

    began = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return summarize(samples, time.perf_counter() - began)


def run_openvino(
    python: str,
    folder: Path,
    ir_dir: Path,
    jobs: dict[int, list[Job]],
    limits: list[int],
    stagger_ms: float,
    warmup: bool = False,
) -> dict[str, dict[str, Any]]:
    """bench/llm_openvino.py in `python` (its own venv); its samples summarized as ours."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump(
            {
                str(c): [{"prompt_ids": j.prompt_ids, "tokens": j.tokens} for j in level]
                for c, level in jobs.items()
            },
            spec,
        )
    argv = [python, str(ROOT / "bench" / "llm_openvino.py"), "--model", str(folder)]
    argv += ["--ir-dir", str(ir_dir), "--jobs", spec.name, "--max-num-seqs", str(limits[0])]
    argv += ["--max-num-batched-tokens", str(limits[1])]
    argv += ["--stagger-ms", str(stagger_ms)] + (["--warmup"] if warmup else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:2]} failed: {done.stderr[-1500:]}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"openvino versions: {raw.pop('versions', None)}", flush=True)
    return {
        c: summarize([Sample(s[0], s[1], s[2], bool(s[3]), s[4]) for s in level["samples"]], wall)
        for c, level in raw.items()
        for wall in [level["wall_s"]]
    }
