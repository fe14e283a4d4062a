"""The pattern Oceanus replaces: a FastAPI ``/predict`` endpoint around one ONNX Runtime session.

JSON in, JSON out, one request at a time, no batching:

    POST /predict  {"inputs": [[...], ...]}                 one-input models (a list of samples)
                   {"inputs": {"name": [[...]], ...}}       several inputs, by name
    -> {"outputs": {"name": [[...]], ...}}

``--mode executor`` (default) runs ``session.run`` in a single-thread executor from an async
endpoint; ``--mode lock`` runs it from a sync endpoint (FastAPI's thread pool) under a
``threading.Lock``. ONNX Runtime uses its default session options, as such servers usually do.

    python bench/naive_server.py --model path/to/model.onnx --port 40100
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnxruntime as ort
import uvicorn
from benchlib import NP_DTYPES  # this script runs from bench/, which is on sys.path
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel


class PredictRequest(BaseModel):
    inputs: list[Any] | dict[str, list[Any]]


def create_app(model_path: str, mode: str = "executor") -> FastAPI:
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    input_types = {i.name: NP_DTYPES[i.type] for i in session.get_inputs()}
    output_names = [o.name for o in session.get_outputs()]
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxruntime")
    lock = threading.Lock()
    app = FastAPI(title="naive ONNX server")

    def to_feed(request: PredictRequest) -> dict[str, np.ndarray]:
        if isinstance(request.inputs, dict):
            raw = request.inputs
        elif len(input_types) == 1:
            raw = {next(iter(input_types)): request.inputs}
        else:
            raise HTTPException(400, f"model has inputs {sorted(input_types)}: send a dict")
        if set(raw) != set(input_types):
            raise HTTPException(400, f"expected inputs {sorted(input_types)}, got {sorted(raw)}")
        try:
            return {name: np.asarray(value, dtype=input_types[name]) for name, value in raw.items()}
        except (TypeError, ValueError) as err:
            raise HTTPException(400, str(err)) from None

    def predict_sync(feed: dict[str, np.ndarray]) -> dict[str, Any]:
        results = session.run(output_names, feed)
        return {
            "outputs": {
                name: value.tolist() for name, value in zip(output_names, results, strict=True)
            }
        }

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    if mode == "executor":

        @app.post("/predict")
        async def predict(request: PredictRequest) -> dict[str, Any]:
            feed = to_feed(request)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, predict_sync, feed)

    elif mode == "lock":

        @app.post("/predict")
        def predict_locked(request: PredictRequest) -> dict[str, Any]:
            feed = to_feed(request)
            with lock:
                return predict_sync(feed)

    else:
        raise ValueError(f"unknown mode {mode!r}")
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an ONNX file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=40100)
    parser.add_argument("--mode", choices=("executor", "lock"), default="executor")
    args = parser.parse_args()
    app = create_app(args.model, args.mode)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
