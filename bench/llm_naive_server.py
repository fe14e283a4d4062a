"""The naive language-model baseline (issue 25 (a)): FastAPI calling transformers' `generate`
once per request, no batching, no streaming; what a first attempt at serving an LLM looks like.

    python bench/llm_naive_server.py --model FOLDER --port 8000
    POST /generate {"text_input": "...", "max_tokens": 64}  ->  {"text_output": "...", "tokens": n}
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from transformers import AutoModelForCausalLM, AutoTokenizer


def build(folder: str) -> FastAPI:
    app = FastAPI()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/generate")
    def generate(body: dict[str, Any]) -> dict[str, Any]:
        ids = torch.tensor([tokenizer(body["text_input"])["input_ids"]])
        tokens = int(body.get("max_tokens", 16))
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
            )
        new = out[0, ids.shape[1] :]
        return {"text_output": tokenizer.decode(new), "tokens": len(new)}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(build(args.model), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
