"""A differential probe of Oceanus's OpenAI/vLLM API against the real vLLM (its CPU build) on the
same model: the same ~100 requests (bench/vllm_diff_cases.py) go to both, and what a client
could notice is compared:

- the status code,
- JSON documents' shapes: key sets, recursively (lists by their first item), and each value's
  kind (string, number, bool, null, object, list); ids, timestamps and texts are values, so
  they never differ here,
- for greedy requests (temperature 0), the texts and the token counts (usage),
- streams: each chunk's keys, its first choice's and its delta's keys (runs of equal chunks
  folded), where the role comes and where finish_reason comes, and the streamed text,
- errors: the error document's shape (and its `param`, where both give one).

Both serve the model under the name `ref`, context 512, fp32, greedy where asked, tool calls in
Hermes' format. vLLM is started with ../shared/vllm-reference/start.sh (its README), or given
with --vllm-url; Oceanus with `python -m oceanus serve`, or --oceanus-url.

    python bench/vllm_diff.py [--size 100m] [--vllm-url http://127.0.0.1:18791]
                              [--oceanus-url URL] [--only chat_,cmpl_] [--cross-encoder]

--cross-encoder probes /score and /rerank on a cross-encoder instead (oceanus/examples/
cross_encoder.py's BertForSequenceClassification; the scores are compared within 1e-4).

Prints a table of the cases that differ and writes bench/results/vllm_diff-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
from vllm_diff_cases import Case, cases, scoring_cases

ROOT = Path(__file__).resolve().parents[1]
START_SH = ROOT.parent / "shared" / "vllm-reference" / "start.sh"
CONTEXT = 512
VLLM_FLAGS = ["--dtype", "float32", "--max-model-len", str(CONTEXT)]
VLLM_FLAGS += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


# ---- the two servers -------------------------------------------------------------------------


@contextlib.contextmanager
def vllm_server(folder: Path, port: int) -> Iterator[str]:
    started = subprocess.run(
        [str(START_SH), str(folder), str(port), "--", *VLLM_FLAGS],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if started.returncode != 0:
        raise RuntimeError(f"vLLM did not start: {started.stderr[-2000:]}")
    pid = int(started.stdout.strip().splitlines()[-1])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            subprocess.run(["kill", "--", f"-{pid}"], check=False)


@contextlib.contextmanager
def oceanus_server(folder: Path, port: int, log: Path) -> Iterator[str]:
    argv = [sys.executable, "-m", "oceanus", "serve", str(folder), "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--served-model-name", "ref", *VLLM_FLAGS]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        benchlib.wait_http_ok(f"http://127.0.0.1:{port}/health", proc, timeout=300)
        yield f"http://127.0.0.1:{port}"
    finally:
        benchlib.stop_process(proc)


# ---- sending ---------------------------------------------------------------------------------


def send(base: str, case: Case) -> dict[str, Any]:
    """One request: its status, and the reply as JSON, as a list of stream events, or text."""
    _, method, path, body = case
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, method=method)
    if data is not None:
        request.add_header("content-type", "application/json")
    request.add_header("anthropic-version", "2023-06-01")
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            status, raw, kind = reply.status, reply.read(), reply.headers.get("content-type", "")
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get("content-type", "")
    text = raw.decode("utf-8", "replace")
    if "text/event-stream" in kind:
        return {"status": status, "events": _events(text)}
    try:
        return {"status": status, "json": json.loads(text)}
    except ValueError:
        return {"status": status, "text": text[:300]}


def _events(text: str) -> list[Any]:
    """Server-sent events' data (JSON where it parses; `[DONE]` as the string)."""
    found: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            try:
                found.append(json.loads(payload))
            except ValueError:
                found.append(payload)
    return found


# ---- comparing -------------------------------------------------------------------------------


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    names: dict[type, str] = {str: "string", dict: "object", list: "list"}
    return names.get(type(value), type(value).__name__)


# vLLM's own additions to OpenAI's documents (all null unless asked for by vLLM's extra request
# fields), and OpenAI fields vLLM writes as null: not sent by Oceanus (docs/openai.md). They
# are taken out before comparing and listed once per case.
EXTRAS = frozenset(
    {
        "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics",
        "stop_reason", "token_ids", "routed_experts", "service_tier", "system_fingerprint",
        "refusal", "annotations", "audio", "function_call", "prompt_tokens_details",
        "completion_tokens_details",
    }
)  # fmt: skip


def strip_extras(value: Any, seen: set[str]) -> Any:
    """The document without vLLM's extras (and a `prompt_logprobs` or `reasoning` that is
    null: vLLM writes them always); their names go to `seen`."""
    if isinstance(value, list):
        return [strip_extras(item, seen) for item in value]
    if not isinstance(value, dict):
        return value
    kept = {}
    for key, item in value.items():
        null_extra = key in ("prompt_logprobs", "reasoning") and item is None
        if key in EXTRAS or null_extra:
            seen.add(key)
        else:
            kept[key] = strip_extras(item, seen)
    return kept


# Objects whose keys are data (token ids, token texts), not a schema.
_DATA_KEYS = ("top_logprobs", "prompt_logprobs", "properties", "permission")


def shape_diff(vllm: Any, ours: Any, path: str = "$") -> list[str]:
    """Where the two documents' shapes differ (key sets and value kinds)."""
    if kind(vllm) != kind(ours):
        return [f"{path}: vLLM {kind(vllm)}, Oceanus {kind(ours)}"]
    if isinstance(vllm, dict):
        if path.rsplit(".", 1)[-1].split("[")[0] in _DATA_KEYS:
            return []
        found = [f"{path}.{k}: only vLLM has it" for k in vllm if k not in ours]
        found += [f"{path}.{k}: only Oceanus has it" for k in ours if k not in vllm]
        for key in vllm:
            if key in ours:
                found += shape_diff(vllm[key], ours[key], f"{path}.{key}")
        return found
    if isinstance(vllm, list) and vllm and ours:
        return shape_diff(vllm[0], ours[0], f"{path}[0]")
    return []


def _texts(document: Any) -> list[Any]:
    choices = document.get("choices") if isinstance(document, dict) else None
    if isinstance(choices, list):
        return [c.get("text", (c.get("message") or {}).get("content")) for c in choices]
    if isinstance(document, dict) and document.get("type") == "message":
        return [b.get("text") for b in document.get("content", [])]
    if isinstance(document, dict) and document.get("object") == "response":
        return [p.get("text") for o in document.get("output", []) for p in o.get("content", [])]
    return []


def _signature(event: Any) -> str:
    """A stream event's keys: the chunk's, its first choice's and the delta's."""
    if not isinstance(event, dict):
        return str(event)
    parts = [",".join(sorted(event))]
    choices = event.get("choices")
    if isinstance(choices, list) and choices:
        choice = choices[0]
        parts.append(",".join(sorted(choice)))
        if isinstance(choice.get("delta"), dict):
            parts.append("delta:" + ",".join(sorted(choice["delta"])))
        if choice.get("finish_reason"):
            parts.append("finish")
    elif isinstance(event.get("type"), str):
        parts.append(str(event["type"]))
    return " | ".join(parts)


def _folded(events: list[Any]) -> list[str]:
    folded: list[str] = []
    for signature in map(_signature, events):
        if not folded or folded[-1] != signature:
            folded.append(signature)
    return folded


def _stream_text(events: list[Any]) -> str:
    text = ""
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text += choice.get("text") or delta.get("content") or ""
        if event.get("type") in ("response.output_text.delta",):
            text += event.get("delta") or ""
        if event.get("type") == "content_block_delta":
            text += (event.get("delta") or {}).get("text") or ""
    return text


def _scores(document: Any) -> list[tuple[int, float]]:
    """(index, score) of a score or rerank reply, in its order."""
    if not isinstance(document, dict):
        return []
    rows = [(d.get("index"), d.get("score")) for d in document.get("data") or []]
    rows += [(r.get("index"), r.get("relevance_score")) for r in document.get("results") or []]
    return [(int(i), float(v)) for i, v in rows if isinstance(v, (int, float))]


def _score_diff(vllm: Any, ours: Any) -> list[str]:
    """Scores (and rerank's order) equal within 1e-4."""
    theirs, mine = _scores(vllm), _scores(ours)
    if [i for i, _ in theirs] != [i for i, _ in mine]:
        return [f"order: vLLM {theirs}, Oceanus {mine}"]
    worst = max((abs(a - b) for (_, a), (_, b) in zip(theirs, mine, strict=True)), default=0.0)
    return [f"scores differ by up to {worst:.2g}"] if worst > 1e-4 else []


def compare(case: Case, vllm: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    body = case[3] if isinstance(case[3], dict) else {}
    greedy = body.get("temperature") == 0 and vllm["status"] == 200 == ours["status"]
    found: list[str] = []
    if vllm["status"] != ours["status"]:
        found.append(f"status: vLLM {vllm['status']}, Oceanus {ours['status']}")
    if "json" in vllm and "json" in ours:
        found += shape_diff(vllm["json"], ours["json"])
        if greedy and not body.get("n"):
            if _texts(vllm["json"]) != _texts(ours["json"]):
                found.append(
                    f"text: vLLM {_texts(vllm['json'])!r:.120}, "
                    f"Oceanus {_texts(ours['json'])!r:.120}"
                )
            usage_v, usage_o = vllm["json"].get("usage"), ours["json"].get("usage")
            if isinstance(usage_v, dict) and isinstance(usage_o, dict):
                for key in usage_v:
                    if isinstance(usage_v[key], int) and usage_v[key] != usage_o.get(key):
                        found.append(
                            f"usage.{key}: vLLM {usage_v[key]}, Oceanus {usage_o.get(key)}"
                        )
        found += _score_diff(vllm["json"], ours["json"])
    elif "events" in vllm and "events" in ours:
        signatures_v, signatures_o = _folded(vllm["events"]), _folded(ours["events"])
        if signatures_v != signatures_o:
            found.append(f"stream chunks: vLLM {signatures_v}, Oceanus {signatures_o}")
        if (
            greedy
            and not body.get("n")
            and _stream_text(vllm["events"]) != _stream_text(ours["events"])
        ):
            found.append("stream text differs")
    elif set(vllm) != set(ours):
        found.append(
            f"body: vLLM {sorted(set(vllm) - {'status'})}, Oceanus {sorted(set(ours) - {'status'})}"
        )
    return found


# ---- the run ---------------------------------------------------------------------------------


def run(vllm_url: str, oceanus_url: str, only: list[str], scoring: bool) -> list[dict[str, Any]]:
    rows = []
    for case in scoring_cases() if scoring else cases():
        if only and not any(case[0].startswith(prefix) for prefix in only):
            continue
        vllm, ours = send(vllm_url, case), send(oceanus_url, case)
        extras: set[str] = set()
        stripped = vllm
        if case[2] in ("/v1/chat/completions", "/v1/completions"):
            stripped = {key: strip_extras(value, extras) for key, value in vllm.items()}
        differences = compare(case, stripped, ours)
        if extras:
            differences.append("vLLM's extras, not sent: " + ",".join(sorted(extras)))
        rows.append(
            {
                "case": case[0],
                "path": case[2],
                "request": case[3] if not isinstance(case[3], bytes) else case[3].decode(),
                "vllm": vllm,
                "oceanus": ours,
                "differences": differences,
            }
        )
    return rows


def _notable(difference: str) -> bool:
    """Not one of the known differences every reply has (vLLM's extras; vLLM's numeric error
    `code` where OpenAI's is a string or null)."""
    return not difference.startswith("vLLM's extras") and not difference.startswith(
        "$.error.code: vLLM number"
    )


def report(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        row["notable"] = [d for d in row["differences"] if _notable(d)]
    differing = [row for row in rows if row["notable"]]
    print("Left out of the table: vLLM's extras (not sent by Oceanus) and vLLM's numeric error")
    print("'code' (OpenAI's is a string or null); both are in the JSON.")
    print(f"{len(rows)} cases, {len(differing)} differ (load average {benchlib.loadavg()})")
    print(f"{'case':34} {'vLLM':>5} {'ours':>5}  differences")
    for row in rows:
        first, *rest = row["notable"] or ["="]
        print(
            f"{row['case']:34} {row['vllm']['status']:>5} {row['oceanus']['status']:>5}  "
            f"{first[:150]}"
        )
        for more in rest:
            print(f"{'':47}{more[:150]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size",
        default="100m",
        help="the generator's model (tiny: head size 16, which vLLM's CPU attention refuses)",
    )
    parser.add_argument("--vllm-url", help="a vLLM already serving the model as 'ref'")
    parser.add_argument("--oceanus-url", help="an Oceanus already serving the model as 'ref'")
    parser.add_argument("--only", default="", help="comma-separated case name prefixes")
    parser.add_argument(
        "--cross-encoder",
        action="store_true",
        help="score and rerank on oceanus/examples/cross_encoder.py's model instead",
    )
    args = parser.parse_args()
    if args.cross_encoder:
        from oceanus.examples.cross_encoder import write_hf_cross_encoder

        folder = write_hf_cross_encoder(Path(tempfile.mkdtemp(prefix="vllm-diff-ce-")))
        VLLM_FLAGS[:] = ["--dtype", "float32"]
    else:
        from oceanus.examples.llm import cached_llm

        folder = cached_llm(args.size)
    only = [p for p in args.only.split(",") if p]
    with contextlib.ExitStack() as stack:
        vllm_url = args.vllm_url or stack.enter_context(vllm_server(folder, benchlib.free_port()))
        log = Path(tempfile.mkdtemp(prefix="vllm-diff-")) / "oceanus.log"
        oceanus_url = args.oceanus_url or stack.enter_context(
            oceanus_server(folder, benchlib.free_port(), log)
        )
        rows = run(vllm_url, oceanus_url, only, args.cross_encoder)
    report(rows)
    model = "cross-encoder" if args.cross_encoder else args.size
    benchlib.write_results("vllm_diff", {"model": model, "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
