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


def summarize(samples: list[Sample], wall_s: float) -> dict[str, float]:
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


# ---- in process -------------------------------------------------------------------------------


def run_inproc(
    engine: Any, jobs: list[Job], concurrency: int, stagger_s: float = 0.0
) -> dict[str, float]:
    from oceanus.backends.llm.sampling import SamplingParams

    samples: list[Sample] = []
    lock = threading.Lock()
    done = threading.Event()
    pending = list(reversed(jobs))
    remaining = [len(jobs)]

    def start() -> None:
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
                    samples.append(Sample(first[0] - began, now - began, count[0]))
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()
                start()

        params = SamplingParams(max_tokens=job.tokens, temperature=0.0, ignore_eos=True)
        engine.submit(job.prompt_ids, params, sink)

    began = time.perf_counter()
    for client in range(concurrency):
        if client and stagger_s:
            time.sleep(stagger_s)  # clients join one after another (--stagger-ms)
        start()
    done.wait()
    return summarize(samples, time.perf_counter() - began)


def run_hf_cb(manager: Any, jobs: list[Job], concurrency: int) -> dict[str, float]:
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
) -> dict[str, dict[str, float]]:
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
    argv += ["--stagger-ms", str(stagger_ms)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:2]} failed: {done.stderr[-1500:]}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"openvino versions: {raw.pop('versions', None)}", flush=True)
    return {
        c: summarize([Sample(*s) for s in level["samples"]], level["wall_s"])
        for c, level in raw.items()
    }
