"""PyTorch backend: TorchScript models (`model.pt`) loaded with torch.jit.load, one per instance,
and PyTorch 2 packages (`model.pt2`, Triton's `torch_aoti` platform): AOTInductor packages
(torch._inductor.aoti_compile_and_package) loaded with torch._inductor.aoti_load_package, and
torch.export ExportedPrograms (torch.export.save) loaded with torch.export.load and run through
their `.module()`.

Follows Triton's PyTorch (LibTorch) backend:

- Inputs are matched to forward()'s arguments by name when every config input is an argument
  name, else by the `<name>__<index>` convention (INPUT__0 is the first argument), else in config
  order (with a warning). A forward() taking one `Dict[str, Tensor]` gets the inputs by name.
- Outputs follow `<name>__<index>` (OUTPUT__1 is the second element of the returned tuple), else
  config order. forward() may return a tensor, a tuple or list of tensors, `List[str]` for a
  TYPE_STRING output, or (beyond Triton) a `Dict[str, Tensor]` read by output name.
- TorchScript files carry no tensor types or shapes: the config must declare every input and
  output (nothing is auto-completed); output datatypes are checked when the model runs.
- TYPE_STRING tensors are `List[str]` arguments and results, one-dimensional only (the batch
  dimension included), as in Triton.
- Parameters: INFERENCE_MODE (default true), DISABLE_OPTIMIZED_EXECUTION, ENABLE_JIT_EXECUTOR,
  ENABLE_JIT_PROFILING, ENABLE_TENSOR_FUSER, DISABLE_CUDNN, ENABLE_CACHE_CLEANING,
  INTRA_OP_THREAD_COUNT (alias NUM_THREADS), INTER_OP_THREAD_COUNT (alias NUM_INTEROP_THREADS).

Threads: torch.set_num_threads() with PyTorch's OpenMP builds (Linux/x86; checked on 2.13) sets
the intra-op team size of the *calling* thread (and the default for threads that start using ATen
later). Each instance calls it on its own execution thread before its first batch (after touching
ATen once, so that a later instance's call cannot resize it), so instances of one model share the
cores (cores // instances, or INTRA_OP_THREAD_COUNT) the way ONNX Runtime sessions do. Where
PyTorch uses its native thread pool instead of OpenMP the setting is process-wide and the last
instance to start wins; `torch.__config__.parallel_info()` tells which.
.pt2 packages: inputs are matched by the exported program's input names (ExportedProgram only),
else `<name>__<index>`, else config order; outputs by `<name>__<index>`, else config order; an
ExportedProgram's recorded input/output datatypes and ranks are checked against the config.
TYPE_STRING is not supported there (exported graphs take and return tensors only).

The inter-op pool (TorchScript's fork/wait) is process-wide and can only be sized before first
use: the first model that asks for INTER_OP_THREAD_COUNT sizes it, as in Triton. The JIT switches
(executor, profiling, fuser) are process-wide too; like Triton they are applied before each
execution of a model that sets them (DISABLE_CUDNN, also process-wide, when the model loads).
"""

from oceanus.backends.pytorch.backend import PyTorchBackend

__all__ = ["PyTorchBackend"]
