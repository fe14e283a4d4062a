"""``text_classifier_onnx``: a small RoBERTa-style encoder + sentence classifier.

Built only from standard ONNX ops (no contrib ops), so any onnxruntime can load it; ORT's own
graph optimiser is free to fuse the Erf-GELU and attention patterns. Weights are random
(BERT-style N(0, 0.02)) and seeded, so the probabilities are meaningless but deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._graph import GraphBuilder

NAME = "text_classifier_onnx"
SEED = 7

SEQ_LEN = 128
VOCAB = 8192
# Sized for throughput, not accuracy (~5.4M parameters, 2.1M of them embeddings): tens of ms a
# batch on a 2-core CPU (bench/README.md, "Figures behind code comments").
HIDDEN = 256
HEADS = 4
LAYERS = 4
FFN = 4 * HIDDEN
NUM_LABELS = 2
_INIT_STD = 0.02
# Added to attention scores of padding tokens; large but finite so a fully padded row still
# gives a (uniform) softmax instead of NaN.
_MASK_VALUE = -1e9

# Two 1-thread instances rather than one with two intra-op threads (as resnet50_onnx): served at
# concurrency 32 beside the client on 2 cores, one instance x 2 threads did 131/135/146
# sequences/s against 139/154/152 for 2 x 1, alternating in one server (docs/architecture.md).
CONFIG = """\
name: "text_classifier_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [
  {
    name: "input_ids"
    data_type: TYPE_INT64
    dims: [ 128 ]
  },
  {
    name: "attention_mask"
    data_type: TYPE_INT64
    dims: [ 128 ]
  }
]
output [
  {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 2 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8, 16, 32 ]
  max_queue_delay_microseconds: 2000
}
instance_group [
  {
    # No kind: a GPU when there is one, else the CPU (Triton's KIND_AUTO), so the
    # model loads on either machine, Oceanus or Triton, with nothing to warn about.
    count: 2
  }
]
"""


def _dense(b: GraphBuilder, x: str, din: int, dout: int) -> str:
    w = b.normal((din, dout), _INIT_STD, "dense_w")
    bias = b.const(np.zeros(dout, dtype=np.float32), "dense_b")
    return b.op("Add", [b.op("MatMul", [x, w]), bias])


def _layer_norm(b: GraphBuilder, x: str) -> str:
    scale = b.const(np.ones(HIDDEN, dtype=np.float32), "ln_scale")
    bias = b.const(np.zeros(HIDDEN, dtype=np.float32), "ln_bias")
    return b.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)


def _gelu(b: GraphBuilder, x: str) -> str:
    # Exact (erf) GELU: GELU only became an ONNX op in opset 20.
    erf = b.op("Erf", [b.op("Div", [x, b.const(math.sqrt(2.0))])])
    return b.op("Mul", [b.op("Mul", [x, b.op("Add", [erf, b.const(1.0)])]), b.const(0.5)])


def _self_attention(b: GraphBuilder, x: str, mask: str) -> str:
    head_dim = HIDDEN // HEADS
    split_heads = b.const([0, 0, HEADS, head_dim], "split_heads")  # 0 = keep that dim

    def heads(perm: list[int]) -> str:
        return b.op(
            "Transpose", [b.op("Reshape", [_dense(b, x, HIDDEN, HIDDEN), split_heads])], perm=perm
        )

    q = heads([0, 2, 1, 3])  # [N, heads, S, d]
    k = heads([0, 2, 3, 1])  # [N, heads, d, S]: pre-transposed for Q @ K^T
    v = heads([0, 2, 1, 3])
    scores = b.op("Mul", [b.op("MatMul", [q, k]), b.const(1.0 / math.sqrt(head_dim))])
    probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    context = b.op("Reshape", [context, b.const([0, 0, HIDDEN], "merge_heads")])
    return _dense(b, context, HIDDEN, HIDDEN)


def build() -> onnx.ModelProto:
    b = GraphBuilder(NAME, SEED)
    # Embeddings: token + learned absolute position, then LayerNorm (RoBERTa/BERT order).
    word = b.op("Gather", [b.normal((VOCAB, HIDDEN), _INIT_STD, "word_emb"), "input_ids"])
    x = _layer_norm(b, b.op("Add", [word, b.normal((SEQ_LEN, HIDDEN), _INIT_STD, "pos_emb")]))

    # attention_mask (1 = token, 0 = padding) -> additive [N, 1, 1, S] bias on the scores.
    keep = b.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask = b.op("Mul", [b.op("Sub", [b.const(1.0), keep]), b.const(_MASK_VALUE)])
    mask = b.op("Unsqueeze", [mask, b.const([1, 2], "mask_axes")])

    for _ in range(LAYERS):
        # Post-LN residual blocks, as in BERT/RoBERTa.
        x = _layer_norm(b, b.op("Add", [x, _self_attention(b, x, mask)]))
        ffn = _dense(b, _gelu(b, _dense(b, x, HIDDEN, FFN)), FFN, HIDDEN)
        x = _layer_norm(b, b.op("Add", [x, ffn]))

    # RoBERTa classification head: first (<s>) token -> dense -> tanh -> dense -> softmax.
    cls = b.op("Gather", [x, b.const(np.array(0, dtype=np.int64), "first_token")], axis=1)
    pooled = b.op("Tanh", [_dense(b, cls, HIDDEN, HIDDEN)])
    logits = _dense(b, pooled, HIDDEN, NUM_LABELS)
    b.op("Softmax", [logits], output="probabilities", axis=-1)

    batch_seq: list[str | int] = ["batch", SEQ_LEN]
    return b.model(
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, batch_seq),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, batch_seq),
        ],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", NUM_LABELS])],
    )
