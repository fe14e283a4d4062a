"""Language models: Triton's vLLM model folders served by a CPU engine on transformers +
PyTorch (docs/llm.md). Only `backend.py` and the modules it imports need the `llm` extra;
`args.py` and `sampling.py` import neither torch nor transformers."""
